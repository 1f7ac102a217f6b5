"""The reference of `vllm serve` flags of one vLLM release, read from its wheel's source.

    python -m infra.catalog.vllm.extract WHEEL_OR_DIR [--out FILE]
    bin/vllm-flag-reference VERSION          # pip download --no-deps vllm==VERSION, then this

Reads the Python source of a vLLM wheel (the `.whl` file, or an unzipped tree
holding `vllm/`) with `ast` and never imports it: the release needs CUDA, torch
and a GPU to import, and what matters is what its parser accepts. Standard
library only.

Where `vllm serve`'s flags come from in the 0.3x line
------------------------------------------------------
`entrypoints/cli/serve.py` builds the parser with
`entrypoints/common/cli_args.py::make_arg_parser`, which adds a few flags with
`add_argument`, then `FrontendArgs.add_cli_args` (every dataclass field of
`FrontendArgs` and its base `BaseFrontendArgs` becomes `--<field-with-dashes>`,
with the overrides of `_customize_cli_kwargs`) and
`AsyncEngineArgs.add_cli_args` -> `engine/arg_utils.py::EngineArgs.add_cli_args`,
an explicit list of `add_argument("--flag", **X_kwargs["field"])` calls whose
keyword arguments come from `get_kwargs(ConfigClass)` (`_compute_kwargs`).
This module follows the same three sources and applies `_compute_kwargs`'s
rules, in its order, to each field's annotation:

- a dataclass (a `@config`/`@dataclass` class) -> a JSON value (also `--x.key`);
- exactly `bool | str | None` -> an optional value (a bare flag means true);
- contains `bool` -> a boolean pair: `--x`/`--no-x`, and `--enable-x`/`--disable-x`
  (`utils/argparse_utils.py::FlexibleArgumentParser` registers
  `EnableDisableAction` for `BooleanOptionalAction`);
- contains a `Literal` -> argparse `choices`, unless `str` is in the union: then
  only a `metavar`, and the release validates the value later (pydantic, a
  registry lookup); the reference keeps those values as `values`;
- tuple/list/set -> `nargs`; int, float, dict, str as their type; `max_model_len`
  and the human-readable integer fields take `8k`, `1M`, ...;
- `None` in the union (not for booleans) -> `""` and `"None"` also accepted.

Values that only a registry decides (the reasoning and tool-call parsers, the
tokenizer modes) come from those registries' dict literals. The release's
plugins (`load_general_plugins`, `--tool-parser-plugin`, platform hooks) can
add flags and names at run time: this reference holds the built-in ones.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterable, Optional

SCHEMA = 1
BUILTINS = {"str", "int", "float", "bool", "dict", "list", "tuple", "set", "None", "Any", "object"}
# `_compute_kwargs`: fields whose int parser takes human-readable integers.
HUMAN_INT_FIELDS = {
    "max_num_batched_tokens",
    "max_num_scheduled_tokens",
    "kv_cache_memory_bytes",
    "safetensors_prefetch_block_size",
    "max_num_queued_tokens",
}


class ExtractError(Exception):
    """The source does not look like the release this reads (a layout it does not know)."""


# ---- the source tree -------------------------------------------------------------------------------------


class Tree:
    """The `vllm/` package's Python files, from a wheel or a directory."""

    def __init__(self, files: dict[str, str], sha256: Optional[str], origin: str) -> None:
        self.files = files  # path below vllm/ -> text
        self.sha256 = sha256
        self.origin = origin
        self._parsed: dict[str, ast.Module] = {}

    @classmethod
    def open(cls, path: Path) -> "Tree":
        if path.is_file():
            data = path.read_bytes()
            with zipfile.ZipFile(path) as wheel:
                files = {
                    name[len("vllm/"):]: wheel.read(name).decode("utf-8")
                    for name in wheel.namelist()
                    if name.startswith("vllm/") and name.endswith(".py")
                }
            return cls(files, hashlib.sha256(data).hexdigest(), path.name)
        root = path / "vllm" if (path / "vllm" / "engine" / "arg_utils.py").is_file() else path
        if not (root / "engine" / "arg_utils.py").is_file():
            raise ExtractError(f"{path}: neither a wheel nor a tree holding vllm/engine/arg_utils.py")
        files = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in root.rglob("*.py")}
        return cls(files, None, str(path))

    def module(self, rel: str) -> ast.Module:
        if rel not in self._parsed:
            if rel not in self.files:
                raise ExtractError(f"{self.origin}: no vllm/{rel}")
            self._parsed[rel] = ast.parse(self.files[rel], filename=rel)
        return self._parsed[rel]

    def module_file(self, dotted: str) -> Optional[str]:
        """`vllm.config.cache` -> `config/cache.py` (or a package's `__init__.py`)."""
        parts = dotted.split(".")
        if parts[0] != "vllm":
            return None
        base = "/".join(parts[1:])
        for cand in (f"{base}.py", f"{base}/__init__.py" if base else "__init__.py"):
            if cand in self.files:
                return cand
        return None

    def package_of(self, rel: str) -> str:
        parts = rel.split("/")[:-1]
        return ".".join(["vllm", *parts])


# ---- names and types --------------------------------------------------------------------------------


def _definition(tree: Tree, rel: str, name: str, depth: int = 0) -> Optional[tuple[str, ast.AST]]:
    """Where `name` is defined, seen from module `rel`: (module, ClassDef | value expression)."""
    if depth > 8:
        return None
    mod = tree.module(rel)
    for node in mod.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return rel, node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return rel, node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name and node.value:
            return rel, node.value
    for node in mod.body:
        if isinstance(node, ast.ImportFrom) and node.module is not None or isinstance(node, ast.ImportFrom) and node.level:
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                if node.level:
                    pkg = tree.package_of(rel).split(".")
                    pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                    dotted = ".".join(pkg + ([node.module] if node.module else []))
                else:
                    dotted = node.module
                target = tree.module_file(dotted)
                if target is not None:
                    found = _definition(tree, target, alias.name, depth + 1)
                    if found is not None:
                        return found
    return None


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(target).split(".")[-1] in ("config", "dataclass"):
            return True
    return False


def _atoms(tree: Tree, rel: str, expr: ast.AST, depth: int = 0) -> list[tuple]:
    """An annotation flattened like `get_type_hints`: ('builtin', n) | ('literal', [...]) |
    ('dataclass', n) | ('class', n) | ('generic', head, inner atoms)."""
    if depth > 16:
        return [("class", "?")]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _atoms(tree, rel, expr.left, depth + 1) + _atoms(tree, rel, expr.right, depth + 1)
    if isinstance(expr, ast.Constant):
        if expr.value is None:
            return [("builtin", "None")]
        if isinstance(expr.value, str):
            return _atoms(tree, rel, ast.parse(expr.value, mode="eval").body, depth + 1)
        return [("class", repr(expr.value))]
    if isinstance(expr, ast.Subscript):
        head = ast.unparse(expr.value).split(".")[-1]
        elts = list(expr.slice.elts) if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if head == "Literal":
            values: list = []
            for e in elts:
                if isinstance(e, ast.Constant):
                    values.append(e.value)
                else:
                    for atom in _atoms(tree, rel, e, depth + 1):
                        if atom[0] == "literal":
                            values.extend(atom[1])
            return [("literal", values)]
        if head == "Optional":
            return _atoms(tree, rel, elts[0], depth + 1) + [("builtin", "None")]
        if head == "Union":
            return [a for e in elts for a in _atoms(tree, rel, e, depth + 1)]
        if head in ("Annotated", "InitVar", "Final", "ClassVar"):
            return _atoms(tree, rel, elts[0], depth + 1)
        inner = [a for e in elts for a in (_atoms(tree, rel, e, depth + 1) if not isinstance(e, ast.Constant) or e.value is not Ellipsis else [("ellipsis",)])]
        return [("generic", head.lower() if head in ("List", "Tuple", "Set", "Dict") else head, inner)]
    if isinstance(expr, (ast.Name, ast.Attribute)):
        name = ast.unparse(expr).split(".")[-1]
        if name in BUILTINS:
            return [("builtin", name)]
        found = _definition(tree, rel, name)
        if found is None:
            return [("class", name)]
        where, node = found
        if isinstance(node, ast.ClassDef):
            return [("dataclass" if _is_dataclass(node) else "class", name)]
        return _atoms(tree, where, node, depth + 1)
    return [("class", ast.unparse(expr))]


def _has(atoms: list[tuple], kind: str, name: Optional[str] = None) -> bool:
    return any(a[0] == kind and (name is None or a[1] == name) for a in atoms)


def _generic(atoms: list[tuple], head: str) -> Optional[tuple]:
    return next((a for a in atoms if a[0] == "generic" and a[1] == head), None)


def _literal_values(atoms: list[tuple]) -> list:
    return [v for a in atoms if a[0] == "literal" for v in a[1]]


def _sorted(values: Iterable) -> list:
    return sorted(values, key=lambda v: (str(type(v)), str(v)))


def field_kwargs(tree: Tree, rel: str, name: str, annotation: ast.AST) -> dict[str, Any]:
    """What `_compute_kwargs` makes of one field (engine/arg_utils.py), as the reference records it."""
    atoms = _atoms(tree, rel, annotation)
    kinds = {(a[0], a[1]) for a in atoms if a[0] in ("builtin", "literal", "dataclass", "class") and a[0] != "literal"}
    out: dict[str, Any] = {"type": "str", "nargs": None, "choices": None, "values": None, "optional": False}
    if _has(atoms, "dataclass"):
        out["type"] = "json"
    elif kinds == {("builtin", "bool"), ("builtin", "str"), ("builtin", "None")} and not _has(atoms, "literal") and not _has(atoms, "generic"):
        out.update(type="str", nargs="?")
    elif _has(atoms, "builtin", "bool"):
        out["type"] = "bool"
    elif _has(atoms, "literal"):
        values = _sorted(set(_literal_values(atoms)))
        out["type"] = "int" if values and all(isinstance(v, int) for v in values) else "str"
        if _has(atoms, "builtin", "str"):
            out["values"] = values
        else:
            out["choices"] = values
    elif _generic(atoms, "tuple") or _generic(atoms, "list") or _generic(atoms, "set"):
        head = "tuple" if _generic(atoms, "tuple") else "list" if _generic(atoms, "list") else "set"
        inner = [a for a in _generic(atoms, head)[2] if a[0] != "ellipsis"]
        ellipsis = any(a[0] == "ellipsis" for a in _generic(atoms, head)[2])
        out["nargs"] = "+" if head != "tuple" or ellipsis else len(inner)
        if _has(inner, "literal") and not _has(inner, "builtin", "str"):
            out["choices"] = _sorted(set(_literal_values(inner)))
        elif _has(inner, "builtin", "str"):
            out["type"] = "str"
        elif _has(inner, "builtin", "int"):
            out["type"] = "int"
        elif _has(inner, "builtin", "float"):
            out["type"] = "float"
    elif _has(atoms, "builtin", "int"):
        out["type"] = "human_int_or_auto" if name == "max_model_len" else "human_int" if name in HUMAN_INT_FIELDS else "int"
    elif _has(atoms, "builtin", "float"):
        out["type"] = "float"
    elif _has(atoms, "builtin", "dict") or _generic(atoms, "dict"):
        out["type"] = "json_or_str" if _has(atoms, "builtin", "str") or _has(atoms, "class") else "json"
    if _has(atoms, "builtin", "None") and out["type"] != "bool":
        out["optional"] = True
        if out["choices"] is not None:
            out["choices"] = out["choices"] + [None]
    return out


def class_fields(tree: Tree, rel: str, name: str) -> dict[str, tuple[str, ast.AnnAssign]]:
    """A dataclass's fields, its bases' first (`FrontendArgs(BaseFrontendArgs)`)."""
    found = _definition(tree, rel, name)
    if found is None or not isinstance(found[1], ast.ClassDef):
        raise ExtractError(f"class {name} not found from vllm/{rel}")
    where, node = found
    fields: dict[str, tuple[str, ast.AnnAssign]] = {}
    for base in node.bases:
        base_name = ast.unparse(base).split(".")[-1]
        base_def = _definition(tree, where, base_name)
        if base_def is not None and isinstance(base_def[1], ast.ClassDef) and _is_dataclass(base_def[1]):
            fields.update(class_fields(tree, where, base_name))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if ast.unparse(stmt.annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            fields[stmt.target.id] = (where, stmt)
    return fields


# ---- the flags -------------------------------------------------------------------------------------------


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


class Flags:
    """Every option string of `vllm serve`, with what it takes."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.flags: dict[str, dict[str, Any]] = {}

    def add(self, options: list[str], spec: dict[str, Any], source: str) -> None:
        longs = [o for o in options if o.startswith("--")]
        if not longs:
            return
        name, aliases = longs[0], [o for o in options if o != longs[0]]
        entry = {"source": source, **spec, "aliases": aliases}
        if entry["type"] == "bool":
            negations = []
            for opt in longs:
                negations.append("--no-" + opt[2:])
                for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                    if opt.startswith(prefix):
                        negations.append(inverse + opt[len(prefix):])
            entry["negations"] = sorted(set(negations))
        self.flags[name] = entry

    # -- add_argument calls -------------------------------------------------------------------------------
    def scan(self, fn: ast.FunctionDef, rel: str, origin: str, frontend: Optional[dict] = None) -> None:
        """Walk one function: its `get_kwargs` environment, its kwargs patches, its `add_argument` calls."""
        env: dict[str, Any] = {}  # variable -> class name (kwargs dict) or (class, field)
        patches: dict[tuple[str, str], dict[str, Any]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                if isinstance(target, ast.Name):
                    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("get_kwargs") and value.args:
                        env[target.id] = ast.unparse(value.args[0]).split(".")[-1]
                    elif isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
                        base = value.value
                        if isinstance(base, ast.Name) and isinstance(env.get(base.id), str):
                            env[target.id] = (env[base.id], value.slice.value)
                        elif isinstance(base, ast.Call) and ast.unparse(base.func).endswith("get_kwargs"):
                            env[target.id] = (ast.unparse(base.args[0]).split(".")[-1], value.slice.value)
        for node in ast.walk(fn):
            # X_kwargs["field"]["type"] = ... / alias["type"] = ...
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
                key = self._patched(node.targets[0], env)
                if key is not None:
                    patches.setdefault(key[0], {})[key[1]] = node.value
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remove":
                holder = node.func.value  # X_kwargs["field"]["choices"].remove(VALUE)
                key = self._patched(holder, env) if isinstance(holder, ast.Subscript) else None
                if key is not None and key[1] == "choices" and node.args:
                    patches.setdefault(key[0], {}).setdefault("remove", []).append(self._value(node.args[0], rel))
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if not options or not options[0].startswith("-"):
                    continue  # the positional model_tag
                field = self._field_of(node, env)
                spec: dict[str, Any] = {"type": "str", "nargs": None, "choices": None, "values": None, "optional": False}
                source = origin
                if field is not None:
                    cls, fname = field
                    fields = class_fields(self.tree, rel, cls)
                    if fname not in fields:
                        raise ExtractError(f"{origin}: {cls} has no field {fname}")
                    where, stmt = fields[fname]
                    spec = field_kwargs(self.tree, where, fname, stmt.annotation)
                    source = f"{cls}.{fname}"
                    self._apply(spec, patches.get(field, {}), rel)
                self._explicit(spec, node, rel)
                self.add(options, spec, source)

    def _patched(self, node: ast.Subscript, env: dict) -> Optional[tuple[tuple[str, str], str]]:
        """`X["f"]["key"]` or `alias["key"]` -> ((class, field), key)."""
        if not isinstance(node.slice, ast.Constant):
            return None
        key, base = node.slice.value, node.value
        if isinstance(base, ast.Name) and isinstance(env.get(base.id), tuple):
            return env[base.id], key
        if isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name) and isinstance(base.slice, ast.Constant):
            cls = env.get(base.value.id)
            if isinstance(cls, str):
                return (cls, base.slice.value), key
        return None

    def _field_of(self, call: ast.Call, env: dict) -> Optional[tuple[str, str]]:
        for kw in call.keywords:
            if kw.arg is not None:
                continue
            value = kw.value
            if isinstance(value, ast.Dict):  # {**X["f"], "default": None}
                value = next((v for k, v in zip(value.keys, value.values) if k is None), value)
            if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and isinstance(value.slice, ast.Constant):
                cls = env.get(value.value.id)
                if isinstance(cls, str):
                    return cls, value.slice.value
            if isinstance(value, ast.Name) and isinstance(env.get(value.id), tuple):
                return env[value.id]
        return None

    def _value(self, node: ast.AST, rel: str) -> Any:
        value = _literal(node)
        if value is None and isinstance(node, ast.Name):
            found = _definition(self.tree, rel, node.id)
            if found is not None and not isinstance(found[1], ast.ClassDef):
                value = _literal(found[1])
        return value

    def _type_of(self, node: ast.AST) -> Optional[tuple[str, Optional[str]]]:
        """An explicit or patched `type=`: (reference type, normalisation)."""
        text = ast.unparse(node)
        if isinstance(node, ast.Lambda) and ".lower()" in text and ".replace('-', '_')" in text:
            return "str", "lower_underscore"
        for name, kind in (("json.loads", "json"), ("human_readable_int_or_auto", "human_int_or_auto"), ("human_readable_int", "human_int")):
            if name in text:
                return kind, None
        if text in ("int", "float", "str"):
            return text, None
        if "parse_reasoning_parser" in text:
            return "str", None
        return None

    def _apply(self, spec: dict, patch: dict, rel: str) -> None:
        if "type" in patch:
            typed = self._type_of(patch["type"])
            if typed is not None:
                spec["type"], normalize = typed
                if normalize:
                    spec["normalize"] = normalize
                if "optional_type" in ast.unparse(patch["type"]):
                    spec["optional"] = True
        if "nargs" in patch:
            spec["nargs"] = _literal(patch["nargs"])
        if "action" in patch and _literal(patch["action"]) == "append":
            spec["nargs"], spec["repeatable"] = None, True
        for value in patch.get("remove", []):
            if spec["choices"] and value in spec["choices"]:
                spec["choices"] = [c for c in spec["choices"] if c != value]

    def _explicit(self, spec: dict, call: ast.Call, rel: str) -> None:
        for kw in call.keywords:
            if kw.arg == "action":
                action = _literal(kw.value) or ast.unparse(kw.value)
                if action in ("store_true", "store_false"):
                    spec.update(type="flag", nargs=None, choices=None, values=None, optional=False)
                elif "BooleanOptionalAction" in str(action):
                    spec.update(type="bool", nargs=None, choices=None, values=None, optional=False)
                elif action == "append":
                    spec["repeatable"] = True
            elif kw.arg == "type":
                typed = self._type_of(kw.value)
                spec["type"] = typed[0] if typed else "str"
            elif kw.arg == "choices":
                choices = _literal(kw.value)
                if choices is None and isinstance(kw.value, ast.Call) and ast.unparse(kw.value.func).endswith("get_args"):
                    choices = _literal_values(_atoms(self.tree, rel, kw.value.args[0]))
                if choices is None:  # built at run time (a platform's device type): not checkable here
                    spec["choices"], spec["values"], spec["platform_dependent"] = None, None, True
                else:
                    spec["choices"] = list(choices)
            elif kw.arg == "nargs":
                spec["nargs"] = _literal(kw.value)


def _function(tree: Tree, rel: str, name: str, cls: Optional[str] = None) -> ast.FunctionDef:
    body = tree.module(rel).body
    if cls is not None:
        (node,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls] or [None]
        if node is None:
            raise ExtractError(f"vllm/{rel}: no class {cls}")
        body = node.body
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ExtractError(f"vllm/{rel}: no function {cls + '.' if cls else ''}{name}")


CLI_ARGS = "entrypoints/common/cli_args.py"
ARG_UTILS = "engine/arg_utils.py"


def frontend_flags(tree: Tree, flags: Flags) -> None:
    """`BaseFrontendArgs.add_cli_args`: every field of FrontendArgs, with `_customize_cli_kwargs`' patches."""
    patches: dict[str, dict[str, Any]] = {}
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        fn = _function(tree, CLI_ARGS, "_customize_cli_kwargs", cls)
        for node in ast.walk(fn):
            target = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.Delete) and len(node.targets) == 1:
                target, value = node.targets[0], None
            if not (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)):
                continue
            inner = target.value
            if isinstance(inner, ast.Subscript) and isinstance(inner.slice, ast.Constant):
                patches.setdefault(inner.slice.value, {})[target.slice.value] = value
    for name, (where, stmt) in class_fields(tree, CLI_ARGS, "FrontendArgs").items():
        spec = field_kwargs(tree, where, name, stmt.annotation)
        patch = patches.get(name, {})
        if "nargs" in patch and patch["nargs"] is None:
            spec["nargs"] = None
        if "type" in patch and patch["type"] is not None:
            typed = flags._type_of(patch["type"])
            if typed is not None:
                spec["type"] = typed[0]
            if "LoRAParserAction" in ast.unparse(patch.get("action", ast.Constant(None))):
                spec["type"] = "str"
        if "action" in patch and _literal(patch["action"]) == "append":
            spec.update(nargs=None, repeatable=True)
        flags.add(["--" + name.replace("_", "-")], spec, f"FrontendArgs.{name}")


def dict_keys(tree: Tree, rel: str, name: str) -> list[str]:
    """The string keys of a module-level dict literal (or a dict-like call's keyword arguments)."""
    for node in tree.module(rel).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets) or node.value is None:
            continue
        value, keys = node.value, []
        if isinstance(value, ast.Dict):
            keys = [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(value, ast.Call):
            for kw in value.keywords:
                if kw.arg is not None:
                    keys.append(kw.arg)
                elif isinstance(kw.value, ast.Dict):
                    keys += [k.value for k in kw.value.keys if isinstance(k, ast.Constant)]
        if keys:
            return sorted(set(keys))
    raise ExtractError(f"vllm/{rel}: no dict {name}")


def auto_tokenizer_modes(tree: Tree) -> dict[str, str]:
    """`ModelConfig.__post_init__`: the tokenizer mode `auto` resolves to, by architecture."""
    fn = _function(tree, "config/model.py", "__post_init__", "ModelConfig")
    out: dict[str, str] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "self.tokenizer_mode == 'auto'":
            branch = node.body[0] if node.body and isinstance(node.body[0], ast.If) else None
            while branch is not None:
                test, mode = branch.test, None
                for stmt in branch.body:
                    if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "self.tokenizer_mode":
                        mode = _literal(stmt.value)
                archs: list = []
                if isinstance(test, ast.Compare) and ast.unparse(test.left) == "arch":
                    value = _literal(test.comparators[0])
                    archs = [value] if isinstance(value, str) else list(value or ())
                for arch in archs:
                    if mode:
                        out[arch] = mode
                branch = branch.orelse[0] if len(branch.orelse) == 1 and isinstance(branch.orelse[0], ast.If) else None
            return out
    raise ExtractError("vllm/config/model.py: no `if self.tokenizer_mode == 'auto'` block in ModelConfig.__post_init__")


def architectures(tree: Tree) -> list[str]:
    rel = "model_executor/models/registry.py"
    names: set[str] = set()
    for node in tree.module(rel).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.startswith("_") and target.id.endswith("_MODELS"):
                names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return sorted(names)


def version_of(tree: Tree) -> str:
    for node in tree.module("_version.py").body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            return str(_literal(node.value))
    raise ExtractError("vllm/_version.py: no __version__")


def reference(tree: Tree) -> dict[str, Any]:
    flags = Flags(tree)
    flags.scan(_function(tree, CLI_ARGS, "make_arg_parser"), CLI_ARGS, "make_arg_parser")
    frontend_flags(tree, flags)
    flags.scan(_function(tree, ARG_UTILS, "add_cli_args", "EngineArgs"), ARG_UTILS, "EngineArgs.add_cli_args")
    flags.scan(_function(tree, ARG_UTILS, "add_cli_args", "AsyncEngineArgs"), ARG_UTILS, "AsyncEngineArgs.add_cli_args")
    registries = {
        "reasoning_parsers": dict_keys(tree, "reasoning/__init__.py", "_REASONING_PARSERS_TO_REGISTER"),
        "tool_parsers": dict_keys(tree, "tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER"),
        "tokenizer_modes": dict_keys(tree, "tokenizers/registry.py", "_VLLM_TOKENIZERS"),
        "config_model_types": dict_keys(tree, "transformers_utils/config.py", "_CONFIG_REGISTRY"),
        "architectures": architectures(tree),
        "auto_tokenizer_modes": auto_tokenizer_modes(tree),
        "environment_variables": dict_keys(tree, "envs.py", "environment_variables"),
    }
    # Values a registry decides after parsing (the flag itself takes any string):
    # the tokenizer mode (tokenizers/registry.py: load_tokenizer_cls fails on an
    # unregistered mode; "auto" resolves by architecture), the reasoning parser
    # (config/reasoning.py, ReasoningParserManager; "none" means unset,
    # arg_utils.parse_reasoning_parser) and the tool-call parser
    # (cli_args.validate_api_server_args, ToolParserManager).
    for flag, values in (
        ("--tokenizer-mode", ["auto", *registries["tokenizer_modes"]]),
        ("--reasoning-parser", ["none", *registries["reasoning_parsers"]]),
        ("--tool-call-parser", registries["tool_parsers"]),
    ):
        if flag in flags.flags:
            flags.flags[flag]["values"] = sorted(set(values))
    return {
        "schema": SCHEMA,
        "vllm_version": version_of(tree),
        "wheel": {"file": tree.origin if tree.sha256 else None, "sha256": tree.sha256},
        "generated_by": "python -m infra.catalog.vllm.extract (bin/vllm-flag-reference)",
        "flags": dict(sorted(flags.flags.items())),
        "registries": registries,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Write the reference of `vllm serve` flags of a vLLM wheel (read, never imported).")
    parser.add_argument("source", type=Path, help="the wheel (.whl) or an unzipped tree holding vllm/")
    parser.add_argument("--out", type=Path, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    try:
        doc = reference(Tree.open(args.source))
    except (ExtractError, OSError, zipfile.BadZipFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(doc, indent=1, sort_keys=False) + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"{len(doc['flags'])} flags of vLLM {doc['vllm_version']} -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
