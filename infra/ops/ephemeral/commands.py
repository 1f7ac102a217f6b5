"""The commands: `up`, `test` and `down` of an ephemeral stack, and the teardown guard.

    up    a new stack (naming.py), its config copied from the stack file with the
          lifecycle rewritten (config.py). Teardown is registered before anything
          is created: the state file (state.py) is written first, then an atexit
          hook and SIGINT/SIGTERM/SIGHUP handlers are armed (`Guard`), then the
          stack is created and `up` runs. A failed or interrupted `up` destroys
          and removes the stack before exiting non-zero (`--keep-on-failure`
          keeps it for debugging). The EFA check runs here, at bring-up, where
          it applies.
    test  switches the serving benchmark on (`gpu-serving:checks.benchmark`) and
          runs `up` again: pulumi-kubernetes waits for the benchmark Job, which
          fails when p99 TTFT or TPOT miss their thresholds, so a passing `up`
          is a passing check. The stack stays up; `down` removes it.
    down  destroys the stack named in the state file (or `--stack`), retrying
          once, then removes it from the backend and deletes the state file. A
          lock left by an `up` that was killed (its process is gone) is
          cancelled first.

Every Pulumi operation goes through a `Workspace` (workspace.py). Exit codes:
0 done, 1 a Pulumi operation failed, 2 a usage or config error (one message, no
traceback), 130 interrupted.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from infra.config import REPO_ROOT, stack_file_name
from infra.errors import UserError
from infra.ops.ephemeral import workspace
from infra.ops.ephemeral.config import CHECKS_KEY, DEFAULT_TEMPLATE, ephemeral_config, program_config
from infra.ops.ephemeral.naming import DEFAULT_TTL_HOURS, NAME_PREFIX, expires_at, owner_tag, stack_name
from infra.ops.ephemeral.state import KEPT, STATE_DIR, TEARDOWN_FAILED, TEST_FAILED, TESTED, UP, State, find_state, stale_lock
from infra.ops.ephemeral.workspace import (
    ConfigItem,
    Log,
    StackLocked,
    StackNotFound,
    Workspace,
    WorkspaceError,
    WorkspaceUnavailable,
    require_passphrase,
    resolve_backend,
    stderr,
)

DESTROY_ATTEMPTS = 2  # a second pass clears what the first left for ordering reasons (ENIs, finalizers)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Interrupted(BaseException):
    """A signal arrived (SIGINT, SIGTERM, SIGHUP). BaseException: library code must not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


# --------------------------------------------------------------------------- teardown


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
            if unlocked or not (force_unlock or stale_lock(state)):
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
    deployer_cidrs: tuple[str, ...] = (),
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
    log = log or stderr
    backend = resolve_backend(backend, env, root)
    require_passphrase(backend, env)
    name = stack_name(env)
    started = now or _now()
    expiry = expires_at(started, ttl_hours)
    tag_owner = owner_tag(owner, env)
    config, notes = ephemeral_config(template, stack=name, owner=tag_owner, expiry=expiry, efa=efa,
                                     deployer_cidrs=deployer_cidrs, root=root, env=env)  # fmt: skip
    ws = (workspace_factory or workspace.make_workspace)(backend)  # no Pulumi CLI: a UserError here, nothing created yet

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
    log = log or stderr
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
    ws = (workspace_factory or workspace.make_workspace)(state.backend)
    ran = (["EFA check (ran at bring-up)"] if checks.get("efa") else []) + [
        f"serving benchmark (p99 TTFT < {cfg.serving.sla.ttft_p99_ms:g} ms, p99 TPOT < {cfg.serving.sla.tpot_p99_ms:g} ms)"
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
    log = log or stderr
    state = find_state(stack, state_dir)
    if state is None and not stack:
        log(f"no ephemeral stack is recorded in {state_dir}: nothing to tear down")
        return EXIT_OK
    name = state.stack if state is not None else str(stack)
    if not name.startswith(NAME_PREFIX):
        raise UserError(f"{name!r} is not an ephemeral stack (their names start with {NAME_PREFIX!r}); `down` removes only those")
    where = backend or (state.backend if state is not None else resolve_backend(None, env, root))
    require_passphrase(where, env)
    ws = (workspace_factory or workspace.make_workspace)(where)
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


def _github_output(env: Mapping[str, str], **values: str) -> None:
    target = env.get("GITHUB_OUTPUT")
    if not target:
        return
    with contextlib.suppress(OSError), open(target, "a") as fh:
        for k, v in values.items():
            fh.write(f"{k}={v}\n")
