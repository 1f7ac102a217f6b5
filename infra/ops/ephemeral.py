"""Ephemeral test stacks: `python -m infra ephemeral up | test | down`.

A short-lived copy of a small stack file (`Pulumi.test.yaml` unless `--from`
says otherwise) is deployed, checked and destroyed on the Pulumi Automation API:

    up    a new stack `eph-<run id, base 36>-<attempt>` (GitHub Actions) or `eph-<8 hex>`,
          its config copied from the stack file with `gpu-serving:lifecycle`
          rewritten to {production: false, owner, expiresAt: now + ttl}: every AWS
          resource carries the `expires-at` tag through the provider's default
          tags (infra.aws.tags), so the leak sweeper can delete what a failed teardown
          leaves. Teardown is registered before anything is created: the state
          file `.ephemeral/<stack>.json` is written first, then an atexit hook and
          SIGINT/SIGTERM/SIGHUP handlers are armed, then the stack is created and
          `up` runs. A failed or interrupted `up` destroys and removes the stack
          before exiting non-zero (`--keep-on-failure` keeps it for debugging).
          The EFA check (NCCL all-reduce across two nodes) is switched on here,
          at bring-up, when the instance type has EFA and there are >= 2 nodes:
          it needs GPU nodes the serving pods do not hold yet, so it can only
          run before the RayCluster takes them (components/serving.py).
    test  switches the serving benchmark on (`gpu-serving:checks.benchmark`) and
          runs `up` again: pulumi-kubernetes waits for the benchmark Job, which
          fails when p99 TTFT or TPOT miss their thresholds, so a passing `up`
          is a passing check. The stack stays up; `down` removes it.
    down  destroys the stack named in the state file (or `--stack`), retrying
          once, then removes it from the backend and deletes the state file. A
          lock left by an `up` that was killed (its process is gone) is
          cancelled first.

State lives in the project's backend (`file://~` from Pulumi.yaml: a local file
backend), or `$PULUMI_BACKEND_URL` / `--backend`. A self-managed backend
encrypts secrets with `$PULUMI_CONFIG_PASSPHRASE`, which must be set.

The orchestration talks to Pulumi only through the small `Workspace` protocol
below (`set_config`, `up`, `destroy`, `remove`, `cancel`, `interrupt`);
`PulumiWorkspace` implements it with `pulumi.automation` (which drives the
Pulumi CLI), and the tests use a fake. Exit codes: 0 done, 1 a Pulumi operation
failed, 2 a usage or config error (one message, no traceback), 130 interrupted.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import getpass
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

import typer
import yaml

from infra.config import PROJECT, REPO_ROOT, SECRET_KEYS, StackConfig, from_mapping, load_stack_file, read_stack_file, stack_file_name
from infra.errors import UserError

DEFAULT_TEMPLATE = "test"
DEFAULT_TTL_HOURS = 6.0
MAX_TTL_HOURS = 7 * 24.0
NAME_PREFIX = "eph-"
STATE_DIR = REPO_ROOT / ".ephemeral"
DEFAULT_BACKEND = "file://~"  # Pulumi.yaml's, when it names none
DESTROY_ATTEMPTS = 2  # a second pass clears what the first left for ordering reasons (ENIs, finalizers)

LIFECYCLE_KEY = f"{PROJECT}:lifecycle"
CHECKS_KEY = f"{PROJECT}:checks"
HF_TOKEN_KEY = f"{PROJECT}:hfToken"
HF_TOKEN_ENV = "HF_TOKEN"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Status values of the state file.
CREATING, UP, TESTED, TEST_FAILED, KEPT, TEARDOWN_FAILED = "creating", "up", "tested", "test-failed", "kept", "teardown-failed"

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the workspace seam


class WorkspaceError(Exception):
    """A Pulumi operation failed; the message is the useful tail of its output."""


class StackLocked(WorkspaceError):
    """Another update holds the stack's lock (or a killed one left it behind)."""


class StackNotFound(WorkspaceError):
    """The backend has no such stack."""


class WorkspaceUnavailable(UserError):
    """Pulumi cannot run here at all (no CLI, unusable CLI)."""


class Interrupted(BaseException):
    """A signal arrived (SIGINT, SIGTERM, SIGHUP). BaseException: library code must not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


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
        (self._log or _stderr)(line)

    def _options(self):
        return self._auto.LocalWorkspaceOptions(work_dir=str(self.work_dir), env_vars=self._env, pulumi_command=self._command)

    @contextlib.contextmanager
    def _translate(self, what: str, stack: str) -> Iterator[None]:
        errors = self._auto.errors
        try:
            yield
        except errors.ConcurrentUpdateError as exc:
            raise StackLocked(f"{what} {stack}: the stack is locked by another update\n{_command_message(exc)}") from None
        except errors.StackNotFoundError as exc:
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


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Looked up at call time, so tests (and the CLI tests) can put a fake in its place.
make_workspace: Callable[[str], Workspace] = PulumiWorkspace


# --------------------------------------------------------------------------- names, owner, expiry, config


def base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def stack_name(env: Mapping[str, str], token: Callable[[int], str] = secrets.token_hex) -> str:
    """`eph-<run id in base 36>-<attempt>` in GitHub Actions (a re-run gets its own), else `eph-<8 random hex digits>`.

    Short on purpose: the stack name goes into every resource name (the EKS
    cluster is `gpu-serving-<stack>`, IAM roles `gpu-serving-<stack>-...-role`
    plus Pulumi's 8-character suffix, and IAM allows 64 characters).
    """
    run_id = (env.get("GITHUB_RUN_ID") or "").strip()
    if run_id.isdigit():
        attempt = (env.get("GITHUB_RUN_ATTEMPT") or "1").strip()
        return f"{NAME_PREFIX}{base36(int(run_id))}-{attempt if attempt.isdigit() else '1'}"
    return f"{NAME_PREFIX}{token(4)}"


# AWS tag values (IAM is the strictest of the services tagged): letters, digits, spaces and _ . : / = + - @
_TAG_UNSAFE = re.compile(r"[^\w .:/=+@-]")


def owner_tag(explicit: str | None, env: Mapping[str, str]) -> str:
    """`--owner`, else $GITHUB_ACTOR, else the local user; made safe as an AWS tag value."""
    raw = explicit or env.get("GITHUB_ACTOR") or _local_user()
    owner = _TAG_UNSAFE.sub("-", raw or "").strip(" -")[:128]
    if not owner:
        raise UserError(f"owner {raw!r} has nothing usable as an AWS tag value; give --owner NAME")
    return owner


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database entry (containers)
        return ""


def expires_at(now: dt.datetime, ttl_hours: float) -> str:
    """now + ttl as ISO 8601 UTC with a Z, to the second (the form gpu-serving:lifecycle.expiresAt takes)."""
    if not (0 < ttl_hours <= MAX_TTL_HOURS):
        raise UserError(f"--ttl {ttl_hours:g} is out of range; allowed: more than 0 and at most {MAX_TTL_HOURS:g} hours")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    when = now.astimezone(dt.timezone.utc) + dt.timedelta(hours=ttl_hours)
    return when.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def efa_check_applies(cfg: StackConfig) -> bool:
    """The EFA check runs an all-reduce across two nodes of an EFA instance type."""
    from infra.catalog.instances import INSTANCE_TYPES
    from infra.k8s.serving_spec import EFA_CHECK_NODES

    it = INSTANCE_TYPES.get(cfg.gpu.instance_type)
    return it is not None and it.max_efa_interfaces > 0 and cfg.gpu.nodes >= EFA_CHECK_NODES


def _encode(value: Any) -> str:
    """As the Pulumi CLI hands config to a program: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def program_config(stack: str, values: Mapping[str, ConfigItem], source: str) -> StackConfig:
    """Validate config items the way the program will read them (`pulumi.Config.get_object` decodes JSON)."""
    areas: dict[str, Any] = {}
    region = None
    for key, item in values.items():
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            region = item.value
        elif namespace == PROJECT and name not in SECRET_KEYS:
            try:
                areas[name] = json.loads(item.value)
            except json.JSONDecodeError:
                areas[name] = item.value
    return from_mapping(stack, areas, region=region, source=source)


def ephemeral_config(
    template: str,
    *,
    stack: str,
    owner: str,
    expiry: str,
    efa: Optional[bool] = None,
    root: Path = REPO_ROOT,
    env: Mapping[str, str] | None = None,
) -> tuple[dict[str, ConfigItem], list[str]]:
    """The new stack's config: the template's, lifecycle rewritten, the EFA check decided; and notes for the log.

    Refuses a production template. Secrets of the template are encrypted for that
    stack and are not copied; `$HF_TOKEN`, when set, becomes `gpu-serving:hfToken`.
    """
    env = os.environ if env is None else env
    source = stack_file_name(template)
    cfg = load_stack_file(template, root)  # the template must be valid itself
    if cfg.lifecycle.production:
        raise UserError(
            f"{source} is a production stack ({LIFECYCLE_KEY}.production is true); ephemeral stacks are made only "
            f"from non-production stack files such as {stack_file_name(DEFAULT_TEMPLATE)}"
        )
    raw = read_stack_file(template, root)
    notes: list[str] = []
    out: dict[str, ConfigItem] = {}
    for key, value in raw.items():
        key = str(key)
        if isinstance(value, dict) and set(value) == {"secure"}:
            notes.append(f"{key} is a secret of {source}, encrypted for that stack: not copied")
            continue
        if key == LIFECYCLE_KEY:
            continue
        out[key] = ConfigItem(_encode(value))
    out[LIFECYCLE_KEY] = ConfigItem(json.dumps({"production": False, "owner": owner, "expiresAt": expiry}))

    checks = dict(raw.get(CHECKS_KEY) or {})
    applies = efa_check_applies(cfg)
    if efa and not applies:
        raise UserError(
            f"--efa: the EFA check runs across 2 or more nodes of an EFA instance type; {source} has "
            f"{cfg.gpu.nodes} x {cfg.gpu.instance_type}"
        )
    want_efa = applies if efa is None else efa
    if CHECKS_KEY in raw or want_efa:
        checks["efa"] = want_efa
        out[CHECKS_KEY] = ConfigItem(json.dumps(checks))
    notes.append(
        "EFA check at bring-up: on" if want_efa else
        f"EFA check: off ({cfg.gpu.nodes} x {cfg.gpu.instance_type}" + ("" if applies else ": needs 2+ nodes with EFA") + ")"
    )
    token = env.get(HF_TOKEN_ENV)
    if token:
        out[HF_TOKEN_KEY] = ConfigItem(token, secret=True)
        notes.append(f"{HF_TOKEN_KEY}: from ${HF_TOKEN_ENV} (secret)")
    program_config(stack, out, source=f"ephemeral stack {stack} (from {source})")
    return out, notes


# --------------------------------------------------------------------------- the state file


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


def _github_output(env: Mapping[str, str], **values: str) -> None:
    target = env.get("GITHUB_OUTPUT")
    if not target:
        return
    with contextlib.suppress(OSError), open(target, "a") as fh:
        for k, v in values.items():
            fh.write(f"{k}={v}\n")


# --------------------------------------------------------------------------- teardown


def _stale_lock(state: State | None) -> bool:
    """A lock is stale when the `up` that took it ran here and its process is gone (or is this one)."""
    if state is None or not state.pid or state.host != socket.gethostname():
        return False
    return state.pid == os.getpid() or not _process_alive(state.pid)


def teardown(ws: Workspace, stack: str, *, state: State | None, log: Log, force_unlock: bool = False,
             attempts: int = DESTROY_ATTEMPTS) -> bool:
    """Destroy then remove `stack`; True when it is gone. Never raises a WorkspaceError."""
    unlocked = False
    for attempt in range(1, attempts + 1):
        log(f"destroying {stack} (attempt {attempt} of {attempts})")
        try:
            ws.destroy(stack)
            break
        except StackNotFound:
            log(f"{stack} does not exist in the backend: nothing to destroy")
            return True
        except StackLocked as exc:
            if unlocked or not (force_unlock or _stale_lock(state)):
                log(f"{exc}\nif no other update of {stack} is running, run `python -m infra ephemeral down --stack {stack} --force-unlock`")
                return False
            log(f"{stack} is locked by an update that is no longer running; cancelling the lock")
            try:
                ws.cancel(stack)
            except WorkspaceError as cancel_exc:
                log(str(cancel_exc))
                return False
            unlocked = True
        except WorkspaceError as exc:
            log(str(exc))
    else:
        return False
    try:
        ws.remove(stack)
    except StackNotFound:
        pass
    except WorkspaceError as exc:
        log(str(exc))
        return False
    log(f"{stack} destroyed and removed")
    return True


class Guard:
    """Teardown registered before creation: an atexit hook and signal handlers around `up`.

    A signal asks the running Pulumi CLI to stop (SIGINT: it finishes in-flight
    operations and saves the state) and raises `Interrupted` in the main thread,
    so `up` unwinds into the teardown. A further signal while unwinding only
    repeats the request (the CLI then stops hard); one during teardown aborts it.
    The atexit hook tears down when the process ends with the guard still armed.
    """

    SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)

    def __init__(self, ws: Workspace, stack: str, run_teardown: Callable[[], bool]):
        self.ws = ws
        self.stack = stack
        self._run_teardown = run_teardown
        self._previous: dict[int, Any] = {}
        self.armed = False
        self._raised = False
        self._in_teardown = False

    def arm(self) -> None:
        atexit.register(self._at_exit)
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        self.armed = True

    def disarm(self) -> None:
        atexit.unregister(self._at_exit)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self.armed = False

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.ws.interrupt()
        if not self._raised or self._in_teardown:
            self._raised = True
            raise Interrupted(signum)

    def _at_exit(self) -> None:
        if self.armed:
            self.teardown()

    def teardown(self) -> bool:
        self._in_teardown = True
        try:
            return self._run_teardown()
        finally:
            self.disarm()


# --------------------------------------------------------------------------- the commands


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def up(
    *,
    template: str = DEFAULT_TEMPLATE,
    owner: str | None = None,
    ttl_hours: float = DEFAULT_TTL_HOURS,
    efa: Optional[bool] = None,
    keep_on_failure: bool = False,
    backend: str | None = None,
    state_dir: Path = STATE_DIR,
    root: Path = REPO_ROOT,
    env: Mapping[str, str] | None = None,
    now: dt.datetime | None = None,
    workspace_factory: Callable[[str], Workspace] | None = None,
    log: Log | None = None,
) -> int:
    """Create a new ephemeral stack from `template` and deploy it; on failure tear it down. The exit code."""
    env = os.environ if env is None else env
    log = log or _stderr
    backend = resolve_backend(backend, env, root)
    require_passphrase(backend, env)
    name = stack_name(env)
    started = now or _now()
    expiry = expires_at(started, ttl_hours)
    tag_owner = owner_tag(owner, env)
    config, notes = ephemeral_config(template, stack=name, owner=tag_owner, expiry=expiry, efa=efa, root=root, env=env)
    ws = (workspace_factory or make_workspace)(backend)  # no Pulumi CLI: a UserError here, nothing created yet

    state = State(
        stack=name, backend=backend, expiresAt=expiry, template=template, owner=tag_owner,
        createdAt=started.astimezone(dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ"),
        pid=os.getpid(), host=socket.gethostname(), workDir=str(root),
        config={k: v.value for k, v in config.items() if not v.secret},
    )
    path = state.save(state_dir)

    def run_teardown() -> bool:
        ok = teardown(ws, name, state=state, log=log)
        if ok:
            path.unlink(missing_ok=True)
        else:
            state.status = TEARDOWN_FAILED
            state.save(state_dir)
            log(f"teardown of {name} failed: the state is in {path}; retry with "
                f"`python -m infra ephemeral down --stack {name}`; the sweeper deletes what is tagged "
                f"expires-at {expiry} after that time")
        return ok

    guard = Guard(ws, name, run_teardown)
    guard.arm()
    log(f"ephemeral stack {name} from {stack_file_name(template)}: owner {tag_owner}, expires-at {expiry}, backend {backend}")
    if (env.get("GITHUB_RUN_ID") or "").isdigit():
        log(f"  GitHub Actions run {env['GITHUB_RUN_ID']}, attempt {env.get('GITHUB_RUN_ATTEMPT') or '1'}")
    for note in notes:
        log(f"  {note}")
    log(f"  state: {path} (teardown armed)")
    _github_output(env, stack=name, **{"expires-at": expiry})
    try:
        ws.set_config(name, config)
        outputs = ws.up(name)
    except (Interrupted, KeyboardInterrupt) as exc:
        log(f"up of {name}: {str(exc) or 'interrupted'}; tearing down")
        return _after_failure(guard, keep_on_failure, state, state_dir, log, EXIT_INTERRUPTED)
    except WorkspaceUnavailable as exc:
        log(f"error: {exc}")
        return _after_failure(guard, keep_on_failure, state, state_dir, log, EXIT_USAGE)
    except WorkspaceError as exc:
        log(f"up of {name} failed: {exc}")
        return _after_failure(guard, keep_on_failure, state, state_dir, log, EXIT_FAILED)
    except BaseException:
        # A bug: tear down anyway, keep the traceback.
        _after_failure(guard, keep_on_failure, state, state_dir, log, EXIT_FAILED)
        raise
    guard.disarm()
    state.status = UP
    state.save(state_dir)
    _report(log, name, outputs)
    log(f"{name} is up; `python -m infra ephemeral test` runs the checks, `python -m infra ephemeral down` removes it")
    return EXIT_OK


def _after_failure(guard: Guard, keep: bool, state: State, state_dir: Path, log: Log, code: int) -> int:
    if keep:
        guard.disarm()
        state.status = KEPT
        state.save(state_dir)
        log(f"--keep-on-failure: {state.stack} is kept for debugging; remove it with "
            f"`python -m infra ephemeral down --stack {state.stack}` (the sweeper deletes it after {state.expiresAt})")
        return code
    try:
        guard.teardown()
    except (Interrupted, KeyboardInterrupt):
        log(f"teardown of {state.stack} interrupted; run `python -m infra ephemeral down --stack {state.stack}`; "
            f"the sweeper deletes it after {state.expiresAt}")
        return EXIT_INTERRUPTED
    return code


_REPORTED = ("servingEndpoint", "servedModelName", "clusterName", "instanceType", "nodes", "hourlyCostUsd")


def _report(log: Log, stack: str, outputs: Mapping[str, Any]) -> None:
    for key in _REPORTED:
        if key in outputs:
            log(f"  {key}: {outputs[key]}")


def test(
    *,
    stack: str | None = None,
    state_dir: Path = STATE_DIR,
    env: Mapping[str, str] | None = None,
    workspace_factory: Callable[[str], Workspace] | None = None,
    log: Log | None = None,
) -> int:
    """Run the post-deploy checks on a stack `up` made: the serving benchmark Job (and the EFA check from bring-up)."""
    env = os.environ if env is None else env
    log = log or _stderr
    state = find_state(stack, state_dir)
    if state is None:
        where = f"for {stack} " if stack else ""
        raise UserError(f"no ephemeral stack {where}is recorded in {state_dir}; run `python -m infra ephemeral up` first")
    if state.status not in (UP, TESTED, TEST_FAILED):
        raise UserError(f"{state.stack} is not up (status {state.status!r} in {state.path(state_dir)}); nothing to test")
    require_passphrase(state.backend, env)
    checks = json.loads(state.config.get(CHECKS_KEY) or "{}")
    checks["benchmark"] = True
    item = {CHECKS_KEY: ConfigItem(json.dumps(checks))}
    cfg = program_config(state.stack, {**{k: ConfigItem(v) for k, v in state.config.items()}, **item}, source=f"ephemeral stack {state.stack}")
    ws = (workspace_factory or make_workspace)(state.backend)
    ran = (["EFA check (ran at bring-up)"] if checks.get("efa") else []) + [
        f"serving benchmark (p99 TTFT < {cfg.checks.ttft_p99_ms:g} ms, p99 TPOT < {cfg.checks.tpot_p99_ms:g} ms)"
    ]
    log(f"testing {state.stack}: {CHECKS_KEY}.benchmark on, then `up` so the benchmark Job runs; pulumi waits for it and fails if it fails")
    try:
        ws.set_config(state.stack, item)
        outputs = ws.up(state.stack)
    except (Interrupted, KeyboardInterrupt):
        log(f"test of {state.stack} interrupted; the stack is still up: `python -m infra ephemeral down` removes it")
        return EXIT_INTERRUPTED
    except WorkspaceError as exc:
        state.config[CHECKS_KEY] = item[CHECKS_KEY].value
        state.status = TEST_FAILED
        state.save(state_dir)
        log(f"test of {state.stack} failed: {exc}")
        log("the stack is still up: `python -m infra ephemeral down` removes it")
        return EXIT_FAILED
    state.config[CHECKS_KEY] = item[CHECKS_KEY].value
    state.status = TESTED
    state.save(state_dir)
    for check in ran:
        log(f"  passed: {check}")
    _report(log, state.stack, outputs)
    return EXIT_OK


def down(
    *,
    stack: str | None = None,
    backend: str | None = None,
    force_unlock: bool = False,
    state_dir: Path = STATE_DIR,
    root: Path = REPO_ROOT,
    env: Mapping[str, str] | None = None,
    workspace_factory: Callable[[str], Workspace] | None = None,
    log: Log | None = None,
) -> int:
    """Destroy and remove the recorded ephemeral stack (or `stack`); delete its state file."""
    env = os.environ if env is None else env
    log = log or _stderr
    state = find_state(stack, state_dir)
    if state is None and not stack:
        log(f"no ephemeral stack is recorded in {state_dir}: nothing to tear down")
        return EXIT_OK
    name = state.stack if state is not None else str(stack)
    if not name.startswith(NAME_PREFIX):
        raise UserError(f"{name!r} is not an ephemeral stack (their names start with {NAME_PREFIX!r}); `down` removes only those")
    where = backend or (state.backend if state is not None else resolve_backend(None, env, root))
    require_passphrase(where, env)
    ws = (workspace_factory or make_workspace)(where)
    try:
        ok = teardown(ws, name, state=state, log=log, force_unlock=force_unlock)
    except (Interrupted, KeyboardInterrupt):
        log(f"teardown of {name} interrupted; run `python -m infra ephemeral down --stack {name}` again")
        return EXIT_INTERRUPTED
    path = Path(state_dir) / f"{name}.json"
    if ok:
        path.unlink(missing_ok=True)
        return EXIT_OK
    if state is not None:
        state.status = TEARDOWN_FAILED
        state.save(state_dir)
    expiry = f" after {state.expiresAt}" if state is not None else " once it has expired"
    log(f"teardown of {name} failed; run `down` again, or the sweeper deletes what is tagged with it{expiry}")
    return EXIT_FAILED


# --------------------------------------------------------------------------- command line

cli = typer.Typer(
    name="ephemeral",
    add_completion=False,
    no_args_is_help=True,
    help="Short-lived test stacks (Pulumi Automation API): up, test, down.",
)

_STATE_DIR_HELP = "Where state files live (one per stack)."


def _run(fn: Callable[[], int]) -> None:
    try:
        code = fn()
    except UserError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        _stderr("error: " + ("; ".join(lines) if lines else str(err)))
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(code)


@cli.command("up")
def up_command(
    template: str = typer.Option(DEFAULT_TEMPLATE, "--from", help="Copy the config of Pulumi.<STACK>.yaml (not a production stack)."),
    owner: Optional[str] = typer.Option(None, help="The owner tag (default: $GITHUB_ACTOR, else your user name)."),
    ttl: float = typer.Option(DEFAULT_TTL_HOURS, "--ttl", help="Hours until expires-at; the sweeper deletes what is left after that."),
    efa: Optional[bool] = typer.Option(None, "--efa/--no-efa", help="Run the EFA check at bring-up (default: when the instance type has EFA and there are 2+ nodes)."),
    keep_on_failure: bool = typer.Option(False, "--keep-on-failure", help="Keep a stack whose up failed, for debugging (no teardown)."),
    backend: Optional[str] = typer.Option(None, help="State backend URL (default: $PULUMI_BACKEND_URL, else Pulumi.yaml's)."),
    state_dir: Path = typer.Option(STATE_DIR, "--state-dir", help=_STATE_DIR_HELP),
) -> None:
    """Create a unique stack from a small stack file and deploy it; a failed up tears it down."""
    _run(lambda: up(template=template, owner=owner, ttl_hours=ttl, efa=efa, keep_on_failure=keep_on_failure,
                    backend=backend, state_dir=state_dir))


@cli.command("test")
def test_command(
    stack: Optional[str] = typer.Option(None, help="The stack (default: the one recorded in --state-dir)."),
    state_dir: Path = typer.Option(STATE_DIR, "--state-dir", help=_STATE_DIR_HELP),
) -> None:
    """Run the post-deploy checks: switch the serving benchmark on and up again (the Job must pass)."""
    _run(lambda: test(stack=stack, state_dir=state_dir))


@cli.command("down")
def down_command(
    stack: Optional[str] = typer.Option(None, help="The stack (default: the one recorded in --state-dir)."),
    backend: Optional[str] = typer.Option(None, help="State backend URL (default: the state file's, else $PULUMI_BACKEND_URL)."),
    force_unlock: bool = typer.Option(False, "--force-unlock", help="Cancel a lock held by an update that is not running."),
    state_dir: Path = typer.Option(STATE_DIR, "--state-dir", help=_STATE_DIR_HELP),
) -> None:
    """Destroy and remove the ephemeral stack, then delete its state file."""
    _run(lambda: down(stack=stack, backend=backend, force_unlock=force_unlock, state_dir=state_dir))
