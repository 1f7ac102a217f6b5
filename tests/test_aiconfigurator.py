"""infra/cli/aiconfigurator.py: the cross-check against NVIDIA AIConfigurator 0.12.0.

- The GPU -> system mapping against the systems the wheel ships
  (tests/fixtures/aiconfigurator/, a listing of aiconfigurator_core/systems/ with its provenance).
- The request sent to the driver (batch per pipeline stage and DP rank, MoE layout,
  quant overrides) and the answer read back, through a stand-in driver.
- The 'not covered' path: a GPU without a system, a point the driver reports uncovered.
- venv-perf/: installed when missing or when requirements-perf.txt changed.
- With venv-perf/ installed (bin/test sets it up), the real driver on one covered and
  two uncovered cases.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.catalog.gpus import GPUS
from infra.cli import aiconfigurator as aic
from infra.errors import UserError
from tests import yaml_text
from tests.conftest import missing

REPO_ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


@pytest.fixture(scope="module")
def shipped(fixture_file) -> dict:
    return json.loads(fixture_file("aiconfigurator", "systems.json").read_text())


@pytest.fixture(scope="module")
def query_versions(fixture_file) -> dict:
    return yaml_text.safe_load(fixture_file("aiconfigurator", "query_versions.yaml").read_text())


def current_version(query_versions: dict, system: str, backend: str) -> str:
    """The version aiconfigurator answers with by default (the rules at the top of query_versions.yaml)."""
    return query_versions.get("overrides", {}).get(system, {}).get(backend, query_versions["defaults"][backend])["current"]


def sm(gpu: str) -> int:
    major, minor = GPUS[gpu].compute_capability.split(".")
    return int(major) * 10 + int(minor)


# --------------------------------------------------------------------------- GPU -> system


def test_every_catalog_gpu_has_a_decided_system():
    assert set(aic.SYSTEMS) == set(GPUS)


@pytest.mark.parametrize("gpu", sorted(g for g, s in aic.SYSTEMS.items() if s))
def test_a_mapped_gpu_is_a_system_of_the_wheel_with_its_memory_and_architecture(gpu, shipped):
    system = shipped[aic.SYSTEMS[gpu]]
    assert system["sm_version"] == sm(gpu)
    assert abs(system["mem_capacity"] / GiB - GPUS[gpu].marketing_memory_gb) <= 0.1 * GPUS[gpu].marketing_memory_gb


@pytest.mark.parametrize("gpu", sorted(g for g, s in aic.SYSTEMS.items() if s is None))
def test_an_unmapped_gpu_has_no_system_of_its_architecture_and_memory_in_the_wheel(gpu, shipped):
    like = [name for name, s in shipped.items()
            if s["sm_version"] == sm(gpu) and abs(s["mem_capacity"] / GiB - GPUS[gpu].marketing_memory_gb) <= 0.1 * GPUS[gpu].marketing_memory_gb]  # fmt: skip
    assert like == []


@pytest.mark.parametrize("gpu", ["H100-SXM-80GB", "H200-141GB", "B200"])
def test_the_serving_gpus_have_current_vllm_tables_for_gemm_attention_mla_and_moe(gpu, shipped, query_versions):
    system = aic.SYSTEMS[gpu]
    version = current_version(query_versions, system, "vllm")
    assert {"gemm", "attention", "mla", "moe", "comm"} <= set(shipped[system]["data"]["vllm"][version])


def test_a_system_without_tables_is_mapped_only_where_the_driver_reports_it(shipped):
    empty = {name for name, s in shipped.items() if not s["data"]}
    assert {s for s in aic.SYSTEMS.values() if s} & empty == {"l4"}  # reported "no vllm database for l4" by the driver


# --------------------------------------------------------------------------- the request


DEEPSEEK = {"model": "deepseek-ai/DeepSeek-V3", "gpu": "H100-SXM-80GB", "tp": 8, "pp": 4, "dp": 1,
            "expert_parallel": False, "isl": 1024, "osl": 1024, "concurrencies": [4, 16, 64, 128]}  # fmt: skip


def test_the_batch_is_the_concurrency_shared_over_pipeline_stages_and_dp_ranks():
    payload = aic.driver_request(DEEPSEEK, "h100_sxm")
    assert [p["batch_size"] for p in payload["points"]] == [1, 4, 16, 32]
    assert [p["concurrency"] for p in payload["points"]] == [4, 16, 64, 128]
    # rounded up, never below one request
    assert aic.driver_request({**DEEPSEEK, "dp": 2, "concurrencies": [1, 9]}, "h100_sxm")["points"] == [
        {"concurrency": 1, "batch_size": 1}, {"concurrency": 9, "batch_size": 2}]  # fmt: skip


def test_experts_span_tp_times_dp_sharded_or_whole_with_expert_parallel():
    sharded = aic.driver_request({**DEEPSEEK, "dp": 2}, "h100_sxm")
    assert (sharded["moe_tp"], sharded["moe_ep"]) == (16, 1)
    ep = aic.driver_request({**DEEPSEEK, "dp": 2, "expert_parallel": True}, "h100_sxm")
    assert (ep["moe_tp"], ep["moe_ep"], ep["tp"], ep["dp"], ep["pp"]) == (1, 16, 8, 2, 4)
    assert (lambda p: (p["moe_tp"], p["moe_ep"]))(aic.driver_request({**DEEPSEEK, "expert_parallel": 4}, "h100_sxm")) == (2, 4)
    with pytest.raises(UserError, match="does not divide"):
        aic.driver_request({**DEEPSEEK, "expert_parallel": 3}, "h100_sxm")


def test_weight_formats_become_quant_overrides():
    assert aic.driver_request(DEEPSEEK, "h100_sxm")["quant"] == {}  # the checkpoint's own
    assert aic.quant_overrides("fp8", "h100_sxm") == {"gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block"}
    assert aic.quant_overrides("bf16", "b200_sxm") == {"gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16"}
    assert aic.quant_overrides("mxfp4", "h100_sxm") == {"moe_quant_mode": "w4a16_mxfp4"}
    assert aic.quant_overrides("mxfp4", "b200_sxm") == {}
    # the catalog's labels of mixed checkpoints: the dense layers, then the experts
    assert aic.quant_overrides("fp8+mxfp4 experts", "h100_sxm") == {"gemm_quant_mode": "fp8_block", "moe_quant_mode": "w4a16_mxfp4"}
    assert aic.quant_overrides("fp8+mxfp4 experts", "b200_sxm") == {"gemm_quant_mode": "fp8_block"}
    assert aic.quant_overrides("bf16+int4 experts", "h200_sxm") == {"gemm_quant_mode": "bfloat16", "moe_quant_mode": "int4_wo"}
    assert aic.driver_request({**DEEPSEEK, "weights": "bf16", "kv_cache_dtype": "fp8_e4m3"}, "h100_sxm")["quant"] == {
        "gemm_quant_mode": "bfloat16", "moe_quant_mode": "bfloat16", "kvcache_quant_mode": "fp8"}  # fmt: skip
    assert aic.kv_override("auto") == {} and aic.kv_override("bfloat16") == {"kvcache_quant_mode": "bfloat16"}
    with pytest.raises(UserError, match="unknown weight format"):
        aic.quant_overrides("fp6", "h100_sxm")
    with pytest.raises(UserError, match="unknown weight format"):
        aic.quant_overrides("bf16+fp6 experts", "h100_sxm")


def test_a_bad_request_is_refused():
    with pytest.raises(UserError, match="unknown GPU"):
        aic.system_for("H100")
    with pytest.raises(UserError, match="unknown backend"):
        aic.driver_request({**DEEPSEEK, "backend": "tgi"}, "h100_sxm")
    with pytest.raises(UserError, match="concurrencies"):
        aic.driver_request({**DEEPSEEK, "concurrencies": [0]}, "h100_sxm")


# --------------------------------------------------------------------------- compare(), with a stand-in driver


STAND_IN = textwrap.dedent(
    """\
    # Stands in for aiconfigurator_driver.py: keeps the request, answers from it.
    import json, sys
    from pathlib import Path
    req = json.loads(sys.stdin.read())
    Path(__file__).with_name("request.json").write_text(json.dumps(req))
    mode = Path(__file__).with_name("mode").read_text().strip()
    if mode == "fail":
        print("Traceback ...", file=sys.stderr); print("ValueError: boom", file=sys.stderr); sys.exit(1)
    points = []
    for p in req["points"]:
        if mode == "uncovered" and p["concurrency"] > 16:
            points.append({"covered": False, "reason": "database does not cover it: MoE data missing",
                           "system": req["system"], "backend": req["backend"], "backend_version": "0.24.0"})
        else:
            points.append({"covered": True, "reason": "", "ttft_ms": 100.0 + p["batch_size"], "tpot_ms": 10.0,
                           "output_tokens_per_s_per_gpu": 12.5 * p["batch_size"], "output_tokens_per_s_per_user": 100.0,
                           "system": req["system"], "backend": req["backend"], "backend_version": "0.24.0"})
    if mode == "short":
        points = points[:1]
    print("aiconfigurator chatter on stderr", file=sys.stderr)
    print(json.dumps({"aiconfigurator_version": "0.12.0", "points": points}))
    """
)


@pytest.fixture()
def stand_in(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(STAND_IN)

    def run(request: dict, mode: str = "ok") -> tuple[list[dict], dict]:
        (tmp_path / "mode").write_text(mode)
        out = aic.compare(request, root=tmp_path, install=False, python=Path(sys.executable), driver=driver)
        return out, json.loads((tmp_path / "request.json").read_text())

    return run


def test_compare_sends_the_layout_and_returns_one_point_per_concurrency(stand_in):
    out, sent = stand_in({**DEEPSEEK, "expert_parallel": True, "weights": "fp8"})
    assert sent["system"] == "h100_sxm" and sent["backend"] == "vllm" and sent["model"] == "deepseek-ai/DeepSeek-V3"
    assert (sent["tp"], sent["pp"], sent["dp"], sent["moe_tp"], sent["moe_ep"]) == (8, 4, 1, 1, 8)
    assert sent["quant"] == {"gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block"}
    assert [p["concurrency"] for p in out] == [4, 16, 64, 128]
    assert [p["batch_size"] for p in out] == [1, 4, 16, 32]
    assert all(p["covered"] and p["reason"] == "" for p in out)
    assert [p["ttft_ms"] for p in out] == [101.0, 104.0, 116.0, 132.0]
    assert out[2]["output_tokens_per_s_per_gpu"] == 200.0 and out[2]["output_tokens_per_s_per_user"] == 100.0
    assert {(p["system"], p["backend"], p["backend_version"], p["aiconfigurator_version"]) for p in out} == {("h100_sxm", "vllm", "0.24.0", "0.12.0")}


def test_points_the_driver_does_not_cover_come_back_uncovered_with_its_reason(stand_in):
    out, _ = stand_in(DEEPSEEK, mode="uncovered")
    assert [p["covered"] for p in out] == [True, True, False, False]
    assert out[3]["reason"] == "database does not cover it: MoE data missing"
    assert out[3]["ttft_ms"] is None and out[3]["tpot_ms"] is None and out[3]["output_tokens_per_s_per_gpu"] is None


def test_a_gpu_without_a_system_is_not_covered_without_installing_anything(tmp_path):
    out = aic.compare({**DEEPSEEK, "gpu": "A10G"}, root=tmp_path, install=True)  # no requirements-perf.txt here: nothing ran
    assert [(p["concurrency"], p["covered"]) for p in out] == [(4, False), (16, False), (64, False), (128, False)]
    assert all(p["reason"] == "aiconfigurator has no system for A10G" for p in out)
    assert not (tmp_path / aic.VENV).exists()


def test_a_failing_or_short_driver_is_a_user_error_naming_its_last_words(stand_in):
    with pytest.raises(UserError, match="exited 1: ValueError: boom"):
        stand_in(DEEPSEEK, mode="fail")
    with pytest.raises(UserError, match="exited 0"):
        stand_in(DEEPSEEK, mode="short")


# --------------------------------------------------------------------------- venv-perf/


def test_the_venv_is_installed_once_and_again_when_the_requirements_change(tmp_path, monkeypatch):
    ran = []

    def fake_run(cmd, **kwargs):
        ran.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").write_text("")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(aic.subprocess, "run", fake_run)
    with pytest.raises(UserError, match="no requirements-perf.txt"):
        aic.ensure_venv(tmp_path)
    (tmp_path / aic.REQUIREMENTS).write_text("aiconfigurator==0.12.0\n")
    with pytest.raises(UserError, match="not installed in venv-perf/"):
        aic.ensure_venv(tmp_path, install=False)
    python = aic.ensure_venv(tmp_path)
    assert python == tmp_path / "venv-perf" / "bin" / "python"
    assert [c[1:3] for c in ran] == [["-m", "venv"], ["-m", "pip"]] and ran[1][-2:] == ["-r", str(tmp_path / aic.REQUIREMENTS)]
    ran.clear()
    assert aic.ensure_venv(tmp_path, install=False) == python and ran == []  # up to date: nothing runs
    (tmp_path / aic.REQUIREMENTS).write_text("aiconfigurator==0.12.1\n")
    with pytest.raises(UserError, match="changed since"):
        aic.ensure_venv(tmp_path, install=False)
    aic.ensure_venv(tmp_path)
    assert [c[1:3] for c in ran] == [["-m", "pip"]]  # the venv is kept, the requirements installed again


def test_requirements_perf_pins_this_aiconfigurator_and_its_whole_closure():
    lines = [ln.split("#", 1)[0].strip() for ln in (REPO_ROOT / aic.REQUIREMENTS).read_text().splitlines()]
    pins = dict(ln.split("==", 1) for ln in lines if ln)
    assert all(len(v.split("==")) == 1 and v for v in pins.values())
    assert pins["aiconfigurator"] == pins["aiconfigurator-core"] == aic.AIC_VERSION
    # the closure pip froze: aiconfigurator-core's own requirements are there too
    assert {"numpy", "pandas", "pyarrow", "PyYAML", "scipy", "packaging"} <= set(pins)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    return {n.partition(".")[0] for n in names}


def test_only_the_driver_imports_aiconfigurator_and_it_imports_nothing_else():
    importers = [p.relative_to(REPO_ROOT).as_posix() for d in ("infra", "components") for p in (REPO_ROOT / d).rglob("*.py")
                 if _imports(p) & {"aiconfigurator", "aiconfigurator_core"}]  # fmt: skip
    assert importers == ["infra/cli/aiconfigurator_driver.py"]
    # and PyYAML, which aiconfigurator reads its data with (the driver hands it libyaml's parser)
    assert _imports(aic.DRIVER) - set(sys.stdlib_module_names) == {"aiconfigurator", "aiconfigurator_core", "yaml"}


# --------------------------------------------------------------------------- the real driver (venv-perf/ installed)


@pytest.fixture(scope="module")
def venv_perf() -> Path:
    try:
        return aic.ensure_venv(REPO_ROOT, install=False)
    except UserError as exc:
        missing(f"{exc} (bin/test installs it, as does python -m infra perf --compare-aiconfigurator)")


def test_the_driver_hands_aiconfigurator_libyaml_and_its_files_load_the_same(venv_perf):
    """Every 10th YAML file of the installed aiconfigurator_core, read through the driver's
    yaml.safe_load (libyaml's parser) and PyYAML's pure-Python one: the same objects."""
    script = textwrap.dedent(
        f"""
        import importlib.util, json, sys
        from importlib import resources
        from pathlib import Path
        import yaml
        pure = yaml.safe_load
        spec = importlib.util.spec_from_file_location("driver", {str(aic.DRIVER)!r})
        driver = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(driver)
        assert driver.parse_yaml_in_c() and yaml.safe_load is not pure
        files = sorted(Path(str(resources.files("aiconfigurator_core"))).rglob("*.yaml"))[::10]
        for f in files:
            with open(f) as a, open(f) as b:
                assert yaml.safe_load(a) == pure(b), f
        print(json.dumps(len(files)))
        """
    )
    done = subprocess.run([str(venv_perf), "-I", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) >= 40


def test_the_real_driver_estimates_a_covered_point_and_names_what_it_does_not_cover(venv_perf):
    llama = {"model": "meta-llama/Meta-Llama-3.1-70B", "gpu": "H100-SXM-80GB", "tp": 8, "pp": 1, "dp": 1,
             "isl": 1024, "osl": 1024, "concurrencies": [1, 16]}  # fmt: skip
    one, sixteen = aic.compare(llama, root=REPO_ROOT, install=False)
    for p in (one, sixteen):
        assert p["covered"], p["reason"]
        assert (p["system"], p["backend"], p["backend_version"]) == ("h100_sxm", "vllm", "0.24.0")
        assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0
        # per GPU x 8 GPUs is per user x users, to the time the first token takes
        assert p["output_tokens_per_s_per_gpu"] * 8 == pytest.approx(p["output_tokens_per_s_per_user"] * p["concurrency"], rel=0.1)
    assert sixteen["tpot_ms"] > one["tpot_ms"] and sixteen["output_tokens_per_s_per_gpu"] > 4 * one["output_tokens_per_s_per_gpu"]

    # DeepSeek-V4-Pro's MXFP4 experts on Hopper: no measured vLLM MoE rows for its shape
    v4 = aic.compare({**llama, "model": "deepseek-ai/DeepSeek-V4-Pro", "pp": 4, "concurrencies": [16]}, root=REPO_ROOT, install=False)
    assert not v4[0]["covered"] and v4[0]["reason"].startswith("database does not cover it:") and "MoE data missing" in v4[0]["reason"]
    # a model the package does not know: reported, not downloaded
    unknown = aic.compare({**llama, "model": "example-org/not-a-model", "concurrencies": [1]}, root=REPO_ROOT, install=False)
    assert not unknown[0]["covered"] and unknown[0]["reason"].startswith("model not supported")
