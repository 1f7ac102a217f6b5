"""The requirement files of the repository, read the way pip reads them (for the tests).

    requirements.txt        the Pulumi program (Pulumi.yaml has the Pulumi CLI install it)
    requirements-tools.txt  -r requirements.txt, plus what `python -m infra ...` needs
    requirements-dev.txt    -r requirements-tools.txt, plus the test tools

- `read(path)`: the `-r` includes and the pinned requirements of one file.
- `included(path)`: the file and every file it includes, recursively.
- `pins(path)`: name -> (version, extras) over `included(path)`.
- `distributions(path)`: every distribution installing `path` brings in: the pinned
  ones and, through their installed metadata, their dependencies (markers
  evaluated, extras followed).
- `providers(module)`: the installed distributions that provide a top-level module.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parent.parent
PROGRAM, TOOLS, DEV = "requirements.txt", "requirements-tools.txt", "requirements-dev.txt"
POLICY_PACK = "policies/requirements.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class RequirementFile:
    path: str  # relative to the repository
    includes: list[str] = field(default_factory=list)  # `-r` targets, relative to the repository
    requirements: list[Requirement] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # lines that are neither a pin nor an include


def read(path: str) -> RequirementFile:
    file = REPO_ROOT / path
    out = RequirementFile(path)
    for number, raw in enumerate(file.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            target = (file.parent / line.split(None, 1)[1].strip()).resolve()
            out.includes.append(str(target.relative_to(REPO_ROOT)))
            continue
        try:
            req = Requirement(line)
        except Exception as exc:  # noqa: BLE001 - reported by the test that reads the file
            out.problems.append(f"{path}:{number}: {raw!r}: {exc}")
            continue
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            out.problems.append(f"{path}:{number}: {raw!r} is not pinned to one version (name==version)")
        out.requirements.append(req)
    return out


def included(path: str) -> list[str]:
    """`path` and every file it includes with `-r`, recursively, in the order pip reads them."""
    seen: list[str] = []

    def visit(p: str) -> None:
        if p in seen:
            return
        seen.append(p)
        for inc in read(p).includes:
            visit(inc)

    visit(path)
    return seen


def pins(path: str) -> dict[str, tuple[str, frozenset[str]]]:
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for p in included(path):
        for req in read(p).requirements:
            out[canonical(req.name)] = (next(iter(req.specifier)).version, frozenset(req.extras))
    return out


@functools.lru_cache(maxsize=None)
def _requires(dist: str) -> tuple[Requirement, ...]:
    return tuple(Requirement(r) for r in importlib.metadata.requires(dist) or [])


def distributions(path: str) -> set[str]:
    """Every distribution (canonical name) that installing `path` brings in."""
    done: dict[str, set[str]] = {}  # distribution -> the extras already followed
    todo = [(name, set(extras)) for name, (_, extras) in pins(path).items()]
    while todo:
        name, extras = todo.pop()
        if name in done and extras <= done[name]:
            continue
        followed = done.setdefault(name, set())
        followed |= extras
        envs = [{"extra": ""}] + [{"extra": e} for e in sorted(followed)]
        for req in _requires(name):
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((canonical(req.name), set(req.extras)))
    return set(done)


@functools.lru_cache(maxsize=None)
def _module_map() -> dict[str, tuple[str, ...]]:
    return {m: tuple(canonical(d) for d in ds) for m, ds in importlib.metadata.packages_distributions().items()}


def providers(module: str) -> tuple[str, ...]:
    """The installed distributions that provide top-level module `module` (empty: none installed does)."""
    return _module_map().get(module, ())
