"""A small evaluator for the part of Helm's Go templates the KubeRay chart's RBAC and args use.

No helm binary is on the project's machines, so tests/test_kuberay_namespaced.py runs the chart's
own template files (tests/fixtures/kuberay-operator-1.7.0-templates/, verbatim) through this:

- actions `if` / `else if` / `else` / `with` / `range $v := ...` / `end`, `define` blocks
  (skipped), comments, variable declarations and assignments (`$x := ...`, `$x = ...`);
- expressions: `.Values.a.b`, `.Release.Namespace`, `.Chart.Name`, `$`, `.`, `$var`, string and
  number literals, parenthesised calls and pipelines (`a | f b` is `f b a`);
- functions: and, or, not, eq, default, list, append, join, printf (%s %t %v %q), hasKey, quote,
  trim, fail (raises), and `include`/`template`/`toYaml`/`indent`/`nindent`/others, which render
  the empty string: names, labels and rule lists are not what these tests read.

Variables live in one scope (the chart's templates declare each name once). Truth is Go's:
false, 0, "", nil and empty lists and maps are false. What the evaluator does not know fails
loudly (`Unsupported`), so a chart change that needs more shows up as an error, not a wrong answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
TOKEN = re.compile(r'\s*(?:(\()|(\))|(\|)|("(?:[^"\\]|\\.)*")|(:=|=)|([^\s()|]+))')
EMPTY_FUNCTIONS = {
    "include", "template", "toYaml", "indent", "nindent", "trunc", "trimSuffix", "replace",
    "contains", "regexMatch", "toString", "print", "tpl", "b64enc", "upper", "lower",
}  # fmt: skip


class Unsupported(Exception):
    """The template uses something this evaluator does not implement."""


class Failed(Exception):
    """The template called `fail`."""


def truthy(v: Any) -> bool:
    """Go template truth: false, 0, nil and empty strings, lists and maps are false."""
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def _go_format(fmt: str, args: list) -> str:
    out, i = [], 0
    for part in re.split(r"(%[stvq%])", fmt):
        if part in ("%s", "%v"):
            out.append(str(args[i]) if not isinstance(args[i], bool) else str(args[i]).lower())
            i += 1
        elif part == "%t":
            out.append("true" if args[i] else "false")
            i += 1
        elif part == "%q":
            out.append(f'"{args[i]}"')
            i += 1
        elif part == "%%":
            out.append("%")
        else:
            out.append(part)
    return "".join(out)


FUNCTIONS = {
    "not": lambda a: not truthy(a),
    "eq": lambda a, b: a == b,
    "default": lambda d, v=None: v if truthy(v) else d,
    "list": lambda *a: list(a),
    "append": lambda lst, x: [*(lst or []), x],
    "join": lambda sep, lst: sep.join(str(x) for x in (lst or [])),
    "printf": lambda fmt, *a: _go_format(fmt, list(a)),
    "hasKey": lambda m, k: isinstance(m, dict) and k in m,
    "quote": lambda v: f'"{v}"',
    "trim": lambda s: str(s).strip(),
    "dict": lambda *a: dict(zip(a[::2], a[1::2])),
}


@dataclass
class Context:
    values: dict
    release_namespace: str
    release_name: str = "kuberay-operator"
    chart_name: str = "kuberay-operator"
    variables: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> dict:
        return {"Values": self.values, "Release": {"Namespace": self.release_namespace, "Name": self.release_name, "Service": "Helm"},
                "Chart": {"Name": self.chart_name}}  # fmt: skip


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise Unsupported(f"cannot read {text[pos:]!r}")
        pos = m.end()
        kind = ("(", ")", "|", "str", "assign", "word")[m.lastindex - 1]
        out.append((kind, m.group(m.lastindex)))
    return out


def _field(obj: Any, path: str) -> Any:
    for key in [k for k in path.split(".") if k]:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


class _Expr:
    def __init__(self, tokens: list[tuple[str, str]], ctx: Context, dot: Any) -> None:
        self.t, self.i, self.ctx, self.dot = tokens, 0, ctx, dot

    def pipeline(self) -> Any:
        value = self.command()
        while self.i < len(self.t) and self.t[self.i][0] == "|":
            self.i += 1
            name, args = self._call_parts()
            value = self._apply(name, [*args, value])
        return value

    def command(self) -> Any:
        kind, text = self.t[self.i]
        if kind == "word" and not text.startswith((".", "$")) and not re.match(r"^-?\d", text) and text not in ("true", "false", "nil"):
            name, args = self._call_parts()
            return self._apply(name, args)
        return self.operand()

    def _call_parts(self) -> tuple[str, list]:
        _, name = self.t[self.i]
        self.i += 1
        args = []
        while self.i < len(self.t) and self.t[self.i][0] not in ("|", ")"):
            args.append(self.operand())
        return name, args

    def operand(self) -> Any:
        kind, text = self.t[self.i]
        self.i += 1
        if kind == "(":
            value = self.pipeline()
            if self.t[self.i][0] != ")":
                raise Unsupported("unbalanced parentheses")
            self.i += 1
            return value
        if kind == "str":
            return bytes(text[1:-1], "utf-8").decode("unicode_escape")
        if text in ("true", "false"):
            return text == "true"
        if text == "nil":
            return None
        if re.match(r"^-?\d+(\.\d+)?$", text):
            return float(text) if "." in text else int(text)
        if text == ".":
            return self.dot
        if text.startswith("."):
            return _field(self.ctx.root if text.split(".")[1] in ("Values", "Release", "Chart") else self.dot, text)
        if text.startswith("$"):
            name, _, rest = text.partition(".")
            base = self.ctx.root if name == "$" else self.ctx.variables[name]
            return _field(base, rest) if rest else base
        if text in FUNCTIONS or text in EMPTY_FUNCTIONS or text in ("and", "or", "fail"):
            return self._apply(text, [])
        raise Unsupported(f"operand {text!r}")

    def _apply(self, name: str, args: list) -> Any:
        if name == "and":
            for a in args:
                if not truthy(a):
                    return a
            return args[-1]
        if name == "or":
            for a in args:
                if truthy(a):
                    return a
            return args[-1]
        if name == "fail":
            raise Failed(args[0] if args else "")
        if name in FUNCTIONS:
            return FUNCTIONS[name](*args)
        if name in EMPTY_FUNCTIONS:
            return ""
        raise Unsupported(f"function {name!r}")


def evaluate(expr: str, ctx: Context, dot: Any = None) -> Any:
    """The value of one template expression (a pipeline)."""
    tokens = _tokens(expr)
    e = _Expr(tokens, ctx, ctx.root if dot is None else dot)
    value = e.pipeline()
    if e.i != len(tokens):
        raise Unsupported(f"trailing tokens in {expr!r}")
    return value


def _parse(text: str) -> list:
    """Nodes: ('text', s) and ('action', body); trim markers applied to the neighbouring text."""
    nodes: list = []
    pos = 0
    for m in ACTION.finditer(text):
        chunk = text[pos : m.start()]
        if m.group(1):
            chunk = chunk.rstrip()
        nodes.append(["text", chunk])
        nodes.append(["action", m.group(2), bool(m.group(3))])
        pos = m.end()
    nodes.append(["text", text[pos:]])
    for i, n in enumerate(nodes):
        if n[0] == "action" and n[2] and i + 1 < len(nodes):
            nodes[i + 1][1] = nodes[i + 1][1].lstrip()
    return [tuple(n[:2]) for n in nodes]


def _block(nodes: list, i: int) -> tuple[list, int]:
    """Nested structure from a flat node list: (items, index after the block's `end`/`else`)."""
    items: list = []
    while i < len(nodes):
        kind, body = nodes[i]
        if kind == "text":
            items.append(("text", body))
            i += 1
            continue
        head = body.split(None, 1)[0] if body else ""
        if head in ("end",) or body.startswith("else"):
            return items, i
        if body.startswith("/*"):
            i += 1
            continue
        if head in ("if", "with", "range", "define"):
            branches = []
            cond = body[len(head):].strip()
            inner, i = _block(nodes, i + 1)
            branches.append((cond, inner))
            while nodes[i][1].startswith("else"):
                rest = nodes[i][1][4:].strip()
                cond = rest[2:].strip() if rest.startswith("if") else None
                inner, i = _block(nodes, i + 1)
                branches.append((cond, inner))
            items.append((head, branches))
            i += 1  # the `end`
            continue
        items.append(("expr", body))
        i += 1
    return items, i


def _run(items: list, ctx: Context, dot: Any, out: list[str]) -> None:
    for kind, body in items:
        if kind == "text":
            out.append(body)
        elif kind == "define":
            continue
        elif kind == "expr":
            m = re.match(r"^(\$\w+)\s*(:=|=)\s*(.*)$", body, re.S)
            if m:
                ctx.variables[m.group(1)] = evaluate(m.group(3), ctx, dot)
            else:
                v = evaluate(body, ctx, dot)
                out.append("" if v is None else (str(v).lower() if isinstance(v, bool) else str(v)))
        elif kind in ("if", "with"):
            for cond, inner in body:
                value = True if cond is None else evaluate(cond, ctx, dot)
                if truthy(value):
                    _run(inner, ctx, value if kind == "with" and cond is not None else dot, out)
                    break
        elif kind == "range":
            (cond, inner), *rest = body
            m = re.match(r"^(\$\w+)\s*:=\s*(.*)$", cond, re.S)
            if not m or rest:
                raise Unsupported(f"range {cond!r}")
            for item in evaluate(m.group(2), ctx, dot) or []:
                ctx.variables[m.group(1)] = item
                _run(inner, ctx, item, out)


def render(text: str, ctx: Context) -> str:
    """The template's output (defines skipped, unsupported-but-harmless functions as empty strings)."""
    items, end = _block(_parse(text), 0)
    out: list[str] = []
    _run(items, ctx, ctx.root, out)
    return "".join(out)
