"""Ephemeral test stacks (`infra/ops/ephemeral/`, `python -m infra ephemeral up|test|down`).

The orchestration runs against a fake `Workspace` that records every call and
fails on demand; the real `PulumiWorkspace` is checked without the Pulumi CLI
(a clear error, no traceback) and against a stand-in `pulumi` executable that
records the commands the Automation API runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import runpy
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.ops import ephemeral
from infra.ops.ephemeral import commands, workspace
from infra.cli.app import app
from infra.config import PROJECT, REPO_ROOT, from_mapping, read_stack_file
from infra.ops.ephemeral import (
    CHECKS_KEY,
    DESTROY_ATTEMPTS,
    HF_TOKEN_KEY,
    LIFECYCLE_KEY,
    ConfigItem,
    Guard,
    PulumiWorkspace,
    StackLocked,
    StackNotFound,
    State,
    WorkspaceError,
    WorkspaceUnavailable,
)
from infra.errors import UserError
from infra.aws.tags import EXPIRES_TAG, LIFECYCLE_TAG, OWNER_TAG, STACK_TAG, default_tags
from tests import yaml_text

NOW = dt.datetime(2026, 12, 2, 9, 30, 15, 123456, tzinfo=dt.timezone.utc)
DEPLOYER = ("198.51.100.7/32",)  # the runner's egress address, as the workflow reads it
ENV = {"PULUMI_CONFIG_PASSPHRASE": "correct horse", "GITHUB_ACTOR": "octocat"}
OUTPUTS = {"servingEndpoint": "http://vllm-api.gpu-serving.svc.cluster.local:8000/v1", "kubeconfig": "[secret]"}


# --------------------------------------------------------------------------- the fake


class Calls(list):
    """This workspace's calls, also appended to the factory's log of every workspace's calls."""

    def __init__(self, shared: list | None):
        super().__init__()
        self.shared = shared

    def append(self, item):
        super().append(item)
        if self.shared is not None:
            self.shared.append(item)


class FakeWorkspace:
    """Records calls; `fail_up`, `destroy_failures`, `locked`, `missing` make it fail on demand."""

    def __init__(self, backend: str, *, fail_up: bool = False, fail_test: bool = False, destroy_failures: int = 0,
                 locked: int = 0, missing: bool = False, on_up=None, log: list | None = None):
        self.backend = backend
        self.fail_up = fail_up
        self.fail_test = fail_test
        self.destroy_failures = destroy_failures
        self.locked = locked
        self.missing = missing
        self.on_up = on_up
        self.calls = Calls(log)
        self.config: dict[str, dict[str, ConfigItem]] = {}

    def set_config(self, stack, values):
        self.calls.append(("set_config", stack, dict(values)))
        self.config.setdefault(stack, {}).update(values)

    def up(self, stack):
        self.calls.append(("up", stack))
        if self.on_up:
            self.on_up(self, stack)
        ups = sum(1 for c in self.calls if c[0] == "up")
        if self.fail_up or (self.fail_test and ups > 1):
            raise WorkspaceError(f"up {stack} failed:\nerror: creating EKS Node Group: InsufficientInstanceCapacity")
        return dict(OUTPUTS)

    def destroy(self, stack):
        self.calls.append(("destroy", stack))
        if self.missing:
            raise StackNotFound(f"destroy {stack}: no such stack")
        if self.locked:
            self.locked -= 1
            raise StackLocked(f"destroy {stack}: the stack is locked by another update")
        if self.destroy_failures:
            self.destroy_failures -= 1
            raise WorkspaceError(f"destroy {stack} failed:\nerror: DependencyViolation: the VPC has dependencies")

    def remove(self, stack):
        self.calls.append(("remove", stack))

    def cancel(self, stack):
        self.calls.append(("cancel", stack))

    def interrupt(self):
        self.calls.append(("interrupt",))

    def ops(self):
        return [c[0] for c in self.calls]


class Factory:
    """`workspace_factory`: makes FakeWorkspaces with the given behaviour and keeps them."""

    def __init__(self, **behaviour):
        self.behaviour = behaviour
        self.made: list[FakeWorkspace] = []
        self.log: list[tuple] = []

    def __call__(self, backend):
        ws = FakeWorkspace(backend, log=self.log, **self.behaviour)
        self.made.append(ws)
        return ws

    @property
    def ws(self) -> FakeWorkspace:
        assert self.made, "no workspace was made"
        return self.made[-1]


@pytest.fixture
def state_dir(tmp_path) -> Path:
    return tmp_path / "state"


def run_up(state_dir, factory, env=ENV, **kw):
    logs: list[str] = []
    kw.setdefault("now", NOW)
    kw.setdefault("deployer_cidrs", DEPLOYER)  # where `up` runs from (the test stack's endpoint is private-ssm)
    code = ephemeral.up(state_dir=state_dir, env=dict(env), workspace_factory=factory, log=logs.append, **kw)
    return code, "\n".join(logs)


def decode(config: dict[str, ConfigItem]) -> tuple[dict, str | None]:
    """The config as the program reads it: areas JSON-decoded (pulumi.Config.get_object), the region as given."""
    areas = {k.split(":", 1)[1]: json.loads(v.value) for k, v in config.items()
             if k.startswith(PROJECT + ":") and not v.secret}
    region = config["aws:region"].value if "aws:region" in config else None
    return areas, region


def parse_utc(text: str) -> dt.datetime:
    assert text.endswith("Z"), text
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


# --------------------------------------------------------------------------- up


def test_up_creates_one_unique_stack_from_the_test_stack_file(state_dir):
    factory = Factory()
    code, out = run_up(state_dir, factory)
    assert code == 0, out
    ws = factory.ws
    assert ws.ops() == ["set_config", "up"]
    name = ws.calls[0][1]
    assert name.startswith("eph-") and ws.calls[1][1] == name
    assert ws.backend == "file://~"  # Pulumi.yaml's local file backend

    config = ws.config[name]
    template = read_stack_file("test")
    assert set(config) == set(template)  # same keys, nothing dropped, nothing invented
    for key, value in template.items():
        if key in (LIFECYCLE_KEY,):
            continue
        got = config[key].value
        if key == f"{PROJECT}:cluster":  # the way in: the template's keys, the endpoint opened to the deployer only
            value = {**value, "endpointAccess": "public-restricted", "deployerCidrs": list(DEPLOYER)}
        assert (got if isinstance(value, str) else json.loads(got)) == value, key
        assert not config[key].secret

    lifecycle = json.loads(config[LIFECYCLE_KEY].value)
    assert lifecycle["production"] is False
    assert lifecycle["owner"] == "octocat"
    assert parse_utc(lifecycle["expiresAt"]) - NOW.replace(microsecond=0) == dt.timedelta(hours=6)
    assert lifecycle["expiresAt"] == "2026-12-02T15:30:15Z"

    state = State.load(state_dir / f"{name}.json")
    assert (state.stack, state.status, state.backend, state.expiresAt) == (name, "up", "file://~", lifecycle["expiresAt"])
    assert name in out and "expires-at 2026-12-02T15:30:15Z" in out and OUTPUTS["servingEndpoint"] in out


def test_the_expiry_is_what_the_default_tags_carry(state_dir):
    factory = Factory()
    before = dt.datetime.now(dt.timezone.utc)
    code, out = run_up(state_dir, factory, now=None, ttl_hours=3)
    assert code == 0, out
    name, config = next(iter(factory.ws.config.items()))
    areas, region = decode(config)
    cfg = from_mapping(name, areas, region=region)  # what the program validates
    expiry = parse_utc(cfg.lifecycle.expires_at)
    assert dt.timedelta(hours=3) - dt.timedelta(seconds=2) <= expiry - before <= dt.timedelta(hours=3, minutes=1)
    life = cfg.lifecycle
    tags = default_tags(project=PROJECT, stack=name, owner=life.owner, production=life.production, expires_at=life.expires_at)
    assert tags[EXPIRES_TAG] == cfg.lifecycle.expires_at == State.load(state_dir / f"{name}.json").expiresAt
    assert tags[LIFECYCLE_TAG] == "ephemeral" and tags[OWNER_TAG] == "octocat" and tags[STACK_TAG] == name


def test_ephemeral_up_needs_a_way_in_that_works_in_one_pulumi_up(state_dir):
    # The test stack's private-ssm needs its tunnel opened between two `pulumi up` runs: refused before anything.
    factory = Factory()
    with pytest.raises(UserError) as info:
        run_up(state_dir, factory, deployer_cidrs=())
    assert "pass --deployer-cidr" in str(info.value) and "private-ssm" in str(info.value)
    assert factory.made == [] and not state_dir.exists()
    # With the runner's address: public-restricted to it, and the program builds that cluster.
    config, notes = ephemeral.ephemeral_config("test", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z",
                                               deployer_cidrs=("203.0.113.9/32",), env={})  # fmt: skip
    cluster = json.loads(config[f"{PROJECT}:cluster"].value)
    assert cluster["endpointAccess"] == "public-restricted" and cluster["deployerCidrs"] == ["203.0.113.9/32"]
    assert any("open to 203.0.113.9/32 only" in n for n in notes)


def test_the_generated_config_runs_the_real_program_and_tags_every_resource_with_the_expiry():
    """Offline, under the recording engine: the AWS provider's default tags carry the new expiry."""
    from infra.preview.recording import record
    from infra.preview.synth import document

    name = ephemeral.stack_name({"GITHUB_RUN_ID": "21345678901", "GITHUB_RUN_ATTEMPT": "2"})
    expiry = ephemeral.expires_at(NOW, 6)
    config, _ = ephemeral.ephemeral_config("test", stack=name, owner="octocat", expiry=expiry, deployer_cidrs=DEPLOYER, env={})
    engine = {k: v.value for k, v in config.items()}  # what the CLI hands the program (JSON strings)

    def program() -> None:
        runpy.run_path(str(REPO_ROOT), run_name="__main__")

    with contextlib.chdir(REPO_ROOT):
        doc = document(record(program, project=PROJECT, stack=name, config=engine), PROJECT, name)
    providers = [r for r in doc["resources"] if r["type"] == "pulumi:providers:aws"]
    assert providers, "no AWS provider"
    for provider in providers:
        tags = json.loads(provider["inputs"]["defaultTags"])["tags"]
        assert tags[EXPIRES_TAG] == expiry and tags[LIFECYCLE_TAG] == "ephemeral" and tags[STACK_TAG] == name
    # Every AWS resource is created through that provider, so every one carries the tags.
    aws = [r for r in doc["resources"] if r["custom"] and r["type"].startswith("aws:")]
    assert aws and {r["options"].get("provider") for r in aws} == {p["name"] for p in providers}
    # The stack name goes into every resource name: the cluster's stays well inside EKS's 100 characters.
    assert doc["outputs"]["clusterName"] == f"gpu-serving-{name}"


class AtexitSpy:
    """Stands in for the atexit module the guard uses: which hooks are registered now."""

    def __init__(self):
        self.live: list = []

    def register(self, fn):
        self.live.append(fn)

    def unregister(self, fn):
        self.live = [f for f in self.live if f != fn]


def test_teardown_is_registered_before_up_runs(state_dir, monkeypatch):
    seen = {}
    spy = AtexitSpy()
    monkeypatch.setattr(commands, "atexit", spy)
    previous = signal.getsignal(signal.SIGTERM)

    def on_up(ws, stack):
        path = state_dir / f"{stack}.json"
        seen["state_exists"] = path.is_file()
        seen["state"] = json.loads(path.read_text())
        seen["sigterm"] = isinstance(getattr(signal.getsignal(signal.SIGTERM), "__self__", None), Guard)
        seen["sigint"] = isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), Guard)
        seen["atexit"] = [getattr(f, "__self__", None) for f in spy.live]

    factory = Factory(on_up=on_up)
    code, out = run_up(state_dir, factory)
    assert code == 0, out
    assert seen["state_exists"] is True
    assert seen["state"]["stack"] == factory.ws.calls[0][1]
    assert seen["state"]["status"] == "creating"
    assert seen["state"]["backend"] == "file://~" and seen["state"]["expiresAt"] == "2026-12-02T15:30:15Z"
    assert seen["sigterm"] and seen["sigint"]
    assert len(seen["atexit"]) == 1 and isinstance(seen["atexit"][0], Guard)
    assert spy.live == []  # disarmed after a successful up
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_failing_up_destroys_and_removes_then_exits_non_zero(state_dir):
    factory = Factory(fail_up=True)
    previous = signal.getsignal(signal.SIGTERM)
    code, out = run_up(state_dir, factory)
    assert code == 1
    name = factory.ws.calls[0][1]
    assert factory.ws.ops() == ["set_config", "up", "destroy", "remove"]
    assert all(c[1] == name for c in factory.ws.calls)
    assert "InsufficientInstanceCapacity" in out and f"{name} destroyed and removed" in out
    assert not (state_dir / f"{name}.json").exists()
    assert signal.getsignal(signal.SIGTERM) == previous


def test_keep_on_failure_skips_the_teardown(state_dir):
    factory = Factory(fail_up=True)
    code, out = run_up(state_dir, factory, keep_on_failure=True)
    assert code == 1
    assert factory.ws.ops() == ["set_config", "up"]
    name = factory.ws.calls[0][1]
    assert State.load(state_dir / f"{name}.json").status == "kept"
    assert f"down --stack {name}" in out


def test_an_interrupted_up_tears_down(state_dir):
    def on_up(ws, stack):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this returns
        raise AssertionError("the signal did not interrupt up")

    factory = Factory(on_up=on_up)
    previous = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    code, out = run_up(state_dir, factory)
    assert time.monotonic() - started < 4
    assert code == 130
    assert factory.ws.ops() == ["set_config", "up", "interrupt", "destroy", "remove"]
    assert "SIGTERM" in out
    assert not list(state_dir.glob("*.json"))
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_teardown_that_keeps_failing_leaves_the_state_for_down(state_dir):
    factory = Factory(fail_up=True, destroy_failures=99)
    code, out = run_up(state_dir, factory)
    assert code == 1
    assert factory.ws.ops() == ["set_config", "up"] + ["destroy"] * DESTROY_ATTEMPTS  # never removed while resources remain
    name = factory.ws.calls[0][1]
    state = State.load(state_dir / f"{name}.json")
    assert state.status == "teardown-failed"
    assert "DependencyViolation" in out and f"down --stack {name}" in out and state.expiresAt in out


def test_a_destroy_that_fails_once_is_retried(state_dir):
    factory = Factory(fail_up=True, destroy_failures=1)
    code, _ = run_up(state_dir, factory)
    assert code == 1
    assert factory.ws.ops() == ["set_config", "up", "destroy", "destroy", "remove"]
    assert not list(state_dir.glob("*.json"))


def test_the_atexit_hook_tears_down_an_armed_guard():
    ws = FakeWorkspace("file://~")
    ran = []
    guard = Guard(ws, "eph-x", lambda: ran.append(True) or True)
    guard.arm()
    try:
        guard._at_exit()
    finally:
        guard.disarm()
    assert ran == [True] and not guard.armed
    guard._at_exit()  # disarmed: nothing more
    assert ran == [True]


def test_a_production_template_is_refused(state_dir):
    factory = Factory()
    with pytest.raises(UserError, match=r"Pulumi.prod.yaml is a production stack.*Pulumi.test.yaml"):
        run_up(state_dir, factory, template="prod")
    assert factory.made == [] and not state_dir.exists()


@pytest.mark.parametrize("env", [{}, {"PULUMI_CONFIG_PASSPHRASE": ""}], ids=["unset", "empty"])
def test_a_missing_passphrase_is_a_clear_error(state_dir, env):
    factory = Factory()
    with pytest.raises(UserError) as info:
        run_up(state_dir, factory, env=env)
    message = str(info.value)
    assert "PULUMI_CONFIG_PASSPHRASE" in message and "file://~" in message and "export" in message
    assert factory.made == [] and not state_dir.exists()


def test_a_service_backend_needs_no_passphrase(state_dir):
    factory = Factory()
    code, _ = run_up(state_dir, factory, env={"PULUMI_BACKEND_URL": "https://api.pulumi.com", "GITHUB_ACTOR": "a"})
    assert code == 0 and factory.ws.backend == "https://api.pulumi.com"


def test_the_backend_comes_from_the_flag_then_the_environment(state_dir):
    factory = Factory()
    run_up(state_dir, factory, env={**ENV, "PULUMI_BACKEND_URL": "s3://state-bucket"})
    assert factory.ws.backend == "s3://state-bucket"
    run_up(state_dir, factory, env={**ENV, "PULUMI_BACKEND_URL": "s3://state-bucket"}, backend="file:///tmp/x")
    assert factory.ws.backend == "file:///tmp/x"


def test_two_runs_get_different_stack_names(state_dir):
    factory = Factory()
    run_up(state_dir, factory)
    run_up(state_dir, factory)
    names = [ws.calls[0][1] for ws in factory.made]
    assert len(set(names)) == 2
    assert {p.stem for p in state_dir.glob("*.json")} == set(names)


def test_stack_names_in_github_actions_follow_the_run_and_attempt():
    one = ephemeral.stack_name({"GITHUB_RUN_ID": "21345678901", "GITHUB_RUN_ATTEMPT": "1"})
    again = ephemeral.stack_name({"GITHUB_RUN_ID": "21345678901", "GITHUB_RUN_ATTEMPT": "2"})
    other = ephemeral.stack_name({"GITHUB_RUN_ID": "21345678902", "GITHUB_RUN_ATTEMPT": "1"})
    assert len({one, again, other}) == 3
    prefix, run36, attempt = one.split("-")
    assert prefix == "eph" and int(run36, 36) == 21345678901 and attempt == "1"
    assert len(one) <= 16  # goes into IAM role names (64 characters with Pulumi's suffix)
    assert ephemeral.stack_name({}) != ephemeral.stack_name({})
    assert ephemeral.stack_name({}, token=lambda n: "ab" * n) == "eph-abababab"


def test_the_owner_comes_from_the_flag_then_github_and_is_a_valid_tag_value():
    assert ephemeral.owner_tag("alice", {"GITHUB_ACTOR": "octocat"}) == "alice"
    assert ephemeral.owner_tag(None, {"GITHUB_ACTOR": "octocat"}) == "octocat"
    assert ephemeral.owner_tag(None, {"GITHUB_ACTOR": "dependabot[bot]"}) == "dependabot-bot"
    assert ephemeral.owner_tag(None, {}) != ""  # the local user
    with pytest.raises(UserError, match="--owner"):
        ephemeral.owner_tag("[]", {})


def test_ttl_is_hours_and_bounded():
    assert ephemeral.expires_at(NOW, 0.5) == "2026-12-02T10:00:15Z"
    assert ephemeral.expires_at(NOW.astimezone(dt.timezone(dt.timedelta(hours=-5))), 1) == "2026-12-02T10:30:15Z"
    for bad in (0, -1, 24 * 365):
        with pytest.raises(UserError, match="--ttl"):
            ephemeral.expires_at(NOW, bad)


def _template(root: Path, name: str, **changes) -> None:
    doc = yaml_text.safe_load((REPO_ROOT / "Pulumi.test.yaml").read_text())
    for key, value in changes.items():
        doc["config"][key] = value
    (root / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(doc))


def test_the_efa_check_runs_at_bring_up_only_where_it_can(tmp_path):
    # test: 1 x g6e.xlarge, no EFA check
    config, notes = ephemeral.ephemeral_config("test", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z", deployer_cidrs=DEPLOYER, env={})
    assert CHECKS_KEY not in config and any("EFA check: off" in n for n in notes)
    with pytest.raises(UserError, match="--efa"):
        ephemeral.ephemeral_config("test", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z", efa=True, deployer_cidrs=DEPLOYER, env={})
    # two EFA nodes: on by default, off on request; the template's other check settings are kept
    _template(tmp_path, "pair", **{f"{PROJECT}:gpu": {"instanceType": "p5.48xlarge", "nodes": 2},
                                   CHECKS_KEY: {"ncclBusBandwidthFloorGbps": 50}})
    config, _ = ephemeral.ephemeral_config("pair", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z", root=tmp_path, deployer_cidrs=DEPLOYER, env={})
    assert json.loads(config[CHECKS_KEY].value) == {"ncclBusBandwidthFloorGbps": 50, "efa": True}
    config, _ = ephemeral.ephemeral_config("pair", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z", efa=False, root=tmp_path, deployer_cidrs=DEPLOYER, env={})
    assert json.loads(config[CHECKS_KEY].value) == {"ncclBusBandwidthFloorGbps": 50, "efa": False}


def test_template_secrets_are_not_copied_and_hf_token_comes_from_the_environment(tmp_path):
    _template(tmp_path, "gated", **{HF_TOKEN_KEY: {"secure": "v1:abc:def"}})
    config, notes = ephemeral.ephemeral_config("gated", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z", root=tmp_path, deployer_cidrs=DEPLOYER, env={})
    assert HF_TOKEN_KEY not in config and any("not copied" in n for n in notes)
    config, _ = ephemeral.ephemeral_config("gated", stack="eph-a", owner="o", expiry="2026-12-02T15:00:00Z", root=tmp_path, deployer_cidrs=DEPLOYER,
                                           env={"HF_TOKEN": "hf_x"})
    assert config[HF_TOKEN_KEY] == ConfigItem("hf_x", secret=True)


def test_the_secret_never_reaches_the_state_file(state_dir):
    factory = Factory()
    code, _ = run_up(state_dir, factory, env={**ENV, "HF_TOKEN": "hf_very_secret"})
    assert code == 0
    name = factory.ws.calls[0][1]
    assert factory.ws.config[name][HF_TOKEN_KEY].secret
    assert "hf_very_secret" not in (state_dir / f"{name}.json").read_text()


def test_up_writes_the_stack_name_for_later_workflow_steps(state_dir, tmp_path):
    out = tmp_path / "github_output"
    factory = Factory()
    run_up(state_dir, factory, env={**ENV, "GITHUB_OUTPUT": str(out), "GITHUB_RUN_ID": "100", "GITHUB_RUN_ATTEMPT": "1"})
    assert out.read_text().splitlines() == ["stack=eph-2s-1", "expires-at=2026-12-02T15:30:15Z"]


# --------------------------------------------------------------------------- test


def test_test_switches_the_benchmark_on_and_runs_up_again(state_dir):
    factory = Factory()
    assert run_up(state_dir, factory)[0] == 0
    name = factory.ws.calls[0][1]
    logs: list[str] = []
    code = ephemeral.test(state_dir=state_dir, env=ENV, workspace_factory=factory, log=logs.append)
    assert code == 0, logs
    ws = factory.ws
    assert ws.ops() == ["set_config", "up"]
    (_, stack, values), _ = ws.calls
    assert stack == name and set(values) == {CHECKS_KEY}
    assert json.loads(values[CHECKS_KEY].value) == {"benchmark": True}
    state = State.load(state_dir / f"{name}.json")
    assert state.status == "tested" and json.loads(state.config[CHECKS_KEY]) == {"benchmark": True}
    assert any("passed: serving benchmark" in line for line in logs)


def test_test_reports_the_thresholds_of_the_stack_config(state_dir):
    factory = Factory()
    assert run_up(state_dir, factory)[0] == 0
    path = state_dir / f"{factory.ws.calls[0][1]}.json"
    state = State.load(path)
    serving = json.loads(state.config.get(f"{PROJECT}:serving", "{}"))
    state.config[f"{PROJECT}:serving"] = json.dumps({**serving, "sla": {"ttftP99Ms": 512, "tpotP99Ms": 64}})
    state.save(state_dir)
    logs: list[str] = []
    assert ephemeral.test(state_dir=state_dir, env=ENV, workspace_factory=factory, log=logs.append) == 0, logs
    assert any("p99 TTFT < 512 ms, p99 TPOT < 64 ms" in line for line in logs), logs


def test_a_failing_test_exits_non_zero_and_leaves_the_stack_for_down(state_dir):
    factory = Factory(fail_up=False)
    run_up(state_dir, factory)
    failing = Factory(fail_up=True)
    logs: list[str] = []
    code = ephemeral.test(state_dir=state_dir, env=ENV, workspace_factory=failing, log=logs.append)
    assert code == 1
    assert failing.ws.ops() == ["set_config", "up"]  # no teardown: `down` does that
    assert State.load(next(state_dir.glob("*.json"))).status == "test-failed"


def test_test_needs_a_stack_that_is_up(state_dir):
    with pytest.raises(UserError, match="ephemeral up"):
        ephemeral.test(state_dir=state_dir, env=ENV, workspace_factory=Factory())
    factory = Factory(fail_up=True)
    run_up(state_dir, factory, keep_on_failure=True)
    with pytest.raises(UserError, match="not up"):
        ephemeral.test(state_dir=state_dir, env=ENV, workspace_factory=Factory())


# --------------------------------------------------------------------------- down


def test_down_destroys_and_removes_the_recorded_stack(state_dir):
    factory = Factory()
    run_up(state_dir, factory)
    name = factory.ws.calls[0][1]
    logs: list[str] = []
    code = ephemeral.down(state_dir=state_dir, env={**ENV, "PULUMI_BACKEND_URL": "s3://elsewhere"},
                          workspace_factory=factory, log=logs.append)
    assert code == 0, logs
    assert factory.ws.ops() == ["destroy", "remove"] and factory.ws.calls[0][1] == name
    assert factory.ws.backend == "file://~"  # the state file's backend, not today's environment
    assert not list(state_dir.glob("*.json"))


def test_down_by_name_without_a_state_file(state_dir):
    factory = Factory()
    code = ephemeral.down(stack="eph-deadbeef", state_dir=state_dir, env=ENV, workspace_factory=factory, log=lambda m: None)
    assert code == 0 and factory.ws.calls == [("destroy", "eph-deadbeef"), ("remove", "eph-deadbeef")]


def test_down_with_nothing_recorded_is_a_no_op(state_dir):
    factory = Factory()
    logs: list[str] = []
    assert ephemeral.down(state_dir=state_dir, env=ENV, workspace_factory=factory, log=logs.append) == 0
    assert factory.made == [] and "nothing to tear down" in logs[0]


def test_down_never_touches_a_stack_that_is_not_ephemeral(state_dir):
    with pytest.raises(UserError, match="not an ephemeral stack"):
        ephemeral.down(stack="prod", state_dir=state_dir, env=ENV, workspace_factory=Factory())


def test_down_with_several_recorded_stacks_asks_which(state_dir):
    factory = Factory()
    run_up(state_dir, factory)
    run_up(state_dir, factory)
    with pytest.raises(UserError, match="--stack"):
        ephemeral.down(state_dir=state_dir, env=ENV, workspace_factory=factory)


def test_down_of_a_stack_already_gone_succeeds(state_dir):
    factory = Factory()
    run_up(state_dir, factory)
    gone = Factory(missing=True)
    assert ephemeral.down(state_dir=state_dir, env=ENV, workspace_factory=gone, log=lambda m: None) == 0
    assert gone.ws.ops() == ["destroy"] and not list(state_dir.glob("*.json"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_down_cancels_the_lock_of_an_up_that_was_killed(state_dir):
    factory = Factory()
    run_up(state_dir, factory)
    path = next(state_dir.glob("*.json"))
    state = State.load(path)
    state.pid = _dead_pid()  # the runner killed `up` (a cancelled workflow)
    state.save(state_dir)
    locked = Factory(locked=1)
    assert ephemeral.down(state_dir=state_dir, env=ENV, workspace_factory=locked, log=lambda m: None) == 0
    assert locked.ws.ops() == ["destroy", "cancel", "destroy", "remove"]


def test_down_leaves_a_lock_held_by_a_live_process(state_dir):
    factory = Factory()
    run_up(state_dir, factory)
    path = next(state_dir.glob("*.json"))
    state = State.load(path)
    state.pid = os.getppid()  # still running
    state.save(state_dir)
    locked = Factory(locked=1)
    logs: list[str] = []
    assert ephemeral.down(state_dir=state_dir, env=ENV, workspace_factory=locked, log=logs.append) == 1
    assert locked.ws.ops() == ["destroy"]
    assert "--force-unlock" in "\n".join(logs)
    assert State.load(path).status == "teardown-failed"
    forced = Factory(locked=1)
    assert ephemeral.down(state_dir=state_dir, force_unlock=True, env=ENV, workspace_factory=forced, log=lambda m: None) == 0
    assert forced.ws.ops() == ["destroy", "cancel", "destroy", "remove"]


# --------------------------------------------------------------------------- the command line


@pytest.fixture
def cli_env(monkeypatch, state_dir):
    for name in ("GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_OUTPUT", "PULUMI_BACKEND_URL", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "correct horse")
    monkeypatch.setenv("GITHUB_ACTOR", "octocat")
    factory = Factory()
    monkeypatch.setattr(workspace, "make_workspace", factory)
    return factory


def invoke(*args):
    result = CliRunner().invoke(app, ["ephemeral", *args])
    assert "Traceback" not in result.output, result.output
    return result


def test_cli_up_test_down(cli_env, state_dir):
    sd = ["--state-dir", str(state_dir)]
    result = invoke("up", *sd, "--ttl", "2", "--deployer-cidr", DEPLOYER[0])
    assert result.exit_code == 0, result.output
    name = cli_env.ws.calls[0][1]
    assert f"ephemeral stack {name} from Pulumi.test.yaml: owner octocat" in result.output
    result = invoke("test", *sd)
    assert result.exit_code == 0, result.output
    assert "passed: serving benchmark" in result.output
    result = invoke("down", *sd)
    assert result.exit_code == 0, result.output
    assert f"{name} destroyed and removed" in result.output
    assert [c[0] for c in cli_env.log] == ["set_config", "up", "set_config", "up", "destroy", "remove"]


def test_cli_failing_up_exits_1_after_teardown(cli_env, state_dir, monkeypatch):
    monkeypatch.setattr(cli_env, "behaviour", {"fail_up": True})
    result = invoke("up", "--state-dir", str(state_dir), "--deployer-cidr", DEPLOYER[0])
    assert result.exit_code == 1
    assert "InsufficientInstanceCapacity" in result.output and "destroyed and removed" in result.output
    result = invoke("down", "--state-dir", str(state_dir))
    assert result.exit_code == 0 and "nothing to tear down" in result.output


def test_cli_usage_errors_exit_2_with_one_message(cli_env, state_dir, monkeypatch):
    result = invoke("up", "--from", "prod", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "error: Pulumi.prod.yaml is a production stack" in result.output
    result = invoke("up", "--from", "nosuch", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "no stack file Pulumi.nosuch.yaml" in result.output
    result = invoke("up", "--ttl", "0", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "--ttl" in result.output
    result = invoke("test", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "ephemeral up" in result.output
    result = invoke("down", "--stack", "prod", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "not an ephemeral stack" in result.output
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE")
    result = invoke("up", "--state-dir", str(state_dir))
    assert result.exit_code == 2 and "PULUMI_CONFIG_PASSPHRASE is not set" in result.output
    assert cli_env.made == []


def test_cli_help_lists_the_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("up", "test", "down"):
        assert command in result.output
    result = invoke("up", "--help")
    assert result.exit_code == 0
    for flag in ("--from", "--owner", "--ttl", "--keep-on-failure", "--efa", "--deployer-cidr", "--backend", "--state-dir"):
        assert flag in result.output


# --------------------------------------------------------------------------- the real workspace


def _env_without_pulumi(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PULUMI_BACKEND"))}
    env.update(PATH=str(empty), PULUMI_HOME=str(tmp_path / "no-pulumi-home"), PULUMI_CONFIG_PASSPHRASE="x")
    return env


def test_without_the_pulumi_cli_the_real_workspace_says_so(tmp_path):
    env = _env_without_pulumi(tmp_path)
    with pytest.raises(WorkspaceUnavailable, match="Pulumi CLI is not installed"):
        PulumiWorkspace("file://~", env=env)
    assert isinstance(WorkspaceUnavailable("x"), UserError)  # the CLI turns it into one line and exit 2


def test_without_the_pulumi_cli_the_command_fails_cleanly_and_creates_nothing(tmp_path):
    state_dir = tmp_path / "state"
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "ephemeral", "up", "--state-dir", str(state_dir), "--deployer-cidr", DEPLOYER[0]],
        cwd=REPO_ROOT, env=_env_without_pulumi(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "error: the Pulumi CLI is not installed" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not state_dir.exists()


FAKE_PULUMI = textwrap.dedent(
    '''\
    #!{python}
    """A stand-in `pulumi`: logs each call, keeps a list of stacks, answers like the CLI."""
    import json, os, sys
    args = sys.argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({{"args": args, "backend": os.environ.get("PULUMI_BACKEND_URL"), "cwd": os.getcwd()}}) + "\\n")
    stacks_file = os.path.join(here, "stacks.json")
    stacks = json.load(open(stacks_file)) if os.path.exists(stacks_file) else []
    words = [a for a in args if not a.startswith("--")]
    def stack_arg():
        return args[args.index("--stack") + 1] if "--stack" in args else words[-1]
    if words[:1] == ["version"]:
        print("v3.272.0")
    elif words[:2] == ["stack", "select"]:
        if stack_arg() not in stacks:
            sys.stderr.write(f"error: no stack named '{{stack_arg()}}' found\\n"); sys.exit(255)
    elif words[:2] == ["stack", "init"]:
        stacks.append(words[2]); json.dump(stacks, open(stacks_file, "w"))
    elif words[:2] == ["stack", "rm"]:
        stacks.remove(words[-1]); json.dump(stacks, open(stacks_file, "w"))
    elif words[:2] == ["stack", "output"]:
        secret = "apiVersion: v1" if "--show-secrets" in args else "[secret]"
        print(json.dumps({{"servingEndpoint": "http://vllm-api:8000/v1", "kubeconfig": secret}}))
    elif words[:2] == ["stack", "history"]:
        print(json.dumps([{{"kind": "update", "startTime": "2026-12-02T09:30:15.000Z", "message": "",
                            "environment": {{}}, "config": {{}}, "result": "succeeded"}}]))
    elif words[:1] == ["up"] and os.environ.get("FAKE_PULUMI_FAIL_UP"):
        print("Updating (stack)"); sys.stderr.write("error: update failed: InsufficientInstanceCapacity\\n"); sys.exit(255)
    elif words[:1] == ["destroy"] and os.path.exists(os.path.join(here, "locked")):
        os.remove(os.path.join(here, "locked"))
        sys.stderr.write("error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) "
                         "to end or delete the lock file with `pulumi cancel`.\\n"); sys.exit(255)
    '''
)


@pytest.fixture
def fake_cli(tmp_path, monkeypatch):
    bin_dir = tmp_path / "fake" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "pulumi"
    exe.write_text(FAKE_PULUMI.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_PULUMI_FAIL_UP", raising=False)

    def calls() -> list[list[str]]:
        path = bin_dir / "calls.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        assert all(r["backend"] == "file:///tmp/eph-state" for r in rows if r["args"] != ["version"])
        assert all(Path(r["cwd"]) == REPO_ROOT for r in rows if r["args"] != ["version"])
        return [[a for a in r["args"] if a != "--non-interactive"] for r in rows]

    return bin_dir, calls


def test_the_real_workspace_drives_the_pulumi_cli(fake_cli, state_dir, monkeypatch):
    """PulumiWorkspace through pulumi.automation, against a stand-in CLI: the commands and their order."""
    bin_dir, calls = fake_cli
    monkeypatch.setattr(workspace, "make_workspace", lambda backend: PulumiWorkspace(backend, log=lambda line: None))
    env = {**ENV, "PULUMI_BACKEND_URL": "file:///tmp/eph-state"}
    code, out = run_up(state_dir, None, env=env)
    assert code == 0, out
    name = next(state_dir.glob("*.json")).stem
    commands = [c for c in calls() if c != ["version"]]
    assert commands[0] == ["stack", "select", "--stack", name]
    assert commands[1] == ["stack", "init", name]
    setall = commands[2]
    assert setall[:4] == ["config", "set-all", "--stack", name]
    pairs = dict(setall[i + 1].split("=", 1) for i, a in enumerate(setall) if a == "--plaintext")
    assert json.loads(pairs[LIFECYCLE_KEY])["expiresAt"] == "2026-12-02T15:30:15Z"
    assert json.loads(pairs[f"{PROJECT}:gpu"]) == {"instanceType": "g6e.xlarge", "nodes": 1}
    assert commands[3] == ["stack", "select", "--stack", name]
    assert commands[4][:3] == ["up", "--yes", "--skip-preview"] and commands[4][commands[4].index("--stack") + 1] == name
    assert "http://vllm-api:8000/v1" in out

    assert ephemeral.down(state_dir=state_dir, env=env, log=lambda m: None) == 0
    tail = [c for c in calls() if c != ["version"]][len(commands):]
    destroy = next(c for c in tail if c[0] == "destroy")
    assert "--continue-on-error" in destroy and destroy[destroy.index("--stack") + 1] == name
    assert ["stack", "rm", "--yes", name] in tail
    assert not list(state_dir.glob("*.json"))


def test_the_real_workspace_reports_a_failed_up_and_cancels_a_stale_lock(fake_cli, state_dir, monkeypatch):
    bin_dir, calls = fake_cli
    monkeypatch.setattr(workspace, "make_workspace", lambda backend: PulumiWorkspace(backend, log=lambda line: None))
    monkeypatch.setenv("FAKE_PULUMI_FAIL_UP", "1")
    (bin_dir / "locked").write_text("")  # the first destroy finds the lock the failed up left
    code, out = run_up(state_dir, None, env={**ENV, "PULUMI_BACKEND_URL": "file:///tmp/eph-state"})
    assert code == 1
    assert "error: update failed: InsufficientInstanceCapacity" in out
    verbs = [c[0] if c[0] != "stack" else f"stack {c[1]}" for c in calls() if c != ["version"]]
    assert verbs.count("destroy") == 2 and "cancel" in verbs and verbs[-1] == "stack rm"
    assert not list(state_dir.glob("*.json"))
