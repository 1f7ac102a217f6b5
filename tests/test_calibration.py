"""The memory model against published vLLM start-up logs.

Each case is one entry of tests/data/vllm_memory_logs.yaml (with its source
URL and the log lines quoted): the same model, GPU, parallel layout and knobs
are planned here, and the planner's per-rank weights, activation peak,
non-torch memory and KV capacity are compared with what vLLM printed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from infra.catalog.instances import get_instance_type
from infra.catalog.models import load_model, with_weight_format
from infra.planning.layout import Knobs, Layout, evaluate
from infra.planning.memory import NON_TORCH_BASE_BYTES, GiB
from infra.planning.serving import BLOCK_SIZE_DEFAULT

DATA = Path(__file__).parent / "data"
LOGS = yaml.safe_load((DATA / "vllm_memory_logs.yaml").read_text())

# Models of the logs, as the planner loads them. Llama-3.3-70B has the
# architecture of Llama-3.1-70B (same config.json shapes); its FP8 checkpoint is
# planned with the fp8 weight format.
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": (str(DATA / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"), None),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mixtral-8x7b", None),
    "Qwen/Qwen3-30B-A3B": ("qwen3-30b-a3b", None),
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": ("llama-3.1-70b", "fp8"),
}
INSTANCE_FOR_GPU = {"H100-SXM-80GB": "p5.48xlarge"}

# How close the model must come. Activation and non-torch memory are absolute
# (they are small and noisy); weights and KV tokens relative.
WEIGHTS_REL = 0.03
ACTIVATION_ABS_GIB = 0.45
NON_TORCH_ABS_GIB = 0.30
KV_TOKENS_REL = 0.04

CASES = [e for e in LOGS if e["model"] in MODELS and e["gpu"] in INSTANCE_FOR_GPU and e.get("profiler_format") == "v1_debug"]


class _Run:
    """The planner's evaluation of one logged run."""

    def __init__(self, evaluation):
        self.evaluation = evaluation
        self.stages = evaluation.stages


def _plan(entry):
    """Evaluate the logged layout on a node with exactly the run's GPUs (the logs
    come from runs on part of an 8-GPU node, which the planner's search would
    fill with replicas)."""
    model, fmt = MODELS[entry["model"]]
    arch = load_model(model)
    if fmt:
        arch = with_weight_format(arch, fmt)
    tp, pp = entry["tp"], entry["pp"]
    node = dataclasses.replace(get_instance_type(INSTANCE_FOR_GPU[entry["gpu"]]), gpu_count=tp * pp)
    knobs = Knobs(
        gpu_memory_utilization=entry["gpu_memory_utilization"],
        max_model_len=entry["max_model_len"],
        max_num_batched_tokens=entry["max_num_batched_tokens"],
        max_num_seqs=entry["max_num_seqs"],
        block_size=BLOCK_SIZE_DEFAULT,
    )
    ev = evaluate(arch, node, 1, Layout(tp, pp, 1, False, entry["kv_cache_dtype"]), knobs)
    assert ev.feasible, ev.errors
    return _Run(ev)


def _id(entry) -> str:
    return f"{entry['model'].split('/')[-1]}-tp{entry['tp']}-pp{entry['pp']}-kv{entry['kv_cache_dtype']}"


def test_there_is_calibration_data():
    assert len(CASES) >= 8


@pytest.mark.parametrize("entry", CASES, ids=_id)
def test_weights_per_rank(entry):
    plan = _plan(entry)
    predicted = max(s.weights_bytes for s in plan.stages) / GiB
    assert predicted == pytest.approx(entry["weights_gib"], rel=WEIGHTS_REL), entry["source"]


@pytest.mark.parametrize("entry", CASES, ids=_id)
def test_activation_peak(entry):
    plan = _plan(entry)
    predicted = max(s.activation_bytes for s in plan.stages) / GiB
    assert abs(predicted - entry["activation_peak_gib"]) <= ACTIVATION_ABS_GIB, (predicted, entry["source"])


@pytest.mark.parametrize("entry", CASES, ids=_id)
def test_non_torch_memory(entry):
    plan = _plan(entry)
    predicted = (plan.stages[0].comm_buffer_bytes + NON_TORCH_BASE_BYTES) / GiB
    assert abs(predicted - entry["non_torch_gib"]) <= NON_TORCH_ABS_GIB, (predicted, entry["source"])


@pytest.mark.parametrize("entry", CASES, ids=_id)
def test_kv_tokens(entry):
    plan = _plan(entry)
    predicted = plan.evaluation.kv_tokens_per_replica
    assert predicted == pytest.approx(entry["kv_tokens"], rel=KV_TOKENS_REL), (predicted, entry["source"])
