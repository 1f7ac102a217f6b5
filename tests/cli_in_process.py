"""The command line in-process: typer's CliRunner against `infra.cli.app.app`, for the CLI tests that need
no fresh interpreter (each test file keeps one `python -m infra` subprocess per command for the real entry point).

- `invoke(*args, expect=...)`: runs the app with the environment a subprocess test gave its child (forced
  colour off: `FORCE_COLOR`, `TTY_COMPATIBLE`, `TTY_INTERACTIVE` removed; nothing else changed, so rich
  sees the same width as through a pipe unless `env` says otherwise). An exception other than the app's
  exit is raised again with its traceback (a subprocess would have printed one); the exit status is
  checked (unless `expect` is None) and that no "Traceback" reached the output. The result is a
  `subprocess.CompletedProcess` (`returncode`, `stdout`, `stderr`), as the subprocess tests read it.
- `serve_synthesis(monkeypatch, docs)`: `infra.preview.synth.synthesize` (what `scan_stack` and
  `check_stack` call) hands out a deep copy of an already synthesised document for the (stack, root) keys
  of `docs` (root None: this repository, as the CLI passes it without --root), and synthesises any other
  for real. Only for documents of the same, unedited stack files: the same files give the same document
  (test_synth.py holds that).
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Callable, Mapping, Optional

from typer.testing import CliRunner

from infra.cli.app import app
from infra.preview import synth as synth_module

NO_FORCED_COLOUR = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "TTY_INTERACTIVE": None}


def invoke(*args: str, expect: Optional[int] = 0, env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    result = CliRunner().invoke(app, list(args), env={**NO_FORCED_COLOUR, **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    output = result.stdout + result.stderr
    if expect is not None:
        assert result.exit_code == expect, f"exit {result.exit_code}, expected {expect}:\n{output}"
    assert "Traceback" not in output, output
    return subprocess.CompletedProcess(["python", "-m", "infra", *args], result.exit_code, result.stdout, result.stderr)


def serve_synthesis(monkeypatch, docs: Mapping[tuple[str, Optional[Path]], Callable[[], dict]]) -> None:
    real = synth_module.synthesize
    known = {(stack, Path(root).resolve() if root is not None else None): get for (stack, root), get in docs.items()}

    def synthesize(stack: str, root: Optional[Path] = None) -> dict:
        key = (stack, Path(root).resolve() if root is not None else None)
        return copy.deepcopy(known[key]()) if key in known else real(stack, root)

    monkeypatch.setattr(synth_module, "synthesize", synthesize)
