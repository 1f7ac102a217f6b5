"""The stack config: the real stack files load, and mistakes are refused clearly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import pulumi
import pytest
import yaml

from infra import config as config_mod
from infra.config import (
    AREAS,
    StackConfig,
    engine_config,
    from_mapping,
    from_pulumi_config,
    load_stack_file,
    reference_markdown,
)
from infra.config.fields import describe_allowed
from infra.errors import UserError
from infra.planning.performance import Sla, WorkloadSpec
from infra.planning.system_nodes import SystemNodes
from infra.planning.request import PlanRequest, TcoInputs
from tests import yaml_text

# --------------------------------------------------------------------------- the real stack files


def test_prod_stack_file_makes_the_prod_request(repo_root: Path) -> None:
    cfg = load_stack_file("prod", repo_root)
    assert cfg.stack == "prod"
    assert cfg.region == "us-east-1"
    req = cfg.plan_request()
    assert isinstance(req, PlanRequest)
    assert req.model == "deepseek-v4-pro"
    assert req.instance_type == "p5.48xlarge"
    assert req.nodes == 4
    assert req.max_model_len == 131072
    assert req.gpu_memory_utilization == pytest.approx(0.90)
    assert req.kv_cache_dtype is None  # the planner decides
    assert req.objective == "sla-throughput-per-dollar"
    # The SLA the benchmark checked before it drove the plan, and ShareGPT-like chat traffic.
    assert (req.sla.ttft_p99_ms, req.sla.tpot_p99_ms, req.sla.itl_p99_ms) == (250, 40, None)
    assert req.workload.preset == "sharegpt" and req.workload.prefix_cache_hit_rate == 0
    assert req.weight_format is None
    assert (req.tp, req.pp, req.dp, req.expert_parallel) == (None, None, None, None)
    assert req.api_price_usd_per_mtok == pytest.approx(2.50)
    assert isinstance(req.tco, TcoInputs)
    assert req.tco.monthly_usd == pytest.approx(57_000, abs=0.01)
    assert set(req.tco.categories) == {"hardwareAmortisation", "powerAndColocation", "network", "engineering"}
    # 4 nodes x $300,000 over 36 months
    assert req.tco.categories["hardwareAmortisation"] == pytest.approx(4 * 300_000 / 36, abs=0.01)


def test_every_tco_figure_is_labelled_as_an_assumption(repo_root: Path) -> None:
    lines = (repo_root / "Pulumi.prod.yaml").read_text().splitlines()
    categories = load_stack_file("prod", repo_root).cost.tco or {}
    assert categories
    for name in categories:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name}:"))
        comment = []
        while at > 0 and lines[at - 1].strip().startswith("#"):
            at -= 1
            comment.append(lines[at])
        assert any("Assumption" in line for line in comment), f"{name} has no 'Assumption:' comment above it"


def test_test_stack_file_makes_a_small_request(repo_root: Path) -> None:
    req = load_stack_file("test", repo_root).plan_request()
    assert req.model == "qwen3-0.6b"
    assert req.instance_type in ("g6e.xlarge", "g5.xlarge")
    assert req.nodes == 1
    assert req.max_model_len is not None and req.max_model_len <= 32768
    assert req.gpu_memory_utilization == pytest.approx(0.90)
    assert req.tco is None


def test_project_file(repo_root: Path) -> None:
    project = yaml_text.safe_load((repo_root / "Pulumi.yaml").read_text())
    assert project["name"] == config_mod.PROJECT == "gpu-serving"
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": "venv"}}
    assert project["backend"]["url"].startswith("file://")
    assert project["description"]


# --------------------------------------------------------------------------- every key maps through


def test_every_key_reaches_the_plan_request() -> None:
    cfg = from_mapping(
        "x",
        {
            "model": {"name": "kimi-k3", "weightFormat": "fp8"},
            "gpu": {"instanceType": "p5en.48xlarge", "nodes": 2},
            "lifecycle": {"production": True},
            "serving": {
                "tensorParallel": 8,
                "pipelineParallel": 2,
                "dataParallel": 1,
                "expertParallel": True,
                "maxModelLen": 65536,
                "gpuMemoryUtilization": 0.85,
                "maxNumBatchedTokens": 4096,
                "maxNumSeqs": 64,
                "kvCacheDtype": "fp8",
                "asyncScheduling": False,
                "vllmVersion": "0.33.1",
                "speculative": {"method": "mtp", "numSpeculativeTokens": 2},
                "objective": "min-cost",
                "targetConcurrency": 32,
                "coldStartTargetSeconds": 300,
                "sla": {"ttftP99Ms": 500, "tpotP99Ms": 50, "itlP99Ms": 80},
                "workload": {"preset": None, "inputTokens": 1000, "outputTokens": 300, "spread": 0.5, "prefixCacheHitRate": 0.25},
            },
            "checks": {"benchmark": True},
            "storage": {"type": "fsx"},
            "cluster": {"fsxCsi": True},
            "cost": {
                "apiPriceUsdPerMillionTokens": 1.5,
                "throughputTokensPerSecond": 5000,
                "dutyCycle": 0.5,
                "tco": {"a": 1.0, "b": 2.0},
            },
        },
        region="eu-west-1",
    )
    assert cfg.region == "eu-west-1"
    req = cfg.plan_request()
    # every knob of the request was set from a config key (none left at its default)
    defaults = PlanRequest(model="", instance_type="", nodes=0)
    left = [f.name for f in dataclasses.fields(PlanRequest) if getattr(req, f.name) == getattr(defaults, f.name)]
    assert left == []
    assert req == PlanRequest(
        model="kimi-k3",
        instance_type="p5en.48xlarge",
        nodes=None,  # min-cost: the planner picks the node count...
        max_nodes=2,  # ...up to the stack's

        tp=8,
        pp=2,
        expert_parallel=True,
        dp=1,
        max_model_len=65536,
        gpu_memory_utilization=0.85,
        max_num_batched_tokens=4096,
        max_num_seqs=64,
        kv_cache_dtype="fp8",
        async_scheduling=False,
        vllm_version="0.33.1",
        speculative_method="mtp",
        num_speculative_tokens=2,
        weight_format="fp8",
        objective="min-cost",
        target_concurrency=32,
        cold_start_target_s=300.0,
        storage_kind="fsx",
        tco=TcoInputs(categories={"a": 1.0, "b": 2.0}),
        api_price_usd_per_mtok=1.5,
        throughput_tokens_per_s=5000.0,
        sla=Sla(500.0, 50.0, 80.0),
        workload=WorkloadSpec(1000, 300, 0.5, None, 0.25),
        duty_cycle=0.5,
        predict_benchmark=True,
        system=SystemNodes("m7i.xlarge", 2, 15),  # cluster and monitoring defaults: in-cluster, 15 days
    )


def test_config_defaults_are_the_planner_defaults() -> None:
    cfg = from_mapping(
        "x",
        {"model": {"name": "m"}, "gpu": {"instanceType": "p5.48xlarge", "nodes": 1}, "lifecycle": {"production": True}},
    )
    # The stack's own defaults beyond the planner's: the SLA objective, at the SLA the benchmark
    # always had and ShareGPT-like traffic.
    assert cfg.plan_request() == PlanRequest(
        model="m", instance_type="p5.48xlarge", nodes=1, objective="sla-throughput-per-dollar", sla=Sla(250.0, 40.0),
        workload=WorkloadSpec.from_preset("sharegpt"),
        system=SystemNodes("m7i.xlarge", 2, 15),  # the system nodes and in-cluster monitoring, checked by the plan
    )


def test_every_key_documents_default_range_and_meaning() -> None:
    for area, model in AREAS.items():
        for name, field in model.model_fields.items():
            assert field.alias and field.alias[0].islower() and "_" not in field.alias, (area, name)
            assert field.description, (area, name)
            assert describe_allowed(field), (area, name)


def test_docs_carry_the_config_reference(repo_root: Path) -> None:
    page = (repo_root / "docs" / "configuration.md").read_text()
    assert reference_markdown() in page, "docs/configuration.md is stale: run `python -m infra docs`"


# --------------------------------------------------------------------------- mistakes are refused


def _prod_copy(repo_root: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None], stack: str = "prod") -> Path:
    doc = yaml_text.safe_load((repo_root / "Pulumi.prod.yaml").read_text())
    edit(doc["config"])
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path


def _set(area: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config[f"gpu-serving:{area}"][key] = value

    return edit


BAD = {
    "utilization above range": (
        _set("serving", "gpuMemoryUtilization", 1.2),
        ["gpu-serving:serving.gpuMemoryUtilization", "1.2", "0.5 to 1"],
    ),
    "zero nodes": (
        _set("gpu", "nodes", 0),
        ["gpu-serving:gpu.nodes", "0", "1 to 64"],
    ),
    "misspelt key": (
        _set("serving", "maxModelLenn", 4096),
        ["unknown key gpu-serving:serving.maxModelLenn", "did you mean 'maxModelLen'"],
    ),
    "unknown kv cache dtype": (
        _set("serving", "kvCacheDtype", "fp4"),
        ["gpu-serving:serving.kvCacheDtype", "'fp4'", "'auto'", "'fp8_e4m3'"],
    ),
    "unknown weight format": (
        _set("model", "weightFormat", "fp16"),
        ["gpu-serving:model.weightFormat", "'fp16'", "'bf16'", "'nvfp4'"],
    ),
    "min-cost without target": (
        _set("serving", "objective", "min-cost"),
        ["gpu-serving:serving.targetConcurrency", "required when objective is 'min-cost'", "1 to 1,000,000"],
    ),
    "negative tco category": (
        lambda c: c["gpu-serving:cost"]["tco"].update(network=-5),
        ["gpu-serving:cost.tco.network", "-5", ">= 0"],
    ),
    "zero api price": (
        _set("cost", "apiPriceUsdPerMillionTokens", 0),
        ["gpu-serving:cost.apiPriceUsdPerMillionTokens", "> 0"],
    ),
    "fractional tensor parallel": (
        _set("serving", "tensorParallel", 2.5),
        ["gpu-serving:serving.tensorParallel", "2.5", "integer"],
    ),
    "missing instance type": (
        lambda c: c["gpu-serving:gpu"].pop("instanceType"),
        ["gpu-serving:gpu.instanceType is required"],
    ),
    "missing model area": (
        lambda c: c.pop("gpu-serving:model"),
        ["gpu-serving:model is required", "name"],
    ),
    "misspelt area": (
        lambda c: c.update({"gpu-serving:servng": c.pop("gpu-serving:serving")}),
        ["unknown key gpu-serving:servng", "did you mean 'serving'"],
    ),
    "area not an object": (
        lambda c: c.update({"gpu-serving:serving": "fast"}),
        ["gpu-serving:serving must be an object"],
    ),
    "bad region": (
        lambda c: c.update({"aws:region": "us-east"}),
        ["aws:region", "'us-east'"],
    ),
    "log retention CloudWatch refuses": (
        _set("lifecycle", "logRetentionDays", 31),
        ["gpu-serving:lifecycle.logRetentionDays = 31", "not a retention CloudWatch Logs accepts", "the nearest: 30, 14", "3653"],
    ),
    "flow log traffic type": (
        _set("network", "flowLogTrafficType", "ACCEPT"),
        ["gpu-serving:network.flowLogTrafficType", "'ACCEPT'", "'REJECT', 'ALL'"],
    ),
}


def test_log_retention_and_flow_logs_default_to_a_year_and_refused_traffic(repo_root: Path, tmp_path: Path) -> None:
    for stack in ("prod", "test"):
        cfg = load_stack_file(stack, repo_root)
        assert (cfg.lifecycle.log_retention_days, cfg.network.flow_log_traffic_type) == (365, "REJECT")
    root = _prod_copy(repo_root, tmp_path, lambda c: (_set("lifecycle", "logRetentionDays", "0")(c), _set("network", "flowLogTrafficType", "ALL")(c)))
    cfg = load_stack_file("prod", root)  # `pulumi config set --path` stores a string; 0 never expires
    assert (cfg.lifecycle.log_retention_days, cfg.network.flow_log_traffic_type) == (0, "ALL")


@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_is_refused_with_key_path_and_range(case: str, repo_root: Path, tmp_path: Path) -> None:
    edit, expected = BAD[case]
    root = _prod_copy(repo_root, tmp_path, edit)
    with pytest.raises(UserError) as info:
        load_stack_file("prod", root)
    message = str(info.value)
    assert message.startswith("Pulumi.prod.yaml")
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"
    assert "pydantic" not in message.lower() and "Traceback" not in message
    assert info.value.__suppress_context__ or info.value.__context__ is None


def test_several_mistakes_are_listed_together(repo_root: Path, tmp_path: Path) -> None:
    def edit(c: dict[str, Any]) -> None:
        c["gpu-serving:gpu"]["nodes"] = 65
        c["gpu-serving:serving"]["gpuMemoryUtilization"] = 0.1

    root = _prod_copy(repo_root, tmp_path, edit)
    with pytest.raises(UserError) as info:
        load_stack_file("prod", root)
    message = str(info.value)
    assert "2 config errors" in message
    assert "gpu-serving:gpu.nodes = 65" in message
    assert "gpu-serving:serving.gpuMemoryUtilization = 0.1" in message


def test_missing_stack_file_lists_the_stacks_present(repo_root: Path, tmp_path: Path) -> None:
    _prod_copy(repo_root, tmp_path, lambda c: None, stack="prod")
    _prod_copy(repo_root, tmp_path, lambda c: None, stack="test")
    with pytest.raises(UserError) as info:
        load_stack_file("staging", tmp_path)
    message = str(info.value)
    assert "Pulumi.staging.yaml" in message
    assert "Pulumi.prod.yaml" in message and "Pulumi.test.yaml" in message


def test_yaml_syntax_error_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.prod.yaml").write_text("config:\n  gpu-serving:gpu: {nodes: 4\n")
    with pytest.raises(UserError) as info:
        load_stack_file("prod", tmp_path)
    assert "Pulumi.prod.yaml is not valid YAML" in str(info.value)
    assert "line" in str(info.value)


def test_key_without_namespace_is_refused(repo_root: Path, tmp_path: Path) -> None:
    root = _prod_copy(repo_root, tmp_path, lambda c: c.update({"serving": {"maxModelLen": 4096}}))
    with pytest.raises(UserError, match="gpu-serving:serving"):
        load_stack_file("prod", root)


def test_other_namespaces_are_left_to_their_providers(repo_root: Path, tmp_path: Path) -> None:
    root = _prod_copy(repo_root, tmp_path, lambda c: c.update({"aws:profile": "ops", "kubernetes:context": "x"}))
    assert load_stack_file("prod", root).gpu.nodes == 4


def test_config_objects_are_immutable(repo_root: Path) -> None:
    cfg = load_stack_file("prod", repo_root)
    with pytest.raises(Exception):
        cfg.gpu.nodes = 8  # type: ignore[misc]


# --------------------------------------------------------------------------- through the Pulumi engine


class _NoResources(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs):  # pragma: no cover - never called
        raise AssertionError(f"unexpected resource {args.typ}")

    def call(self, args: pulumi.runtime.MockCallArgs):  # pragma: no cover - never called
        raise AssertionError(f"unexpected call {args.token}")


@pytest.fixture
def pulumi_stack():
    """Point the Pulumi runtime at mocks for a stack; config is set by the test."""

    def use(stack: str, config: dict[str, str]) -> None:
        pulumi.runtime.reset_options(project="gpu-serving", stack=stack, preview=False)
        pulumi.runtime.set_all_config(config)
        pulumi.runtime.set_mocks(_NoResources(), project="gpu-serving", stack=stack, preview=False)

    yield use
    pulumi.runtime.set_all_config({})
    pulumi.runtime.reset_options()


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_engine_config_equals_stack_file(stack: str, repo_root: Path, pulumi_stack) -> None:
    pulumi_stack(stack, engine_config(stack, repo_root))
    assert from_pulumi_config() == load_stack_file(stack, repo_root)


def test_engine_config_errors_name_the_stack_file(repo_root: Path, pulumi_stack) -> None:
    config = engine_config("prod", repo_root)
    config["gpu-serving:serving"] = config["gpu-serving:serving"].replace('"gpuMemoryUtilization": 0.9', '"gpuMemoryUtilization": 1.2')
    assert "1.2" in config["gpu-serving:serving"]
    pulumi_stack("prod", config)
    with pytest.raises(UserError, match=r"Pulumi\.prod\.yaml: gpu-serving:serving\.gpuMemoryUtilization = 1\.2"):
        from_pulumi_config()


def test_engine_config_catches_a_misspelt_area(repo_root: Path, pulumi_stack) -> None:
    config = engine_config("prod", repo_root)
    config["gpu-serving:servng"] = config.pop("gpu-serving:serving")
    pulumi_stack("prod", config)
    with pytest.raises(UserError, match="unknown key gpu-serving:servng"):
        from_pulumi_config()


def test_engine_config_refuses_a_non_object_area(repo_root: Path, pulumi_stack) -> None:
    config = engine_config("prod", repo_root)
    config["gpu-serving:gpu"] = "p5.48xlarge"
    pulumi_stack("prod", config)
    with pytest.raises(UserError, match="gpu-serving:gpu must be an object"):
        from_pulumi_config()


def test_region_defaults_when_unset(repo_root: Path, pulumi_stack) -> None:
    config = engine_config("prod", repo_root)
    del config["aws:region"]
    pulumi_stack("prod", config)
    assert from_pulumi_config().region == "us-east-1"


def test_config_package_imports_no_pulumi_at_top_level() -> None:
    modules = sorted(Path(config_mod.__file__).parent.glob("*.py"))
    assert len(modules) > 1
    for module in modules:
        top_level = [line for line in module.read_text().splitlines() if line.startswith(("import ", "from "))]
        assert not [line for line in top_level if "pulumi" in line], (module.name, top_level)
    assert isinstance(load_stack_file("prod"), StackConfig)


def test_a_serving_image_by_tag_is_refused_in_production_only():
    from infra.config.stack import StackConfig

    base = {"stack": "x", "region": "us-east-1", "model": {"name": "qwen3-0.6b"},
            "gpu": {"instanceType": "p5.48xlarge", "nodes": 1}}  # fmt: skip
    tagged = {"image": "registry.example/vllm:0.34.0"}
    assert StackConfig.model_validate({**base, "serving": tagged, "lifecycle": {"expiresAt": "2999-01-01T00:00:00Z"}}).serving.image
    with pytest.raises(Exception, match=r"by tag alone"):
        StackConfig.model_validate({**base, "serving": tagged, "lifecycle": {"production": True, "owner": "o"}})
    digest = {"image": "registry.example/vllm:0.34.0@sha256:" + "0" * 64}
    StackConfig.model_validate({**base, "serving": digest, "lifecycle": {"production": True, "owner": "o"}})
