"""The seam between the orchestration and Pulumi, and where Pulumi keeps the state.

The orchestration (commands.py) talks to Pulumi only through the small
`Workspace` protocol (`set_config`, `up`, `destroy`, `remove`, `cancel`,
`interrupt`); `PulumiWorkspace` implements it with `pulumi.automation` (which
drives the Pulumi CLI, found by `find_pulumi_cli`), and the tests use a fake.

State lives in the project's backend (`file://~` from Pulumi.yaml: a local file
backend), or `$PULUMI_BACKEND_URL` / `--backend`. A self-managed backend
encrypts secrets with `$PULUMI_CONFIG_PASSPHRASE`, which must be set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

import yaml

from infra.config import REPO_ROOT
from infra.errors import UserError

DEFAULT_BACKEND = "file://~"  # Pulumi.yaml's, when it names none

Log = Callable[[str], None]


def stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- errors and the protocol


class WorkspaceError(Exception):
    """A Pulumi operation failed; the message is the useful tail of its output."""


class StackLocked(WorkspaceError):
    """Another update holds the stack's lock (or a killed one left it behind)."""


class StackNotFound(WorkspaceError):
    """The backend has no such stack."""


class WorkspaceUnavailable(UserError):
    """Pulumi cannot run here at all (no CLI, unusable CLI)."""


@dataclass(frozen=True)
class ConfigItem:
    """One stack config value as `pulumi config set` takes it: a string, maybe secret."""

    value: str
    secret: bool = False


class Workspace(Protocol):
    """What the orchestration needs from Pulumi. Every stack operation takes the stack name."""

    def set_config(self, stack: str, values: Mapping[str, ConfigItem]) -> None:
        """Create the stack when it does not exist, then set these config keys on it."""

    def up(self, stack: str) -> dict[str, Any]:
        """`pulumi up`; returns the stack outputs (secrets masked). Raises WorkspaceError."""

    def destroy(self, stack: str) -> None:
        """`pulumi destroy`. Raises StackNotFound, StackLocked or WorkspaceError."""

    def remove(self, stack: str) -> None:
        """`pulumi stack rm` (the stack must be empty)."""

    def cancel(self, stack: str) -> None:
        """`pulumi cancel`: drop the lock of an update that is no longer running."""

    def interrupt(self) -> None:
        """Ask running Pulumi CLI processes to stop gracefully (finish in-flight operations, save state)."""


# --------------------------------------------------------------------------- the backend


def project_backend(root: Path = REPO_ROOT) -> str | None:
    """`backend.url` of the project's Pulumi.yaml, if it sets one."""
    try:
        doc = yaml.safe_load((root / "Pulumi.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    backend = doc.get("backend") if isinstance(doc, dict) else None
    url = backend.get("url") if isinstance(backend, dict) else None
    return str(url) if url else None


def resolve_backend(explicit: str | None, env: Mapping[str, str], root: Path = REPO_ROOT) -> str:
    """Where state goes: `--backend`, else $PULUMI_BACKEND_URL, else Pulumi.yaml's (the CLI's own order)."""
    return explicit or env.get("PULUMI_BACKEND_URL") or project_backend(root) or DEFAULT_BACKEND


def is_service_backend(backend: str) -> bool:
    """Pulumi Cloud (or a self-hosted service) keeps secrets itself; everything else needs a passphrase here."""
    return backend.startswith(("https://", "http://"))


def require_passphrase(backend: str, env: Mapping[str, str]) -> None:
    if is_service_backend(backend):
        return
    if env.get("PULUMI_CONFIG_PASSPHRASE") or env.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        return
    raise UserError(
        f"PULUMI_CONFIG_PASSPHRASE is not set (or is empty): the backend {backend} is self-managed, and Pulumi "
        "encrypts each stack's secrets with that passphrase; export PULUMI_CONFIG_PASSPHRASE=<passphrase> "
        "(in CI, from a repository secret) and run again; `down` needs the same passphrase"
    )


# --------------------------------------------------------------------------- the Pulumi CLI and the Automation API


def find_pulumi_cli(env: Mapping[str, str] | None = None) -> Path:
    """The Pulumi CLI: `pulumi` on PATH, else the install script's `~/.pulumi/bin/pulumi`."""
    env = os.environ if env is None else env
    found = shutil.which("pulumi", path=env.get("PATH"))
    if found:
        return Path(found)
    home = Path(env.get("PULUMI_HOME") or Path.home() / ".pulumi")
    candidate = home / "bin" / "pulumi"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    raise WorkspaceUnavailable(
        "the Pulumi CLI is not installed: the Automation API drives the `pulumi` command, and there is none on PATH "
        f"or in {candidate}; install it (https://www.pulumi.com/docs/iac/download-install/, or in GitHub Actions "
        "`pulumi/actions` without a command) and run again"
    )


def _tail(text: str, lines: int = 25) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _command_message(exc: Exception) -> str:
    """The useful part of an automation CommandError: its stderr (the CLI's error), else the output's tail."""
    text = str(exc)
    head, sep, stderr = text.rpartition("\n stderr: ")
    if sep and stderr.strip():
        return _tail(stderr)
    return _tail(head if sep else text)


class PulumiWorkspace:
    """The Workspace on `pulumi.automation`: a local program (this repository's __main__.py) and the Pulumi CLI."""

    def __init__(self, backend: str, work_dir: Path = REPO_ROOT, log: Log | None = None, env: Mapping[str, str] | None = None):
        self.backend = backend
        self.work_dir = Path(work_dir)
        self._log = log
        cli = find_pulumi_cli(env)
        try:
            from pulumi import automation as auto

            # Runs `pulumi version` and checks it against the SDK's minimum.
            self._command = auto.PulumiCommand(root=str(cli.parent.parent)) if cli.parent.name == "bin" else auto.PulumiCommand()
        except Exception as exc:  # noqa: BLE001 - any failure here means "cannot run Pulumi"
            raise WorkspaceUnavailable(f"the Pulumi CLI at {cli} cannot be used: {exc}") from None
        self._auto = auto
        # Every command goes to the backend the state file records, whatever the caller's login says.
        self._env = {"PULUMI_BACKEND_URL": backend, "PULUMI_SKIP_UPDATE_CHECK": "true"}

    # -- helpers
    def _print(self, line: str) -> None:
        (self._log or stderr)(line)

    def _options(self):
        return self._auto.LocalWorkspaceOptions(work_dir=str(self.work_dir), env_vars=self._env, pulumi_command=self._command)

    @contextlib.contextmanager
    def _translate(self, what: str, stack: str) -> Iterator[None]:
        errors = self._auto.errors
        try:
            yield
        except errors.ConcurrentUpdateError as exc:
            raise StackLocked(f"{what} {stack}: the stack is locked by another update\n{_command_message(exc)}") from None
        except errors.StackNotFoundError:
            raise StackNotFound(f"{what} {stack}: no such stack in {self.backend}") from None
        except errors.CommandError as exc:
            raise WorkspaceError(f"{what} {stack} failed:\n{_command_message(exc)}") from None
        except FileNotFoundError as exc:  # the CLI vanished between the check and the call
            raise WorkspaceUnavailable(f"{what} {stack}: cannot run the Pulumi CLI: {exc}") from None

    def _select(self, stack: str, create: bool = False):
        if create:
            return self._auto.create_or_select_stack(stack_name=stack, work_dir=str(self.work_dir), opts=self._options())
        return self._auto.select_stack(stack_name=stack, work_dir=str(self.work_dir), opts=self._options())

    # -- the protocol
    def set_config(self, stack: str, values: Mapping[str, ConfigItem]) -> None:
        with self._translate("configure", stack):
            s = self._select(stack, create=True)
            s.set_all_config({k: self._auto.ConfigValue(v.value, secret=v.secret) for k, v in values.items()})

    def up(self, stack: str) -> dict[str, Any]:
        with self._translate("up", stack):
            result = self._select(stack).up(on_output=self._print, on_error=self._print, color="never")
        return {k: ("[secret]" if v.secret else v.value) for k, v in result.outputs.items()}

    def destroy(self, stack: str) -> None:
        with self._translate("destroy", stack):
            # continue_on_error: delete everything that can go, report the rest (the retry then finds less).
            self._select(stack).destroy(on_output=self._print, on_error=self._print, color="never", continue_on_error=True)

    def remove(self, stack: str) -> None:
        with self._translate("remove", stack):
            ws = self._auto.LocalWorkspace(work_dir=str(self.work_dir), env_vars=self._env, pulumi_command=self._command)
            ws.remove_stack(stack)

    def cancel(self, stack: str) -> None:
        with self._translate("cancel", stack):
            self._select(stack).cancel()

    def interrupt(self) -> None:
        for pid in _children(os.getpid()):
            if _comm(pid).startswith("pulumi"):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)


def _children(ppid: int) -> list[int]:
    """Child process ids (Linux /proc; empty elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else []:
        try:
            stat = entry.read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == ppid:
                out.append(int(entry.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# Looked up at call time, so tests (and the CLI tests) can put a fake in its place.
make_workspace: Callable[[str], Workspace] = PulumiWorkspace
