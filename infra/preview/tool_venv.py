"""A tool in a virtualenv of its own, installed from a pinned requirements file on first use.

Used for the tools whose pins cannot share ./venv or should not burden it: checkov
(`python -m infra scan`, venv-scan/) and NVIDIA AIConfigurator (`python -m infra perf
--compare-aiconfigurator`, venv-perf/). The virtualenv is installed again when the
requirements file changes (a stamp file holds its sha256), as `bin/test` does for ./venv.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Callable

from infra.errors import UserError


def sha256(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def ensure(root: Path, *, venv: str, requirements: str, stamp: str, tool: str, pinned: str, hint: str = "",
           note: str = "", install: bool = True, log: Callable[[str], None] = lambda m: None) -> Path:  # fmt: skip
    """The virtualenv's python, (re)installed from `requirements` when missing or out of date.

    `tool` names it in messages, `pinned` whose pinned requirements the file holds, `hint`
    what else the user may do when installing is not allowed, `note` why or how long."""
    req = root / requirements
    if not req.is_file():
        raise UserError(f"no {requirements} in {root}: {pinned} pinned requirements")
    folder = root / venv
    python, stamp_file, wanted = folder / "bin" / "python", folder / stamp, sha256(req)
    if python.is_file() and stamp_file.is_file() and stamp_file.read_text().strip() == wanted:
        return python
    if not install:
        raise UserError(f"{tool} is not installed in {venv}/ (or {requirements} changed since): run without --no-install{hint}")
    log(f"installing {tool} into {venv}/ from {requirements}{note} ...")
    install_log = root / f"{venv}-install.log"
    with open(install_log, "w") as out:
        steps = []
        if not python.is_file():
            steps.append([sys.executable, "-m", "venv", str(folder)])
        steps.append([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(req)])
        for step in steps:
            proc = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, cwd=root)
            if proc.returncode != 0:
                raise UserError(f"cannot install {tool} into {venv}/: `{' '.join(step[-4:])}` exited {proc.returncode} (see {install_log.name})")
    stamp_file.write_text(wanted + "\n")
    install_log.unlink(missing_ok=True)
    return python
