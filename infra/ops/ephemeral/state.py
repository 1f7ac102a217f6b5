"""The state file of an ephemeral stack: `.ephemeral/<stack>.json`.

Written before the stack exists (so a teardown always knows what to remove),
updated as the stack goes up, is tested or fails, and deleted once the stack is
gone. It records the backend, so `down` goes where `up` went whatever today's
environment says, and the process that ran `up`, so a lock it left can be told
from one a live update holds.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra.config import REPO_ROOT
from infra.errors import UserError
from infra.ops.ephemeral.naming import NAME_PREFIX

STATE_DIR = REPO_ROOT / ".ephemeral"

# Status values of the state file.
CREATING, UP, TESTED, TEST_FAILED, KEPT, TEARDOWN_FAILED = "creating", "up", "tested", "test-failed", "kept", "teardown-failed"


@dataclass
class State:
    """`.ephemeral/<stack>.json`: written before the stack exists, deleted once it is gone."""

    stack: str
    backend: str
    expiresAt: str
    template: str
    owner: str
    createdAt: str
    status: str = CREATING
    pid: int = 0
    host: str = ""
    workDir: str = ""
    config: dict[str, str] = field(default_factory=dict)  # what was set on the stack, secrets left out

    def path(self, state_dir: Path) -> Path:
        return Path(state_dir) / f"{self.stack}.json"

    def save(self, state_dir: Path) -> Path:
        path = self.path(state_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: Path) -> "State":
        try:
            data = json.loads(Path(path).read_text())
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError) as exc:
            raise UserError(f"cannot read the state file {path}: {exc}") from None


def state_files(state_dir: Path) -> list[Path]:
    return sorted(Path(state_dir).glob(f"{NAME_PREFIX}*.json"))


def find_state(stack: str | None, state_dir: Path) -> State | None:
    """The state of `stack`, or of the one stack recorded in `state_dir`; None when there is none."""
    if stack:
        path = Path(state_dir) / f"{stack}.json"
        return State.load(path) if path.is_file() else None
    found = state_files(state_dir)
    if len(found) > 1:
        names = ", ".join(p.stem for p in found)
        raise UserError(f"{len(found)} ephemeral stacks are recorded in {state_dir} ({names}); choose one with --stack")
    return State.load(found[0]) if found else None


def stale_lock(state: State | None) -> bool:
    """A lock is stale when the `up` that took it ran here and its process is gone (or is this one)."""
    if state is None or not state.pid or state.host != socket.gethostname():
        return False
    return state.pid == os.getpid() or not process_alive(state.pid)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
