"""When the plan passes `--enable-mfu-metrics` (infra/planning/serving.py `mfu_metrics_gap`), against the pinned wheel.

What vLLM 0.34.0's estimator (v1/metrics/perf.py) accepts is read from the wheel by
tests/fixtures/metrics/extract_mfu_estimator.py into vllm-0.34.0-mfu-estimator.json:
its components and their parser chains, the quantization methods its parsers take, the
names vLLM's quantization configs load checkpoints as, the model types it treats as MLA
and what its MLA parser requires. The catalog's bundled config.json files are the
models' side. The flag itself is checked against the release's flag reference, and the
synthesized head's `vllm serve` command carries it or not as decided.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from infra.catalog import vllm as reference
from infra.catalog.models import CATALOG, CONFIG_DIR, load_model
from infra.config import load_stack_file
from infra.planning import serving
from infra.planning.plan import make_plan
from tests.conftest import REPO_ROOT, fixture_path

WHEEL = json.loads(fixture_path("metrics", "vllm-0.34.0-mfu-estimator.json").read_text())
VERSION = load_stack_file("prod").serving.vllm_version


def _config(name: str) -> dict:
    cfg = json.loads((CONFIG_DIR / CATALOG[name].file).read_text())
    return cfg.get("text_config") or cfg


def test_the_extract_is_the_pinned_wheels():
    assert WHEEL["wheel"] == reference.load_reference(VERSION)["wheel"]["file"]
    assert WHEEL["sha256"] == reference.load_reference(VERSION)["wheel"]["sha256"]


def test_the_estimator_has_the_four_components_read_here():
    """Attention (GQA), MLA attention, FFN and the LM head, nothing else: a component added by a later release (a
    linear-attention or sparse one) would change which families the plan may pass the flag for."""
    assert {c["component_type"] for c in WHEEL["components"]} == {"attn", "mla_attn", "ffn", "unembed"}
    chains = {c["component_type"]: c["parsers"] for c in WHEEL["components"]}
    # The attention and FFN components drop on an unknown quantization method; the LM head never does.
    assert "AttentionQuantizationConfigParser" in chains["attn"] and "AttentionQuantizationConfigParser" in chains["mla_attn"]
    assert "FfnQuantizationConfigParser" in chains["ffn"] and chains["unembed"] == ["BaseConfigParser"]
    assert chains["attn"][0] == "AttentionDetectionParser" and chains["mla_attn"][0] == "MLADetectionParser"


def test_the_quantization_methods_are_the_wheels():
    assert serving.MFU_QUANT_METHODS == set(WHEEL["quant_weight_byte_size"])
    loaded_as = set(WHEEL["quant_method_names"].values())
    for name in CATALOG:
        arch = load_model(name)
        method = serving.vllm_quant_method(arch)
        # A method the plan cannot name (Kimi K3's MXFP4 experts are parsed without a scheme) is never what decides.
        assert method is None or method in loaded_as or arch.model_type in serving.MFU_FAMILY_GAPS, (name, method)
    # What the wheel's configs call AWQ, GPTQ, gpt-oss's MXFP4 and DeepSeek-V4's FP8 is not in the estimator's table.
    for method in ("auto_awq", "auto_gptq", "gpt_oss_mxfp4", "deepseek_v4_fp8"):
        assert method in loaded_as and method not in serving.MFU_QUANT_METHODS


def test_the_families_are_classified_against_the_wheel():
    mla = set(WHEEL["mla_model_types"])
    required = set(WHEEL["mla_config_required"])
    for name in CATALOG:
        cfg, arch = _config(name), load_model(name)
        assert arch.model_type in serving.MFU_FAMILIES | set(serving.MFU_FAMILY_GAPS), name
        if arch.model_type in serving.MFU_FAMILIES and arch.model_type in mla:
            assert required <= set(cfg), (name, required - set(cfg))  # MLAAttentionMetrics instantiates
    # DeepSeek-V4: MLA to vLLM, so AttentionMetrics skips it, but no kv_lora_rank: MLAAttentionMetrics drops too.
    assert "deepseek_v4" in mla and "kv_lora_rank" in required and "kv_lora_rank" not in _config("deepseek-v4-pro")
    # Kimi K3: every layer billed as MLA, though most are KDA layers.
    k3 = _config("kimi-k3")
    assert "kimi_linear" in mla and required <= set(k3) and len(k3["linear_attn_config"]["kda_layers"]) > k3["num_hidden_layers"] // 2
    # DeepSeek-V3.2: MLA to vLLM, with the sparse indexer's top-k the estimator does not read.
    assert "deepseek_v32" in mla and "index_topk" in _config("deepseek-v3.2")


@pytest.mark.parametrize("name, gap", [
    ("deepseek-v4-pro", "LM head alone"),
    ("kimi-k3", "KDA"),
    ("deepseek-v3.2", "sparse attention"),
    ("gpt-oss-120b", "gpt_oss_mxfp4"),
    ("qwen3-32b-awq", "auto_awq"),
    ("qwen3-30b-a3b-gptq-int4", "auto_gptq"),
    ("llama-3.1-70b", None),
    ("deepseek-v3", None),
    ("qwen3-235b-a22b-fp8", None),
])  # fmt: skip
def test_the_gap_of_each_family(name, gap):
    found = serving.mfu_metrics_gap(load_model(name), speculative=False, dp=1)
    assert (found is None) if gap is None else (gap in found), found


def test_speculative_decoding_and_data_parallel_are_gaps_on_any_model():
    arch = load_model("llama-3.1-70b")
    assert "is_prefill = num_tokens > 1" in serving.mfu_metrics_gap(arch, speculative=True, dp=1)
    assert "ffn_tp_size = dp_size * tp_size" in serving.mfu_metrics_gap(arch, speculative=False, dp=2)


def test_the_flag_is_one_the_release_accepts():
    flag = reference.load_reference(VERSION)["flags"]["--enable-mfu-metrics"]
    assert (flag["source"], flag["type"]) == ("ObservabilityConfig.enable_mfu_metrics", "bool")
    args = serving.vllm_args(tp=1, pp=1, dp=1, expert_parallel=False, gpu_memory_utilization=0.9, max_model_len=4096,
                             max_num_seqs=8, max_num_batched_tokens=2048, kv_cache_dtype="auto", mfu_metrics=True)  # fmt: skip
    assert args.count("--enable-mfu-metrics") == 1
    assert reference.check_serve_argv(["vllm", "serve", "m", *args], VERSION) == []


def _head_argv(stack: str) -> list[str]:
    from infra.k8s import raycluster
    from tests.test_rayspec import make_spec, plan_for, served

    spec = make_spec(plan_for(REPO_ROOT, stack))
    return served(raycluster.raycluster(spec)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize("stack, flagged", [("prod", False), ("test", True)])
def test_the_synthesized_head_carries_the_flag_as_decided(stack, flagged):
    """prod (DeepSeek-V4-Pro, MTP, TP 8 x PP 4) goes without; test (qwen3-0.6b, one GPU) passes it."""
    argv = _head_argv(stack)
    plan = make_plan(load_stack_file(stack).plan_request())
    gap = serving.mfu_metrics_gap(plan.model, speculative=bool(plan.speculative), dp=plan.evaluation.layout.dp)
    assert ("--enable-mfu-metrics" in argv) == flagged == (gap is None)
    assert reference.check_serve_argv(argv, VERSION) == []


# ---- the method names vLLM loads a checkpoint as (serving.vllm_quant_method) ---------------------------------


def _loaded_as(config_class: str) -> str:
    """The name the pinned wheel's quantization config `config_class` (file:Class) loads checkpoints as."""
    return WHEEL["quant_method_names"][config_class]


def _with_formats(base: str, *formats: str):
    """Catalog model `base` with its first layer's parameter groups stored in `formats`, without a scheme."""
    arch = load_model(base)
    first = arch.layers[0]
    params = tuple(dataclasses.replace(g, fmt=f, scheme=None) for g, f in zip(first.params, formats)) + first.params[len(formats):]
    return arch.with_(layers=(dataclasses.replace(first, params=params),) + arch.layers[1:])


def test_deepseek_v4_loads_as_its_own_fp8_config():
    """DeepSeek-V4-Pro's checkpoint (FP8 and MXFP4 weights) loads through vllm/models/deepseek_v4/quant_config.py, not
    the generic Fp8Config: the method is that config's name, whatever mix of formats its groups hold."""
    arch = load_model("deepseek-v4-pro")
    stored = {g.fmt for layer in arch.layers for g in layer.params}
    assert {"fp8", "mxfp4"} <= stored  # both a format the plan names and one it does not
    assert serving.vllm_quant_method(arch) == _loaded_as("vllm/models/deepseek_v4/quant_config.py:DeepseekV4FP8Config")
    assert serving.vllm_quant_method(arch) != _loaded_as("vllm/model_executor/layers/quantization/fp8.py:Fp8Config")


def test_groups_of_two_methods_are_named_together_and_get_no_flag():
    """A checkpoint mixing FP8 and NVFP4 groups is neither Fp8Config's nor ModelOptNvFp4Config's (the wheel loads
    ModelOpt's mixed-precision checkpoints as modelopt_mixed, which the estimator does not take): the plan names both
    methods and keeps the flag off although each alone would be accepted."""
    fp8 = _loaded_as("vllm/model_executor/layers/quantization/fp8.py:Fp8Config")
    fp4 = _loaded_as("vllm/model_executor/layers/quantization/modelopt.py:ModelOptNvFp4Config")
    mixed = _loaded_as("vllm/model_executor/layers/quantization/modelopt.py:ModelOptMixedPrecisionConfig")
    assert {fp8, fp4} <= set(WHEEL["quant_weight_byte_size"]) and mixed not in WHEEL["quant_weight_byte_size"]
    arch = _with_formats("llama-3.1-70b", "nvfp4", "fp8")
    assert serving.vllm_quant_method(arch) == f"{fp8}+{fp4}"  # sorted: "fp8" < "modelopt_fp4"
    assert serving.vllm_quant_method(_with_formats("llama-3.1-70b", "fp8")) == fp8  # one method: its name alone
    gap = serving.mfu_metrics_gap(arch, speculative=False, dp=1)
    assert gap is not None and f"quantization method {fp8}+{fp4}," in gap


def test_formats_the_plan_cannot_name_are_listed():
    """Groups stored in formats without a scheme the plan recognises (MXFP4 and INT4 here) give "unknown (<formats>
    weights)", every format named once, and the flag stays off: the method vLLM would use is not known to be one the
    estimator takes."""
    arch = _with_formats("llama-3.1-70b", "mxfp4", "int4", "mxfp4")
    assert serving.vllm_quant_method(arch) == "unknown (int4+mxfp4 weights)"
    assert "quantization method unknown (int4+mxfp4 weights)," in serving.mfu_metrics_gap(arch, speculative=False, dp=1)
    assert serving.vllm_quant_method(load_model("llama-3.1-70b")) is None  # bf16 throughout: unquantised


def test_the_gaps_name_what_the_estimator_lacks():
    """An unread family names its model type; an unknown method cites the wheel's table (_QUANT_WEIGHT_BYTE_SIZE, the
    extract's quant_weight_byte_size) and what is left: the LM head, whose parser chain has no quantization parser."""
    assert "unembed" in {c["component_type"] for c in WHEEL["components"]} and WHEEL["quant_weight_byte_size"]
    unread = load_model("llama-3.1-70b").with_(model_type="qwen2")
    assert "qwen2" not in serving.MFU_FAMILIES | set(serving.MFU_FAMILY_GAPS)
    assert "has not been read against qwen2 models here" in serving.mfu_metrics_gap(unread, speculative=False, dp=1)
    gap = serving.mfu_metrics_gap(load_model("qwen3-32b-awq"), speculative=False, dp=1)
    assert "does not know (v1/metrics/perf.py _QUANT_WEIGHT_BYTE_SIZE)" in gap
    assert gap.endswith("and the counters would hold the LM head alone")
