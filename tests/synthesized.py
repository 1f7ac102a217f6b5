"""The repository's own stacks, as they are, synthesized once per test run for the tests that only read them.

`repo_stack("prod")` is `synthesize("prod")` of this repository (infra/preview/synth.py: the real
program on the mocked engine, the stack file's config), a fresh copy for each caller. A synthesis
of prod costs seconds, and a dozen test files read the same document: the first process to need
it writes it to the run's shared directory (tests/conftest.py shared_path) and the others, every
xdist worker included, read it back. The entry is named by the bytes of the program (infra/,
components/, __main__.py), the project and stack files, and mutmut's mutant, so a mutant never
reads another's document. A test of synthesis itself (the same bytes again, day two, a patched
program) calls `synthesize` and not this.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

from infra.planning.capacity_cache import code_digest, write_whole
from infra.preview.synth import dump, synthesize
from tests.conftest import shared_path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _name(stack: str) -> str:
    h = hashlib.sha256()
    for tree in ("infra", "components"):
        h.update(code_digest(REPO_ROOT / tree).encode())
    for file in ("__main__.py", "Pulumi.yaml", f"Pulumi.{stack}.yaml"):
        h.update(file.encode() + b"\0" + (REPO_ROOT / file).read_bytes() + b"\0")
    h.update(os.environ.get("MUTANT_UNDER_TEST", "").encode())
    return f"{stack}-{h.hexdigest()}.json"


@cache
def _text(stack: str) -> str:
    path = shared_path("synth", _name(stack))
    if path is not None:
        try:
            return path.read_text()
        except OSError:
            pass
    text = dump(synthesize(stack, REPO_ROOT))
    if path is not None:
        write_whole(path, text.encode())
    return text


def repo_stack(stack: str) -> dict:
    """The synthesis document of this repository's `stack`, a copy the caller may change."""
    return json.loads(_text(stack))
