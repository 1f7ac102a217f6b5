"""SLA capacities kept on disk, so that processes share them (off unless asked for).

A capacity search takes seconds for a large layout (prod's: about 7 s on 2 cores), and
every process that plans a stack repeats it: the test suite's workers and the programs
its tests start plan prod a dozen times. With GPU_SERVING_SLA_CACHE naming a directory,
infra/planning/sla_search.py looks there when its in-process memo misses and writes what
it computed. An entry's name is the sha256 of what the result depends on: the model's
and instance type's full figures, the layout, knobs, workload and SLA, and the bytes of
every file under infra/ (the performance model, catalog and release tables that computed
it), so a change to any of them misses instead of reading a stale figure.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import cache
from pathlib import Path

ENV = "GPU_SERVING_SLA_CACHE"
_INFRA = Path(__file__).resolve().parent.parent


@cache
def code_digest(root: Path = _INFRA) -> str:
    """sha256 over the path and bytes of every file under `root` (not __pycache__)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.relative_to(root).parts):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _path(kind: str, key: tuple) -> Path | None:
    where = os.environ.get(ENV)
    if not where:
        return None
    # mutmut 3 keeps every mutant in the same files and picks one by this variable: a
    # mutant must not read what another computed.
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    name = hashlib.sha256(f"{code_digest()}\0{mutant}\0{kind}\0{key!r}".encode()).hexdigest()
    return Path(where) / f"{kind}-{name}.pickle"


def load(kind: str, key: tuple):
    """The entry stored for (kind, key), or None (no cache, no entry, or one unreadable)."""
    path = _path(kind, key)
    if path is None:
        return None
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def store(kind: str, key: tuple, value) -> None:
    """Writes the entry whole (a temporary file renamed over it: a reader sees all or nothing).
    A cache that cannot be written is no cache, not an error."""
    path = _path(kind, key)
    if path is None:
        return
    try:
        write_whole(path, pickle.dumps(value))
    except OSError:
        return


def write_whole(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path` and renames it over `path`: a process
    reading `path` at the same time sees the old file, the whole new one, or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
