"""`python -m infra plan` as a user meets it, offline.

Exit status (docs/planning.md): 0 feasible plan, 1 infeasible plan, 2 usage or config error.

Most tests call the app in-process (`run`, tests/cli_in_process.py: the same arguments and environment,
stdout and stderr apart, a traceback re-raised); two run `python -m infra` in a fresh process (`run_fresh`):
the real entry point's one JSON object on stdout (exit 0) and its usage text (exit 2).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from infra.catalog.instances import INSTANCE_TYPES
from infra.catalog.models import CATALOG
from tests import cli_in_process

REPO_ROOT = Path(__file__).resolve().parent.parent
AD_HOC = ["--model", "deepseek-v4-pro", "--instance-type", "p5.48xlarge", "--nodes", "4"]
KIMI = ["--model", "kimi-k3", "--instance-type", "p5.48xlarge", "--nodes", "4"]
SMALL = ["--instance-type", "g6e.xlarge", "--nodes", "1"]
# Forced colour would put escape codes between the words the tests look for.
ENV = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}


def run(*args: str, expect: int | None = 0) -> subprocess.CompletedProcess:
    """The app in-process with `args`; checks the exit status (unless `expect` is None) and that no
    traceback reached the user (an exception other than the exit is raised again)."""
    return cli_in_process.invoke(*args, expect=expect)


def run_fresh(*args: str, expect: int | None = 0) -> subprocess.CompletedProcess:
    """`python -m infra [args]` from the repository root; checks the exit status
    (unless `expect` is None) and that no traceback reached the user."""
    proc = subprocess.run(
        [sys.executable, "-m", "infra", *args], cwd=REPO_ROOT, env=ENV,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    if expect is not None:
        assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}:\n{output}"
    assert "Traceback" not in output, output
    return proc


def plan_json(*args: str, expect: int = 0) -> dict:
    return json.loads(run("plan", *args, "--json", expect=expect).stdout)


@pytest.fixture(scope="module")
def prod() -> dict:
    return plan_json("--stack", "prod")


# --- The prod stack ---------------------------------------------------------------


def test_prod_tables(prod):
    out = run("plan", "--stack", "prod").stdout
    assert "TP 8 x PP 4" in out
    header = next(line for line in out.splitlines() if "stage 0" in line)
    assert re.findall(r"stage \d+", header) == ["stage 0", "stage 1", "stage 2", "stage 3"]
    assert "KV cache capacity" in out
    assert f"{prod['kv_cache']['tokens']:,}" in out
    assert "at max-model-len 131,072" in out
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 4" in out
    assert f"${prod['cost']['hourly_usd']:,.2f}" in out
    assert f"${prod['cost']['monthly_usd']:,.2f}" in out
    assert re.search(r"TCO, monthly\s*│\s*\$57,000\.00", out)
    assert re.search(r"break-even vs API at \$2\.50/M\s*│\s*[\d.,]+[KMB] tokens/month", out)


def test_prod_json_keys_and_types(prod):
    assert set(prod["model"]) >= {"name", "params_total", "params_active", "weight_bytes"}
    assert set(prod["layout"]) >= {"tp", "pp", "ep", "dp", "nodes", "gpus_per_node", "layers_per_stage"}
    parts = {"weights_bytes", "activation_bytes", "kv_cache_bytes", "comm_buffer_bytes",
             "cuda_overhead_bytes", "headroom_bytes"}  # fmt: skip
    assert set(prod["per_rank"]) >= parts | {"gpu_visible_bytes"}
    assert set(prod["kv_cache"]) >= {"tokens", "bytes_per_token", "max_concurrency"}
    assert set(prod["cost"]) >= {"hourly_usd", "monthly_usd"}
    assert prod["feasible"] is True and prod["errors"] == []
    assert isinstance(prod["warnings"], list)
    assert prod["vllm_args"] and all(isinstance(a, str) for a in prod["vllm_args"])
    rank = prod["per_rank"]
    byte_figures = [prod["model"]["weight_bytes"], rank["gpu_visible_bytes"], *(rank[p] for p in parts),
                    prod["kv_cache"]["bytes_per_token"]]  # fmt: skip
    assert all(type(v) is int for v in byte_figures), byte_figures
    assert sum(rank[p] for p in parts) == rank["gpu_visible_bytes"]
    assert sum(prod["layout"]["layers_per_stage"]) > 0 and len(prod["layout"]["layers_per_stage"]) == prod["layout"]["pp"]


def test_prod_json_is_one_object_and_vllm_args_match_layout():
    out = run_fresh("plan", "--stack", "prod", "--json").stdout
    plan = json.loads(out)  # fails on anything printed before or after the object
    assert isinstance(plan, dict)
    args = plan["vllm_args"]
    flag = lambda name: args[args.index(name) + 1]  # noqa: E731
    assert int(flag("--tensor-parallel-size")) == plan["layout"]["tp"] == 8
    assert int(flag("--pipeline-parallel-size")) == plan["layout"]["pp"] == 4
    assert int(flag("--max-model-len")) == 131072


# --- Ad-hoc requests --------------------------------------------------------------


def test_ad_hoc_agrees_with_stack(prod):
    # Without a workload the ad-hoc plan holds the most sequences (replicas sharing V4-Pro's
    # experts); given the pipeline depth prod's SLA search chose, it lays the model out alike.
    assert plan_json(*AD_HOC, "--pp", str(prod["layout"]["pp"]))["layout"] == prod["layout"]


def test_forced_layout_warns_that_stages_share_a_node():
    plan = plan_json(*AD_HOC, "--tp", "4", "--pp", "8")
    assert (plan["layout"]["tp"], plan["layout"]["pp"]) == (4, 8)
    assert len(plan["layout"]["layers_per_stage"]) == 8
    assert any("stages share a node" in w for w in plan["warnings"]), plan["warnings"]


def test_weights_that_do_not_fit_exit_1_with_the_figures():
    out = run("plan", *KIMI, "--weight-format", "fp8", expect=1).stdout
    assert "the weights do not fit" in out
    assert re.search(r"needs [\d,.]+ [TG]B of weights", out), out
    assert re.search(r"hold [\d,.]+ [TG]B", out), out


def test_four_bit_weights_fit():
    plan = plan_json(*KIMI, "--weight-format", "mxfp4")
    assert plan["feasible"] is True and plan["errors"] == []


def test_model_by_name_file_or_directory(tmp_path):
    config = REPO_ROOT / "infra/catalog/model_configs/qwen3-0.6b.json"
    model_dir = tmp_path / "qwen3"
    model_dir.mkdir()
    shutil.copy(config, model_dir / "config.json")
    plans = [plan_json("--model", m, *SMALL) for m in ("qwen3-0.6b", str(config), str(model_dir))]
    assert all(p["feasible"] for p in plans)
    assert plans[1]["model"]["name"].endswith("qwen3-0.6b.json")
    assert str(model_dir) in plans[2]["model"]["name"]
    for p in plans[1:]:
        assert p["model"]["params_total"] == plans[0]["model"]["params_total"]
        assert p["layout"] == plans[0]["layout"]


# --- Charts -------------------------------------------------------------------------


def test_chart_png(tmp_path):
    # A path longer than the 80-column pipe rich assumes: it must stay on one line to be copied.
    path = tmp_path / ("charts-" * 12) / "out.png"
    path.parent.mkdir()
    out = run("plan", "--stack", "prod", "--chart", str(path)).stdout
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart written to {path}" in out


def test_chart_svg_keeps_json_clean(tmp_path):
    path = tmp_path / "out.svg"
    plan = json.loads(run("plan", "--stack", "prod", "--json", "--chart", str(path)).stdout)
    assert plan["layout"]["pp"] == 4
    assert ET.parse(path).getroot().tag.rpartition("}")[2] == "svg"


@pytest.mark.parametrize("name, message", [
    ("out.txt", "--chart takes a .png or .svg file, got 'out.txt'"),
    ("missing-dir/out.png", "cannot write --chart"),
])  # fmt: skip
def test_chart_refused(tmp_path, name, message):
    proc = run("plan", "--stack", "prod", "--chart", str(tmp_path / name), expect=2)
    assert message in proc.stderr
    assert not (tmp_path / name).exists()


# --- Bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--stack", "prod", "--kv-cache-dtype", "fp7"], "kv-cache-dtype 'fp7' is not one of"),
    (["--stack", "prod", "--gpu-memory-utilization", "1.5"], "gpu-memory-utilization must be in"),
    (["--stack", "prod", "--nodes", "0"], "nodes must be at least 1, got 0"),
    ([*AD_HOC[:4], "--nodes", "0"], "nodes must be at least 1, got 0"),
    (["--stack", "nope"], "no stack file Pulumi.nope.yaml"),
    (["--model", "[/x]", *SMALL], "model config '[/x]'"),  # printed as is, not read as rich markup
])  # fmt: skip
def test_bad_input_is_one_line_error(args, message):
    proc = run("plan", *args, expect=2)
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr


def test_unknown_model_lists_the_catalog():
    err = run("plan", "--model", "gpt-9", *SMALL, expect=2).stderr
    assert "unknown model 'gpt-9'" in err
    assert all(name in err for name in CATALOG), err


def test_unknown_instance_type_lists_known_types():
    err = run("plan", "--model", "qwen3-0.6b", "--instance-type", "p9.huge", "--nodes", "1", expect=2).stderr
    assert "unknown instance type 'p9.huge'" in err
    assert all(name in err for name in INSTANCE_TYPES), err


@pytest.mark.parametrize("args, usage", [((), "Usage: python -m infra "), (("plan",), "Usage: python -m infra plan")])
def test_no_arguments_prints_usage(args, usage):
    proc = run_fresh(*args, expect=2)
    output = proc.stdout + proc.stderr
    assert usage in output
    assert ("plan" in output) if not args else ("--stack" in output and "--model" in output)
