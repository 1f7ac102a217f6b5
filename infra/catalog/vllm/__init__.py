"""What a pinned vLLM release accepts: its `vllm serve` flags, their values, its registries.

`vllm-<version>.json` in this folder is generated from the release's wheel by
`extract.py` (`bin/vllm-flag-reference <version>` downloads the wheel and runs
it; the file records the wheel's sha256). `check_serve_argv` judges a `vllm
serve` command line against it the way the release's parser would, and a little
stricter: an unknown flag, a value argparse would refuse, a value the release
refuses after parsing (a KV-cache dtype, tokenizer mode or parser name it does
not know), a repeated flag (vLLM only warns and keeps the last), an abbreviated
flag (argparse accepts unique prefixes; a new flag can make one ambiguous) and
`--enable-auto-tool-choice` without `--tool-call-parser` (the release refuses it
before loading: `entrypoints/common/cli_args.py::validate_parsed_serve_args`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

REFERENCE_DIR = Path(__file__).resolve().parent
GENERATE = "bin/vllm-flag-reference {version}"

_INT = re.compile(r"^-?\d+$")
_HUMAN_INT = re.compile(r"^(\d+(\.\d+)?[kmgt]|\d+[KMGT]|\d+)$")  # utils/argparse_utils.py::human_readable_int
_FLOAT = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$|^(inf|nan)$", re.IGNORECASE)


class UnknownRelease(LookupError):
    """No reference for that vLLM release in this folder."""


def reference_path(version: str) -> Path:
    return REFERENCE_DIR / f"vllm-{version}.json"


def known_releases() -> list[str]:
    return sorted(p.stem.removeprefix("vllm-") for p in REFERENCE_DIR.glob("vllm-*.json"))


@lru_cache(maxsize=None)
def load_reference(version: str) -> Mapping[str, Any]:
    path = reference_path(version)
    if not path.is_file():
        raise UnknownRelease(
            f"no flag reference for vLLM {version} (have: {', '.join(known_releases()) or 'none'}); "
            f"generate it from the release's wheel: {GENERATE.format(version=version)}"
        )
    doc = json.loads(path.read_text())
    if doc.get("vllm_version") != version:
        raise UnknownRelease(f"{path.name} describes vLLM {doc.get('vllm_version')}, not {version}")
    return doc


def _options(ref: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """Every option string -> (its flag, whether it is a negation)."""
    out: dict[str, tuple[str, bool]] = {}
    for flag, spec in ref["flags"].items():
        for opt in [flag, *spec.get("aliases", [])]:
            out[opt] = (flag, False)
        for opt in spec.get("negations", []):
            out[opt] = (flag, True)
    return out


def _value_problem(flag: str, spec: Mapping[str, Any], value: str) -> str | None:
    if spec.get("optional") and value in ("", "None"):
        return None
    kind = spec["type"]
    text = value
    if spec.get("normalize") == "lower_underscore":
        text = value.lower().replace("-", "_")
    if kind == "int" and not _INT.match(value):
        return f"{flag} takes an integer, not {value!r}"
    if kind == "human_int" and not _HUMAN_INT.match(value.strip()):
        return f"{flag} takes an integer such as 8192 or 8k, not {value!r}"
    if kind == "human_int_or_auto" and not (value.strip() in ("-1",) or value.strip().lower() == "auto" or _HUMAN_INT.match(value.strip())):
        return f"{flag} takes an integer such as 131072 or 128K, or auto, not {value!r}"
    if kind == "float" and not _FLOAT.match(value):
        return f"{flag} takes a number, not {value!r}"
    if kind == "json":
        try:
            json.loads(value)
        except ValueError:
            return f"{flag} takes JSON, not {value!r}"
    choices = spec.get("choices")
    if choices is not None:
        allowed = [c for c in choices if c is not None]
        typed: Any = int(text) if kind == "int" and _INT.match(text) else text
        if typed not in allowed:
            return f"{flag} {value!r} is not one of {', '.join(map(str, allowed))}"
    values = spec.get("values")
    if values is not None and text not in values:
        return f"{flag} {value!r} is not a value this release accepts ({', '.join(map(str, values))})"
    return None


def flag_values(version: str, flag: str) -> list[str] | None:
    """The values the release's reference lists for `flag` (read from its registries, as
    check_serve_argv checks them), or None where any value of its type goes."""
    return load_reference(version)["flags"][flag].get("values")


def check_serve_argv(argv: Sequence[str], version: str) -> list[str]:
    """Why `argv` (`vllm serve MODEL [flags]`, or just the flags) would not run on that release; empty: it would."""
    ref = load_reference(version)
    options = _options(ref)
    tokens = list(argv)
    if tokens[:2] == ["vllm", "serve"]:
        tokens = tokens[2:]
        if tokens and not tokens[0].startswith("-"):
            tokens = tokens[1:]  # the positional model_tag
    problems: list[str] = []
    seen: dict[str, str] = {}
    given: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("-"):
            problems.append(f"{token!r} is not a flag (a second positional argument, or a value without its flag)")
            continue
        name, has_inline, inline = token.partition("=")
        key = re.sub(r"(?<=--)[^.]*", lambda m: m.group(0).replace("_", "-"), name) if name.startswith("--") else name
        dotted = None
        if key.startswith("--") and "." in key:  # --json-arg.key value (FlexibleArgumentParser)
            key, dotted = key.split(".", 1)
        if key not in options:
            prefixes = [o for o in options if o.startswith(key)] if key.startswith("--") else []
            hint = f" (an abbreviation of {', '.join(sorted(prefixes)[:3])}? spell it out)" if prefixes else ""
            problems.append(f"{name} is not a flag of vLLM {version}{hint}")
            if not has_inline and i < len(tokens) and not tokens[i].startswith("-"):
                i += 1
            continue
        flag, negated = options[key]
        spec = ref["flags"][flag]
        if dotted is not None and spec["type"] not in ("json", "json_or_str"):
            problems.append(f"{name}: only JSON flags take dotted keys")
        if flag in seen and not spec.get("repeatable") and dotted is None:
            problems.append(f"{flag} is given twice ({seen[flag]} and {token}); vLLM keeps the last one")
        seen.setdefault(flag, token)
        if spec["type"] in ("bool", "flag"):
            if has_inline:
                problems.append(f"{name} takes no value (use {flag} or its negation)")
            given[flag] = not negated
            continue
        nargs = spec.get("nargs")
        values: list[str] = []
        if has_inline:
            values = [inline]
        elif nargs == "?":
            if i < len(tokens) and not tokens[i].startswith("-"):
                values, i = [tokens[i]], i + 1
        elif nargs == "+" or isinstance(nargs, int) and nargs > 1:
            while i < len(tokens) and not tokens[i].startswith("--") and (not tokens[i].startswith("-") or _INT.match(tokens[i])):
                values.append(tokens[i])
                i += 1
            if not values:
                problems.append(f"{flag} needs at least one value")
            if isinstance(nargs, int) and len(values) != nargs:
                problems.append(f"{flag} takes {nargs} values, got {len(values)}")
        else:
            if i < len(tokens) and (not tokens[i].startswith("-") or _FLOAT.match(tokens[i])):
                values, i = [tokens[i]], i + 1
            else:
                problems.append(f"{flag} needs a value")
        if dotted is None:
            for value in values:
                problem = _value_problem(flag, spec, value)
                if problem:
                    problems.append(problem)
        given[flag] = values[-1] if values else True
    if given.get("--enable-auto-tool-choice") is True and not given.get("--tool-call-parser"):
        problems.append("--enable-auto-tool-choice requires --tool-call-parser (validate_parsed_serve_args)")
    return problems


def unknown_environment(names: Iterable[str], version: str) -> list[str]:
    """`VLLM_*` variables the release does not know (it warns, or refuses with --fail-on-environ-validation)."""
    known = set(load_reference(version)["registries"]["environment_variables"])
    return sorted(n for n in set(names) if n.startswith("VLLM_") and n not in known)
