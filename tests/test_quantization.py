"""Quantised checkpoints: each scheme's bytes per rank against vLLM 0.34.0's parameters.

For every scheme a small layer is planned at TP2 and its bytes on one rank are
compared with a figure worked out by hand from the shapes the scheme's
`create_weights` registers (the vLLM file and function are named at each case).
Then real checkpoints against published "Model loading took" / "weights memory"
figures, `ignore` / `modules_to_not_convert` lists, gpt-oss's MXFP4 padding per
GPU, and the plan the issue asked for (Qwen3-235B-A22B-FP8 at TP4 on p5.48xlarge).

The tiny layer (a llama config): hidden 256, 4 query heads and 2 KV heads of 64,
intermediate 512. At TP2 one rank holds qkv_proj with output partitions
(2 x 64, 64, 64) = 256 by input 256, o_proj 256 by 128 (of 256), gate_up_proj
(256, 256) by 256 and down_proj 256 by 256 (of 512). The tiny MoE (qwen3_moe):
4 experts, hidden 256, moe_intermediate 256, so 128 per rank at TP2.
"""

from __future__ import annotations

import json

import pytest

from infra.catalog.arch import Experts, Linear, Role
from infra.catalog.models import CATALOG, CONFIG_DIR, load_model, parse_config, weight_bytes
from infra.catalog.quant import mxfp4_moe_backend, parse_quant_config
from infra.errors import UserError
from infra.planning import PlanRequest, make_plan, memory
from infra.planning.memory import GiB

TP = 2

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "intermediate_size": 512, "num_hidden_layers": 1, "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}
TINY_MOE = {
    "model_type": "qwen3_moe", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "intermediate_size": 512, "moe_intermediate_size": 256, "num_experts": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 1, "vocab_size": 1000, "torch_dtype": "bfloat16",
}


def _ct(weights: dict, inputs: dict | None = None, fmt: str = "pack-quantized", ignore=("lm_head",)) -> dict:
    return {
        "quant_method": "compressed-tensors", "format": fmt, "ignore": list(ignore),
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}},
    }


FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
MODELOPT_FP8 = {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}
MODELOPT_NVFP4 = {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}
CT_FP8_CHANNEL = _ct(
    {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
    {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True},
    fmt="float-quantized",
)
CT_INT8_CHANNEL = _ct(
    {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
    {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True},
    fmt="int-quantized",
)
CT_W4A16 = _ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True, "dynamic": False})
CT_W4A16_ASYM = _ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False, "dynamic": False})
CT_W4A16_CHANNEL = _ct({"num_bits": 4, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False})
CT_NVFP4 = _ct(
    {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": False},
    {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": "local"},
    fmt="nvfp4-pack-quantized",
)
CT_NVFP4_A16 = _ct(
    {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": False},
    fmt="nvfp4-pack-quantized",
)
CT_MXFP4 = _ct(
    {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True, "dynamic": False},
    fmt="mxfp4-pack-quantized",
)
AWQ = {"quant_method": "awq", "zero_point": True, "group_size": 128, "bits": 4, "version": "gemm", "modules_to_not_convert": None}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
GPTQ_CHANNEL = {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": False, "sym": True}


def _arch(base: dict, quant: dict):
    return parse_config({**base, "quantization_config": quant}, "tiny", "test")


def _linear(arch, split: str, inputs: int | None = None):
    """The one quantised linear group of layer 0 with this split (and input size)."""
    found = [
        g for g in arch.layers[0].params
        if g.scheme is not None and isinstance(g.shapes[0], Linear) and g.shapes[0].split == split
        and (inputs is None or g.shapes[0].inputs == inputs)
    ]
    assert len(found) >= 1, [g for g in arch.layers[0].params]
    return found[0]


def _qkv(arch):
    return next(g for g in arch.layers[0].params if g.scheme is not None and len(g.shapes[0].outputs) == 3)


def _experts(arch):
    (g,) = [g for g in arch.layers[0].params if g.role == Role.ROUTED_EXPERT]
    assert isinstance(g.shapes[0], Experts)
    return g


def _rank(group, tp=TP, **kw) -> int:
    return int(memory.group_bytes_per_rank(group, tp, tp, **kw))


# --- Linear layers: qkv_proj (N 256 = 128 + 64 + 64 by K 256) on one of two ranks ----------------


@pytest.mark.parametrize(
    "quant, expected",
    [
        # fp8.py Fp8LinearMethod.create_weights: weight [256, 256] fp8 = 65,536; weight_scale_inv
        # [cdiv(256,128), cdiv(256,128)] = 2 x 2 fp32 = 16.
        (FP8_BLOCK, 65_536 + 16),
        # modelopt.py KFp8StaticTensor: weight 65,536; weight_scale [3 shards] fp32 = 12;
        # input_scale [3] fp32 = 12.
        (MODELOPT_FP8, 65_536 + 12 + 12),
        # compressed_tensors_w8a8_fp8.py: weight 65,536; channel weight_scale [256, 1] fp32 = 1,024;
        # dynamic per-token activations: no input_scale.
        (CT_FP8_CHANNEL, 65_536 + 1_024),
        # compressed_tensors_w8a8_int8.py: int8 weight 65,536; weight_scale [256, 1] fp32 = 1,024.
        (CT_INT8_CHANNEL, 65_536 + 1_024),
        # compressed_tensors_wNa16.py: weight_packed [256, 256*4/32 = 32] int32 = 32,768;
        # weight_scale [256, 256/128 = 2] bf16 = 1,024; weight_shape [2] int64 = 16.
        (CT_W4A16, 32_768 + 1_024 + 16),
        # ... asymmetric: weight_zero_point [ceil(256*4/32) = 32, 2] int32 = 256 more.
        (CT_W4A16_ASYM, 32_768 + 1_024 + 256 + 16),
        # auto_awq.py AutoAWQMarlinLinearMethod: qweight [256, 256/8] int32 = 32,768; qzeros
        # [256/128 = 2, 32] int32 = 256; scales [2, 256] bf16 = 1,024.
        (AWQ, 32_768 + 256 + 1_024),
        # auto_gptq.py AutoGPTQLinearMethod: qweight [256/8, 256] int32 = 32,768; scales [2, 256]
        # bf16 = 1,024; qzeros [2, 256/8] int32 = 256.
        (GPTQ, 32_768 + 1_024 + 256),
        # modelopt.py KNvfp4Static + KNvfp4Dynamic: weight [256, 128] uint8 = 32,768; weight_scale
        # [256, 256/16] fp8 = 4,096; weight_scale_2 [3] fp32 = 12; input_scale [3] fp32 = 12.
        (MODELOPT_NVFP4, 32_768 + 4_096 + 12 + 12),
        # compressed_tensors_w4a4_nvfp4.py: the same four parameters (weight_packed,
        # weight_scale, weight_global_scale, input_global_scale) ...
        (CT_NVFP4, 32_768 + 4_096 + 12 + 12),
        # ... and without input activations (NVFP4A16) no input_global_scale.
        (CT_NVFP4_A16, 32_768 + 4_096 + 12),
        # compressed_tensors_w4a4_mxfp4.py: weight_packed [256, 128] uint8 = 32,768; weight_scale
        # [256, 256/32] uint8 = 2,048.
        (CT_MXFP4, 32_768 + 2_048),
    ],
    ids=["fp8-block", "modelopt-fp8", "ct-fp8-channel", "ct-int8-channel", "ct-w4a16", "ct-w4a16-asym",
         "awq", "gptq", "modelopt-nvfp4", "ct-nvfp4", "ct-nvfp4a16", "ct-mxfp4"],
)
def test_qkv_bytes_per_rank(quant, expected):
    arch = _arch(TINY_LLAMA, quant)
    assert _rank(_qkv(arch)) == expected


@pytest.mark.parametrize(
    "quant, expected",
    [
        # o_proj, row parallel: N 256 by K 128 of 256 on the rank.
        # Fp8: weight 32,768 + scale [2, 1] fp32 = 8.
        (FP8_BLOCK, 32_768 + 8),
        # WNA16 group 128: packed [256, 16] int32 = 16,384; scales [256, 128/128] bf16 = 512; shape 16.
        (CT_W4A16, 16_384 + 512 + 16),
        # WNA16 channelwise on a row-parallel layer: one scale per row, repeated on every rank
        # (marlin_repeat_scales_on_all_ranks): scales [256, 256/256 = 1] bf16 = 512.
        (CT_W4A16_CHANNEL, 16_384 + 512 + 16),
        # GPTQ: qweight [128/8, 256] int32 = 16,384; scales [1, 256] bf16 = 512; qzeros [1, 32] int32 = 128.
        (GPTQ, 16_384 + 512 + 128),
        # GPTQ channelwise: groups = input_size // input_size = 1 on every rank, same bytes.
        (GPTQ_CHANNEL, 16_384 + 512 + 128),
        # AWQ: qweight [128, 32] int32 = 16,384; qzeros [1, 32] int32 = 128; scales [1, 256] bf16 = 512.
        (AWQ, 16_384 + 128 + 512),
    ],
    ids=["fp8-block", "ct-w4a16", "ct-w4a16-channel", "gptq", "gptq-channel", "awq"],
)
def test_row_parallel_bytes_per_rank(quant, expected):
    arch = _arch(TINY_LLAMA, quant)
    assert _rank(_linear(arch, "row", inputs=256)) == expected


def test_fp8_block_scales_round_up_partial_blocks():
    # A down_proj 256 x 320 whose 160 inputs per rank are not a multiple of 128 would be refused
    # by vLLM's validate_fp8_block_shape; at TP1 it is allowed and its scale has
    # cdiv(256,128) x cdiv(320,128) = 2 x 3 fp32 = 24 bytes next to the 81,920 weights.
    arch = _arch({**TINY_LLAMA, "intermediate_size": 320}, FP8_BLOCK)
    assert _rank(_linear(arch, "row", inputs=320), tp=1) == 256 * 320 + 24


def test_kv_heads_fewer_than_tp_are_replicated():
    # QKVParallelLinear at TP4 with 2 KV heads: each rank keeps one query head and one K and V
    # head (replicated), N = 64 + 64 + 64; fp8 block: 192 x 256 + cdiv(192,128) x 2 x 4 = 49,168.
    arch = _arch(TINY_LLAMA, FP8_BLOCK)
    assert _rank(_qkv(arch), tp=4) == 192 * 256 + 2 * 2 * 4


# --- FusedMoE: 4 experts, hidden 256, intermediate 128 per rank ------------------------------------


@pytest.mark.parametrize(
    "quant, expected",
    [
        # fp8.py Fp8MoEMethod.create_weights: w13 [4, 256, 256] + w2 [4, 256, 128] fp8 = 393,216;
        # w13_weight_scale_inv [4, 2*cdiv(128,128), cdiv(256,128)] = 16 and w2 [4, cdiv(256,128),
        # cdiv(128,128)] = 8 fp32 = 96.
        (FP8_BLOCK, 393_216 + 96),
        # compressed_tensors_moe_wna16.py: w13_weight_packed [4, 256, 256/8] + w2 [4, 256, 128/8]
        # int32 = 131,072 + 65,536; scales [4, 256, 2] + [4, 256, 1] bf16 = 6,144; w13/w2_weight_shape
        # [4, 2] bf16 each = 32.
        (CT_W4A16, 131_072 + 65_536 + 6_144 + 32),
        # auto_gptq.py AutoGPTQMoEMethod: w13_qweight [4, 256/8, 256] + w2 [4, 128/8, 256] int32 =
        # 196,608; scales [4, 2, 256] + [4, 1, 256] bf16 = 6,144; qzeros [4, 2, 32] + [4, 1, 32]
        # int32 = 1,536.
        (GPTQ, 196_608 + 6_144 + 1_536),
        # auto_awq.py AutoAWQMoEMethod: w13_qweight [4, 256, 256/8] + w2 [4, 128, 256/8] int32 =
        # 196,608; scales 6,144; qzeros 1,536.
        (AWQ, 196_608 + 6_144 + 1_536),
        # modelopt.py ModelOptNvFp4FusedMoE: w13 [4, 256, 128] + w2 [4, 256, 64] uint8 = 196,608;
        # scales [4, 256, 16] + [4, 256, 8] fp8 = 24,576; weight_scale_2 [4, 2] + [4] fp32 = 48;
        # input_scale [4, 2] + [4] fp32 = 48.
        (MODELOPT_NVFP4, 196_608 + 24_576 + 48 + 48),
        # compressed_tensors_moe_w4a4_mxfp4.py: w13 [4, 256, 128] + w2 [4, 256, 64] uint8 = 196,608;
        # scales [4, 256, 8] + [4, 256, 4] uint8 = 12,288.
        (CT_MXFP4, 196_608 + 12_288),
    ],
    ids=["fp8-block", "ct-w4a16", "gptq", "awq", "modelopt-nvfp4", "ct-mxfp4"],
)
def test_experts_bytes_per_rank(quant, expected):
    arch = _arch(TINY_MOE, quant)
    assert _rank(_experts(arch)) == expected


def test_expert_parallel_holds_whole_experts():
    # EP over 2 ranks: 2 experts with the full intermediate 256; fp8 block: 2 x 3 x 256 x 256 =
    # 393,216 weights; scales per expert 2*2*2 + 2*2 = 12 fp32, x 2 experts = 96.
    arch = _arch(TINY_MOE, FP8_BLOCK)
    assert _rank(_experts(arch), expert_parallel=True) == 393_216 + 96


# --- gpt-oss MXFP4: vLLM's padding of the expert dimensions per GPU --------------------------------


def test_gpt_oss_experts_are_padded_for_the_gpus_moe_kernel():
    # gpt-oss-120b: 128 experts, hidden 2880, intermediate 2880 (720 per rank at TP4).
    (experts,) = [g for g in load_model("gpt-oss-120b").layers[0].params if g.role == Role.ROUTED_EXPERT]
    # Unknown GPU: the checkpoint's own sizes. Per expert: w13 [1440, 2880/2] + w2 [2880, 360] uint8
    # = 2,073,600 + 1,036,800; scales [1440, 90] + [2880, 22] uint8 = 129,600 + 63,360 (720/32 = 22.5
    # floors to 22); biases [1440] + [2880] bf16 = 8,640.
    assert _rank(experts, tp=4) == 128 * (2_073_600 + 1_036_800 + 129_600 + 63_360 + 8_640)
    # B200 (TRT-LLM MXFP4 MoE): hidden to 3072, intermediate 720 to 768. w13 [1536, 1536] =
    # 2,359,296; scale [1536, 96] = 147,456; w2 [3072, 384] = 1,179,648; scale [3072, 24] = 73,728;
    # biases (1536 + 3072) bf16 = 9,216.
    assert _rank(experts, tp=4, mxfp4_backend=mxfp4_moe_backend(10.0)) == 128 * (2_359_296 + 147_456 + 1_179_648 + 73_728 + 9_216)
    # A100 (Marlin): the same rounding (hidden 256, intermediate 128).
    assert _rank(experts, tp=4, mxfp4_backend=mxfp4_moe_backend(8.0)) == _rank(experts, tp=4, mxfp4_backend=mxfp4_moe_backend(10.0))
    # H100 (Triton): intermediate 720 to 768, hidden kept, then the Hopper swizzle: values
    # [1472 (1440 to 64), 1536 (to 256)] + [384, 3072 (2880 to 256)] = 2,260,992 + 1,179,648;
    # scales [1536, 92 (90 to 4)] + [3072, 24] = 141,312 + 73,728; biases fp32 (1536 + 2880) x 4 = 17,664.
    assert _rank(experts, tp=4, mxfp4_backend=mxfp4_moe_backend(9.0)) == 128 * (2_260_992 + 1_179_648 + 141_312 + 73_728 + 17_664)
    # H100 without the Triton backend's kernels (vLLM 0.10.2 and 0.11.0, Release.vendors_triton_kernels):
    # Marlin, padded as on A100.
    marlin_on_hopper = _rank(experts, tp=4, mxfp4_backend=mxfp4_moe_backend(9.0, triton_kernels=False))
    assert marlin_on_hopper == _rank(experts, tp=4, mxfp4_backend=mxfp4_moe_backend(8.0))


def test_gpt_oss_tp_pads_more_than_expert_parallel_on_hopper():
    arch = load_model("gpt-oss-120b")
    layers = memory.stage_layers(arch, 1)[0]

    def weights(tp, ep):
        return memory.stage_weight_bytes(arch, layers, first=True, last=True, tp=tp, expert_shards=tp,
                                         expert_parallel=ep, mxfp4_backend=mxfp4_moe_backend(9.0))

    # TP2: 1440 to 1472 and TP4: 720 to 768 per rank; with EP the experts keep 2880 (a multiple of 64).
    assert weights(4, False) > weights(4, True)
    assert weights(4, False) / weights(4, True) == pytest.approx(1.04, abs=0.01)
    assert weights(1, False) == weights(1, True)


def test_gpt_oss_120b_on_one_h100_without_the_triton_kernels_matches_marlins_published_log():
    # tests/data/vllm_memory_logs.yaml, vLLM issue #23278 (0.10.1, H100, TP1; "Weight-only FP4
    # compression will be used leveraging the Marlin kernel"): "Model loading took 65.9651 GiB", 1.6 GiB
    # more than the Triton backend's layout. A release before 0.12 falls back to Marlin on SM 9.0 unless
    # triton_kernels is installed beside it (quantization/mxfp4.py get_mxfp4_backend).
    from infra.planning.vllm_release import release

    arch = load_model("gpt-oss-120b")
    layers = memory.stage_layers(arch, 1)[0]

    def loaded(version: str) -> float:
        return memory.stage_weight_bytes(arch, layers, first=True, last=True, tp=1, expert_shards=1,
                                         mxfp4_backend=mxfp4_moe_backend(9.0, release(version).vendors_triton_kernels)) / GiB  # fmt: skip

    assert loaded("0.10.2") == pytest.approx(65.9651, rel=0.01)
    assert loaded("0.11.0") == loaded("0.10.2")
    assert loaded("0.12.0") == pytest.approx(64.38, rel=0.01)  # the Triton backend's (issue #33155)


def test_a_plan_for_an_older_release_holds_marlins_experts_and_a_newer_one_the_triton_layout():
    """One process planning gpt-oss-120b on an H100 node for 0.11.0, 0.12.0 and 0.11.0 again (the
    layout's figures are cached per model): each plan holds its release's experts on a GPU, Marlin's
    padding before 0.12 and the Triton layout from it, as the memory model gives them for that split."""
    arch = load_model("gpt-oss-120b")
    plans = [make_plan(PlanRequest(model="gpt-oss-120b", instance_type="p5.48xlarge", nodes=1, tp=8, max_model_len=8192,
                                   vllm_version=v)) for v in ("0.11.0", "0.12.0", "0.11.0")]  # fmt: skip
    assert all(p.feasible for p in plans) and {(p.layout.tp, p.layout.dp) for p in plans} == {(8, 1)}

    def experts(triton_kernels: bool) -> int:
        return memory.stage_weight_bytes(arch, memory.stage_layers(arch, 1)[0], first=True, last=True, tp=8, expert_shards=8,
                                         routed=True, mxfp4_backend=mxfp4_moe_backend(9.0, triton_kernels))  # fmt: skip

    held = [p.constrained.weights_bytes for p in plans]
    assert held[0] - held[1] == experts(False) - experts(True) > 0
    assert held[2] == held[0]
    # The same model object evaluated under each release in turn (its figures are cached per object):
    from infra.catalog.instances import INSTANCE_TYPES
    from infra.planning.layout import evaluate

    again = [evaluate(arch, INSTANCE_TYPES["p5.48xlarge"], 1, p.layout, p.knobs).stages[0].weights_bytes for p in plans]
    assert again == held


def test_gpt_oss_120b_on_one_h100_matches_the_published_log():
    # tests/data/vllm_memory_logs.yaml, vLLM issue #33155 (0.14.1, H100, TP1, "Using Triton backend"):
    # "Model loading took 64.38 GiB". The checkpoint itself is 60.8 GiB: the difference is the
    # Triton kernels' Hopper layout and the biases turned fp32.
    arch = load_model("gpt-oss-120b")
    layers = memory.stage_layers(arch, 1)[0]
    loaded = memory.stage_weight_bytes(arch, layers, first=True, last=True, tp=1, expert_shards=1, mxfp4_backend=mxfp4_moe_backend(9.0))
    assert loaded / GiB == pytest.approx(64.38, rel=0.01)
    assert weight_bytes(arch) / GiB == pytest.approx(60.8, rel=0.01)


# --- Published checkpoints against published figures -------------------------------------------------


def _loaded(name_or_arch, tp: int, cc: float | None = None) -> float:
    arch = load_model(name_or_arch) if isinstance(name_or_arch, str) else name_or_arch
    layers = memory.stage_layers(arch, 1)[0]
    return memory.stage_weight_bytes(arch, layers, first=True, last=True, tp=tp, expert_shards=tp, mxfp4_backend=mxfp4_moe_backend(cc)) / GiB


def test_qwen3_235b_fp8_is_planned_in_fp8():
    # tests/data/vllm_memory_logs.yaml, vLLM PR #21429 (TP4): "weights memory: 55.13GiB" per rank.
    arch = load_model("qwen3-235b-a22b-fp8")
    assert arch.weight_format == "fp8"
    assert 230e9 < weight_bytes(arch) < 240e9  # ~236 GB, not the 470 GB of bf16
    assert _loaded(arch, 4) == pytest.approx(55.13, rel=0.005)
    # modules_to_not_convert keeps the 94 routers and lm_head in bf16.
    routers = [g for layer in arch.layers for g in layer.params if g.role == Role.OTHER and g.count == 4096 * 128]
    assert len(routers) == 94 and all(g.scheme is None and g.fmt == "bf16" for g in routers)
    assert arch.lm_head.scheme is None and arch.lm_head.fmt == "bf16"


def test_qwen3_235b_fp8_fits_tp4_on_p5():
    plan = make_plan(PlanRequest(model="qwen3-235b-a22b-fp8", instance_type="p5.48xlarge", nodes=1, tp=4))
    assert plan.feasible, plan.errors
    assert plan.layout.tp == 4 and plan.layout.dp == 2 and plan.layout.expert_parallel
    # vLLM's expert-parallel group is TP x DP = 8 GPUs (fused_moe/config.py FusedMoEParallelConfig
    # .make): 16 of the 128 experts on each, where a lone TP 4 replica would hold 32 (55.12 GiB in
    # all). One expert, by hand: 3 x 4096 x 1536 FP8 weights and a float32 scale per 128 x 128
    # block (24 x 32 for gate and up, 32 x 12 for down), in each of the 94 layers.
    expert = 3 * 4096 * 1536 + (24 * 32 + 32 * 12) * 4
    assert plan.constrained.weights_bytes / GiB == pytest.approx(55.12 - 16 * 94 * expert / GiB, abs=0.05)
    # Its Hugging Face id resolves to the same entry.
    assert load_model("Qwen/Qwen3-235B-A22B-FP8").name == "qwen3-235b-a22b-fp8"


def test_llama_70b_fp8_dynamic_matches_the_published_log():
    # tests/data/vllm_memory_logs.yaml: RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic (Llama-3.1-70B
    # shapes), vLLM 0.19.0 on H100: weights 33.88 GiB at TP2, 16.96 GiB at TP4. Its scheme:
    # compressed-tensors FP8 weights per channel, dynamic per-token activations, lm_head ignored.
    cfg = json.loads((CONFIG_DIR / "llama-3.1-70b.json").read_text())
    arch = parse_config({**cfg, "quantization_config": CT_FP8_CHANNEL}, "llama-70b-fp8-dynamic", "test")
    assert _loaded(arch, 2) == pytest.approx(33.88, rel=0.005)
    assert _loaded(arch, 4) == pytest.approx(16.96, rel=0.005)


def test_nvfp4_modelopt_checkpoint_reads_hf_quant_config():
    arch = load_model("qwen3-235b-a22b-nvfp4")
    assert "hf_quant_config.json" in arch.source
    assert arch.weight_format == "nvfp4"
    # exclude_modules lists every router and lm_head; ModelOpt would quantise them otherwise.
    assert arch.lm_head.scheme is None
    routed = [g for layer in arch.layers for g in layer.params if g.role == Role.ROUTED_EXPERT]
    assert all(g.scheme is not None and g.scheme.kind == "nvfp4" for g in routed)
    # 4.5 bits per weight plus fp8 scales: well under the fp8 checkpoint.
    assert 0.5 < weight_bytes(arch) / weight_bytes(load_model("qwen3-235b-a22b-fp8")) < 0.6


def test_nvfp4_from_a_model_directory(tmp_path, fixture_file):
    folder = fixture_file("models", "nvidia--Qwen3-235B-A22B-NVFP4")
    for name in ("config.json", "hf_quant_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    arch = load_model(str(tmp_path))
    assert weight_bytes(arch) == weight_bytes(load_model("qwen3-235b-a22b-nvfp4"))
    (tmp_path / "hf_quant_config.json").unlink()
    assert load_model(str(tmp_path)).weight_format == "bf16"  # without the file vLLM loads it unquantised too


def test_kimi_k25_w4a16_routed_experts_only():
    # compressed-tensors W4A16 (group 32, symmetric) with ignore covering attention, shared
    # experts, the dense MLP and lm_head: only routed experts are INT4.
    arch = load_model("kimi-k2.5")
    assert arch.weight_format == "bf16+int4 experts"
    groups = [g for layer in arch.layers for g in layer.params]
    assert {g.scheme.kind for g in groups if g.role == Role.ROUTED_EXPERT} == {"wna16"}
    assert all(g.scheme is None for g in groups if g.role in (Role.ATTENTION, Role.SHARED_EXPERT, Role.DENSE_MLP))
    # ~1T parameters, most at 4 bits + a bf16 scale per 32: about 0.6 TB.
    assert 560e9 < weight_bytes(arch) < 620e9


def test_awq_and_gptq_checkpoints():
    awq = load_model("qwen3-32b-awq")
    assert awq.weight_format == "int4"
    assert {g.scheme.kind for layer in awq.layers for g in layer.params if g.scheme} == {"awq"}
    gptq = load_model("qwen3-30b-a3b-gptq-int4")
    assert gptq.weight_format == "int4"
    routers = [g for layer in gptq.layers for g in layer.params if g.role == Role.OTHER and g.count == 2048 * 128]
    assert routers and all(g.scheme is None for g in routers)  # the router stays in the model dtype
    # 4-bit weights + fp16 scale and 4-bit zero per 128: about a quarter of bf16 for the converted layers.
    assert weight_bytes(gptq) < 0.6 * weight_bytes(load_model("qwen3-30b-a3b"))


def test_reconstructed_catalog_entries_say_so():
    for name in ("qwen3-32b-awq", "qwen3-30b-a3b-gptq-int4"):
        assert "RECONSTRUCTED" in CATALOG[name].published_source


# --- ignore lists and refusals ------------------------------------------------------------------------


def test_modules_to_not_convert_keeps_a_layer_in_bf16():
    quant = {**FP8_BLOCK, "modules_to_not_convert": ["model.layers.0.self_attn.o_proj"]}
    arch = _arch(TINY_LLAMA, quant)
    o = [g for g in arch.layers[0].params if g.role == Role.ATTENTION and g.count == 256 * 256 and g.scheme is None]
    assert o and o[0].fmt == "bf16"
    assert _qkv(arch).scheme is not None


def test_compressed_tensors_regex_ignore():
    quant = {**CT_W4A16, "ignore": ["lm_head", "re:.*self_attn.*"]}
    arch = _arch(TINY_LLAMA, quant)
    assert all(g.scheme is None for g in arch.layers[0].params if g.role == Role.ATTENTION)
    assert all(g.scheme is not None for g in arch.layers[0].params if g.role == Role.DENSE_MLP)


def test_half_ignored_fused_layer_is_refused():
    quant = {**FP8_BLOCK, "modules_to_not_convert": ["model.layers.0.self_attn.k_proj"]}
    with pytest.raises(UserError, match="some but not all"):
        _arch(TINY_LLAMA, quant)


def test_gptq_act_order_is_refused_as_vllm_does():
    with pytest.raises(UserError, match="desc_act"):
        _arch(TINY_LLAMA, {**GPTQ, "desc_act": True})


def test_unknown_quant_method_is_a_user_error():
    with pytest.raises(UserError, match="quant_method 'bitsandbytes'"):
        _arch(TINY_LLAMA, {"quant_method": "bitsandbytes"})


def test_models_without_a_converted_layer_scheme_are_costed_as_before():
    # Unquantised checkpoints, and the DeepSeek / Kimi families whose FP8 and MXFP4 layers keep
    # the per-parameter cost of infra.catalog.formats: no group carries a vLLM scheme.
    for name in ("qwen3-235b-a22b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3", "kimi-k3"):
        arch = load_model(name)
        assert all(g.scheme is None for layer in arch.layers for g in layer.params), name
    assert parse_quant_config({"model_type": "llama"}) is None


def test_block_fp8_experts_that_vllm_refuses_at_tp8_need_expert_parallel():
    """Qwen3-235B-A22B-FP8: 1536 expert columns / TP8 = 192, not a multiple of the 128x128
    block (vLLM fp8_utils.validate_fp8_block_shape_moe); whole experts per rank (EP) are fine."""
    from infra.catalog.instances import get_instance_type
    from infra.catalog.models import load_model
    from infra.planning.layout import Layout, layout_errors

    arch = load_model("qwen3-235b-a22b-fp8")
    itype = get_instance_type("p5.48xlarge")
    assert arch.moe_intermediate_size // 8 == 192
    refused = layout_errors(arch, itype, 1, Layout(tp=8, pp=1, dp=1, expert_parallel=False, kv_cache_dtype="auto"))
    assert any("FP8 block 128x128" in e for e in refused)
    assert layout_errors(arch, itype, 1, Layout(tp=8, pp=1, dp=1, expert_parallel=True, kv_cache_dtype="auto")) == []
    # With data parallel vLLM 0.34 splits the experts over TP x DP (fused_moe/config.py
    # flatten_tp_across_dp_and_pcp): TP 4 x DP 2 leaves the same 192 columns as TP 8.
    refused = layout_errors(arch, itype, 1, Layout(tp=4, pp=1, dp=2, expert_parallel=False, kv_cache_dtype="auto"))
    assert any("TP 4 x DP 2 leaves 192" in e and "FP8 block 128x128" in e for e in refused), refused
    assert layout_errors(arch, itype, 1, Layout(tp=4, pp=1, dp=2, expert_parallel=True, kv_cache_dtype="auto")) == []
    # The block_k check follows the attention's TP alone: TP 1 x DP 8 leaves 192, not a multiple of block_n.
    refused = layout_errors(arch, itype, 1, Layout(tp=1, pp=1, dp=8, expert_parallel=False, kv_cache_dtype="auto"))
    assert any("TP 1 x DP 8 leaves 192" in e for e in refused), refused


def test_replicas_split_quantised_experts_over_every_gpu_and_the_fullest_holds_the_remainder() -> None:
    """vLLM's MoE layers split experts over TP x DP GPUs (fused_moe/config.py
    FusedMoEParallelConfig.make): without expert parallel each GPU holds 1/(TP x DP) of every
    expert's columns; with it whole experts, the remainder going to the first GPUs
    (expert_map_manager.py determine_expert_map): 128 experts over 6 GPUs leave 22 on the fullest."""
    arch = load_model("qwen3-235b-a22b-fp8")
    g = next(g for layer in arch.layers for g in layer.params if g.role == Role.ROUTED_EXPERT)
    whole = memory.group_bytes_per_rank(g, 1, 1)
    # TP 2 x DP 2 without expert parallel: 1,536 columns over 4 GPUs, 384 each (three 128-wide
    # FP8 blocks, so the scales divide too).
    assert memory.group_bytes_per_rank(g, 2, 4) == pytest.approx(whole / 4, rel=1e-12)
    # Expert parallel over 6 GPUs (TP 2 x DP 3): the fullest holds 22 of the 128.
    assert memory.group_bytes_per_rank(g, 2, 6, expert_parallel=True) == pytest.approx(whole * 22 / 128, rel=1e-12)


def test_unquantised_experts_over_an_uneven_expert_parallel_group_charge_the_fullest_gpu() -> None:
    """Qwen3-30B-A3B (bf16) on five one-GPU nodes: expert parallel over TP 1 x DP 5 puts 26 of its
    128 experts on the fullest GPU (128 = 5 x 25 + 3). One expert of one layer, by hand: gate, up
    and down projections of 2,048 x 768, two bytes each; 48 layers."""
    plan = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="g7e.2xlarge", nodes=5, max_model_len=4096))
    assert plan.feasible and plan.layout.expert_parallel and plan.layout.dp == 5
    expert = 3 * 2048 * 768 * 2
    rest = weight_bytes(plan.model) - 128 * 48 * expert  # attention, router, norms, embedding, LM head
    assert plan.constrained.weights_bytes == pytest.approx(rest + 26 * 48 * expert, abs=4096)
