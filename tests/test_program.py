"""The real Pulumi program (`__main__.py`) under the mocked engine.

The program is run the way the Python language host runs it
(`runpy.run_path(<project dir>, run_name="__main__")`, inside the runtime's
program runner), with the stack's config passed as the CLI passes it (objects
JSON-encoded). What the program does is recorded, then asserted on after it ran:

- every resource registration reaching the engine (a monitor that records each
  `RegisterResource` request, the root `pulumi:pulumi:Stack` included: the
  mocks' `new_resource` never sees the stack itself);
- every stack output (`pulumi.export` wrapped to record name and value).
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime.mocks import MockMonitor

from infra.config import engine_config

STACK_TYPE = "pulumi:pulumi:Stack"
KEY_FIGURES = {
    "model",
    "instanceType",
    "nodes",
    "tensorParallel",
    "pipelineParallel",
    "kvCacheTokens",
    "maxConcurrency",
    "vllmArgs",
    "hourlyCostUsd",
    "monthlyCostUsd",
}


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[str] = []
        self.calls: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args.typ)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append(args.token)
        return {}


class _RecordingMonitor(MockMonitor):
    def __init__(self, mocks: _Mocks) -> None:
        super().__init__(mocks)
        self.registered: list[tuple[str, str]] = []

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        self.registered.append((request.type, request.name))
        return super().RegisterResource(request)


class ProgramRun:
    """What one run of the program did."""

    def __init__(self) -> None:
        self.mocks = _Mocks()
        self.monitor = _RecordingMonitor(self.mocks)
        self.exports: dict[str, Any] = {}
        self.finished = False

    @property
    def registered_types(self) -> list[str]:
        return [t for t, _ in self.monitor.registered]


@pytest.fixture
def run_program(repo_root: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `__main__.py` for a stack with the given config map; returns a ProgramRun."""

    def run(config: dict[str, str], stack: str = "prod") -> ProgramRun:
        result = ProgramRun()
        run.runs.append(result)  # reachable after the program raised
        real_export = pulumi.export

        def recording_export(name: str, value: Any) -> None:
            result.exports[name] = value
            real_export(name, value)

        monkeypatch.setattr(pulumi, "export", recording_export)
        # A fresh root stack for each run: reset_options clears it, set_mocks
        # registers a new one through our monitor.
        pulumi.runtime.reset_options(project="gpu-serving", stack=stack, preview=False)
        pulumi.runtime.set_all_config(config)
        pulumi.runtime.set_mocks(
            result.mocks, project="gpu-serving", stack=stack, preview=False, monitor=result.monitor
        )

        @pulumi.runtime.test
        def program() -> None:
            runpy.run_path(str(repo_root), run_name="__main__")

        program()
        result.finished = True
        return result

    run.runs = []  # type: ignore[attr-defined]
    yield run
    pulumi.runtime.set_all_config({})
    pulumi.runtime.reset_options()


def _with(config: dict[str, str], area: str, **changes: Any) -> dict[str, str]:
    out = dict(config)
    value = json.loads(out[f"gpu-serving:{area}"])
    value.update(changes)
    out[f"gpu-serving:{area}"] = json.dumps(value)
    return out


def test_prod_program_exports_a_feasible_plan_and_creates_nothing(repo_root: Path, run_program) -> None:
    run = run_program(engine_config("prod", repo_root))
    assert run.finished

    # Only the root stack reached the engine; no resource, no provider call.
    assert run.registered_types == [STACK_TYPE]
    assert run.mocks.resources == []
    assert run.mocks.calls == []

    exports = run.exports
    assert set(exports) == {"plan"} | KEY_FIGURES
    plan = exports["plan"]
    assert plan["feasible"] is True, plan["errors"]
    assert plan["errors"] == []
    layout = plan["layout"]
    assert layout["tp"] * layout["pp"] * layout["dp"] == 32
    assert layout["nodes"] == 4 and layout["gpus_per_node"] == 8

    # The key figures are the plan's own numbers.
    assert exports["model"] == plan["model"]["name"]
    assert "deepseek" in exports["model"].lower()
    assert exports["instanceType"] == "p5.48xlarge"
    assert exports["nodes"] == layout["nodes"] == 4
    assert exports["tensorParallel"] == layout["tp"]
    assert exports["pipelineParallel"] == layout["pp"]
    assert exports["kvCacheTokens"] == plan["kv_cache"]["tokens"] > 0
    assert exports["maxConcurrency"] == plan["kv_cache"]["max_concurrency"] >= 1
    assert exports["vllmArgs"] == plan["vllm_args"]
    assert all(isinstance(a, str) for a in exports["vllmArgs"])
    assert "--max-model-len" in " ".join(exports["vllmArgs"])
    assert exports["hourlyCostUsd"] == plan["cost"]["hourly_usd"] > 0
    assert exports["monthlyCostUsd"] == plan["cost"]["monthly_usd"] > exports["hourlyCostUsd"]

    # The exported plan is plain JSON (what `pulumi stack output plan --json` shows).
    assert json.loads(json.dumps(plan)) == plan


def test_infeasible_plan_stops_with_the_numbers(repo_root: Path, run_program) -> None:
    config = _with(engine_config("prod", repo_root), "model", name="kimi-k3", weightFormat="fp8")
    with pytest.raises(pulumi.RunError) as info:
        run_program(config)
    message = str(info.value)
    assert "kimi-k3" in message
    assert "4 x p5.48xlarge" in message
    assert "no feasible plan" in message
    assert sum(ch.isdigit() for ch in message.split(":", 1)[1]) >= 4, message  # the reasons carry figures
    assert "Traceback" not in message
    assert info.value.__cause__ is None
    # Nothing was exported or created on the way out.
    (run,) = run_program.runs
    assert not run.finished
    assert run.exports == {}
    assert run.registered_types == [STACK_TYPE]


@pytest.mark.parametrize(
    "area, changes, expected",
    [
        ("serving", {"gpuMemoryUtilization": 1.2}, "gpu-serving:serving.gpuMemoryUtilization = 1.2 is out of range"),
        ("serving", {"maxModelLenn": 4096}, "unknown key gpu-serving:serving.maxModelLenn"),
        ("model", {"name": "no-such-model"}, "stack prod: unknown model 'no-such-model'"),
    ],
)
def test_config_mistake_stops_with_one_message(
    area: str, changes: dict[str, Any], expected: str, repo_root: Path, run_program
) -> None:
    config = _with(engine_config("prod", repo_root), area, **changes)
    with pytest.raises(pulumi.RunError) as info:
        run_program(config)
    message = str(info.value)
    assert expected in message
    assert "Traceback" not in message and "pydantic" not in message.lower()
    (run,) = run_program.runs
    assert run.exports == {}
    assert run.registered_types == [STACK_TYPE]



@pytest.mark.parametrize("stack", ["prod", "test"])
def test_every_stack_file_gives_a_feasible_program(stack: str, repo_root: Path, run_program) -> None:
    run = run_program(engine_config(stack, repo_root), stack=stack)
    assert run.finished
    assert run.exports["plan"]["feasible"] is True, run.exports["plan"]["errors"]
    assert run.registered_types == [STACK_TYPE]
    assert run.monitor.registered == [(STACK_TYPE, f"gpu-serving-{stack}")]
