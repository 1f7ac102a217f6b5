"""Quantised checkpoints: what a config's `quantization_config` says, and what vLLM makes of it.

`parse_quant_config` reads the block (or the `quantization` block of an
`hf_quant_config.json` that the loader merged in) into a `QuantConfig`. Its
`linear(names)`, `experts(prefix)` and `lm_head()` answer, for one module named
as in the checkpoint, the `Scheme` vLLM quantises it with, or None when the
module stays in the model dtype: listed in `ignore` / `modules_to_not_convert` /
`exclude_modules`, or a kind of module the method leaves alone.

`linear_bytes` and `experts_bytes` add up, from the per-rank shapes, every
parameter the scheme's `create_weights` registers in vLLM 0.34.0 (weights,
scales, zero points, global scales, shape tensors), so a rank's figure is what
vLLM allocates for it. Each scheme names the function it follows.

Only the parameters vLLM creates are counted: kernels that repack weights after
loading (Marlin repacking, swizzled scale layouts) are left out, except for
gpt-oss's MXFP4 MoE: the padding vLLM chooses before `create_weights` for the
GPU's kernel (`mxfp4_moe_backend`) and the Triton kernels' Hopper layout.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from infra.errors import UserError

FP32 = 4
INT32 = 4
INT64 = 8


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


@dataclass(frozen=True)
class Scheme:
    """How vLLM stores one quantised linear layer or FusedMoE.

    kind: "fp8" (FP8 E4M3 weights), "int8", "wna16" (compressed-tensors pack-quantized
    INT weights, bf16 activations), "awq", "gptq", "nvfp4", "mxfp4" (compressed-tensors
    MXFP4) or "gpt_oss_mxfp4" (the `mxfp4` method of gpt-oss checkpoints).
    """

    kind: str
    fmt: str  # infra.catalog.formats key used for labels: fp8, int8, int4, nvfp4, mxfp4
    strategy: str = ""  # fp8 / int8: "block", "channel" or "tensor"
    block: tuple[int, int] = (128, 128)  # fp8 block strategy: (block_n, block_k)
    bits: int = 4  # wna16 / awq / gptq
    group_size: int = 128  # wna16 / awq / gptq: weights per scale along the input; -1 channelwise
    symmetric: bool = True  # wna16: False adds packed zero points
    static_input: bool = False  # fp8 / int8: a static activation scale per shard
    input_global_scale: bool = True  # nvfp4: W4A4 (True) or W4A16 (False)
    param_bytes: int = 2  # vLLM's params_dtype (the model dtype) for scales kept in it
    source: str = ""

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits


# --- Bytes of the parameters vLLM creates, per rank --------------------------------


def linear_bytes(s: Scheme, parts: tuple[int, ...], k: int, k_full: int) -> int:
    """One linear layer on one rank: `parts` its output partition sizes on the rank
    (q, k, v of a QKVParallelLinear; gate, up of a MergedColumnParallelLinear),
    `k` its input size on the rank, `k_full` the whole input size (they differ
    for a row-parallel layer)."""
    n, shards = sum(parts), len(parts)
    row_parallel = k != k_full
    if s.kind == "fp8":
        # utils/fp8_utils.py create_fp8_weight_parameter ([N, K] float8_e4m3fn) and
        # create_fp8_scale_parameter: block [cdiv(N, bn), cdiv(K, bk)], channel [N, 1],
        # tensor [#shards], all fp32 (Fp8LinearMethod.create_weights registers the block
        # scale as `weight_scale_inv`); create_fp8_input_scale [#shards] fp32 when static.
        # The same shapes in compressed_tensors_w8a8_fp8.py CompressedTensorsW8A8Fp8.create_weights
        # and modelopt.py KFp8StaticTensor.create_weights.
        scale = {
            "block": cdiv(n, s.block[0]) * cdiv(k, s.block[1]),
            "channel": n,
            "tensor": shards,
        }[s.strategy]
        return n * k + FP32 * scale + (FP32 * shards if s.static_input else 0)
    if s.kind == "int8":
        # compressed_tensors_w8a8_int8.py CompressedTensorsW8A8Int8.create_weights: weight
        # [N, K] int8, weight_scale [N, 1] (channel) or [#shards] (tensor) fp32, a static
        # input_scale [1] fp32.
        scale = n if s.strategy == "channel" else shards
        return n * k + FP32 * scale + (FP32 if s.static_input else 0)
    if s.kind == "wna16":
        # compressed_tensors_wNa16.py CompressedTensorsWNA16.create_weights: weight_packed
        # [N, ceil(K * bits / 32)] int32; weight_scale [N, groups] params_dtype; with
        # asymmetric weights weight_zero_point [ceil(N * bits / 32), groups] int32;
        # weight_shape [2] int64. groups = K / group_size on the rank, except a channelwise
        # row-parallel layer, whose one scale per row is repeated on every rank.
        group = s.group_size if s.group_size != -1 else k_full
        partition = not (s.group_size == -1 and row_parallel)
        groups = (k if partition else k_full) // group
        total = INT32 * n * math.ceil(k * s.bits / 32) + s.param_bytes * n * groups + INT64 * 2
        if not s.symmetric:
            total += INT32 * math.ceil(n * s.bits / 32) * groups
        return total
    if s.kind == "awq":
        # auto_awq.py AutoAWQMarlinLinearMethod.create_weights (and BaseAWQLinearMethod):
        # qweight [K, N / pack] int32, qzeros [K / g, N / pack] int32 (always, zero_point
        # or not), scales [K / g, N] params_dtype.
        group = s.group_size if s.group_size != -1 else k_full
        groups = k // group
        return INT32 * k * (n // s.pack_factor) + INT32 * groups * (n // s.pack_factor) + s.param_bytes * groups * n
    if s.kind == "gptq":
        # auto_gptq.py AutoGPTQLinearMethod.create_weights: qweight [K / pack, N] int32,
        # scales [groups, N] params_dtype, qzeros [groups, N / pack] int32; groups =
        # K / g on the rank, or one row repeated on every rank for a channelwise
        # row-parallel layer (marlin_repeat_scales_on_all_ranks). No g_idx: vLLM 0.34
        # refuses desc_act with groups (gptq_utils.normalize_and_validate_gptq_desc_act).
        group = s.group_size if s.group_size != -1 else k_full
        groups = k_full // group if (s.group_size == -1 and row_parallel) else k // group
        return INT32 * (k // s.pack_factor) * n + s.param_bytes * groups * n + INT32 * groups * (n // s.pack_factor)
    if s.kind == "nvfp4":
        # compressed_tensors_w4a4_nvfp4.py CompressedTensorsW4A4Fp4.create_weights and
        # modelopt.py KNvfp4Static / KNvfp4Dynamic.create_weights: weight [N, K / 2] uint8,
        # block scale [N, K / 16] float8_e4m3fn, global weight scale [#shards] fp32, and
        # for W4A4 a global input scale [#shards] fp32.
        return n * (k // 2) + n * (k // 16) + FP32 * shards + (FP32 * shards if s.input_global_scale else 0)
    if s.kind == "mxfp4":
        # compressed_tensors_w4a4_mxfp4.py CompressedTensorsW4A4Mxfp4.create_weights:
        # weight_packed [N, K / 2] uint8, weight_scale [N, K / 32] uint8 (E8M0).
        return n * (k // 2) + n * (k // 32)
    raise ValueError(f"no linear layout for scheme {s.kind!r}")


def experts_bytes(s: Scheme, experts: int, hidden: int, inter: int, *, bias: bool = False, bias_bytes: int = 2) -> int:
    """One FusedMoE on one rank: `experts` local experts, each a gate/up w13 of
    2 x inter by hidden and a down w2 of hidden by inter (inter: per rank)."""
    e, h, i = experts, hidden, inter
    if s.kind == "fp8":
        # fp8.py Fp8MoEMethod.create_weights: w13 [E, 2I, H], w2 [E, H, I] float8_e4m3fn;
        # block scales w13 [E, 2 cdiv(I, bn), cdiv(H, bk)], w2 [E, cdiv(H, bn), cdiv(I, bk)],
        # per-tensor [E, 2] and [E], fp32; static input scales [E] each.
        # compressed_tensors_moe_w8a8_fp8.py adds the channel strategy: [E, 2I, 1], [E, H, 1].
        bn, bk = s.block
        scale = {
            "block": 2 * cdiv(i, bn) * cdiv(h, bk) + cdiv(h, bn) * cdiv(i, bk),
            "channel": 2 * i + h,
            "tensor": 3,
        }[s.strategy]
        return e * 3 * h * i + FP32 * e * scale + (FP32 * 2 * e if s.static_input else 0)
    if s.kind == "int8":
        # compressed_tensors_moe_w8a8_int8.py: int8 weights, channel scales [E, 2I, 1] and
        # [E, H, 1] fp32 (ASSUMPTION: laid out as the FP8 channel case).
        return e * 3 * h * i + FP32 * e * (2 * i + h)
    if s.kind == "wna16":
        # compressed_tensors_moe_wna16.py CompressedTensorsWNA16MoEMethod.get_weight_shape /
        # create_weights: w13_weight_packed [E, 2I, H / pack], w2 [E, H, I / pack] int32;
        # scales [E, 2I, H / g] and [E, H, I / g] params_dtype (one group when channelwise);
        # asymmetric: zero points [E, 2I / pack, H / g], [E, H / pack, I / g] int32;
        # w13/w2_weight_shape [E, 2] each in the default (model) dtype.
        pf = s.pack_factor
        g13, g2 = (1, 1) if s.group_size == -1 else (h // s.group_size, i // s.group_size)
        total = INT32 * e * (2 * i * (h // pf) + h * (i // pf))
        total += s.param_bytes * e * (2 * i * g13 + h * g2)
        if not s.symmetric:
            total += INT32 * e * ((2 * i // pf) * g13 + (h // pf) * g2)
        return total + s.param_bytes * 2 * e * 2
    if s.kind in ("awq", "gptq"):
        # auto_awq.py AutoAWQMoEMethod.create_weights: w13_qweight [E, H, 2I / pack],
        # w2_qweight [E, I, H / pack]; auto_gptq.py AutoGPTQMoEMethod.create_weights:
        # [E, H / pack, 2I], [E, I / pack, H] (int32, the same bytes). Both: scales
        # [E, H / g, 2I] and [E, I / g, H] params_dtype, qzeros [E, H / g, 2I / pack] and
        # [E, I / g, H / pack] int32. GPTQ's zero-initialised expert biases are dropped
        # after loading when the checkpoint has none.
        pf = s.pack_factor
        g13, g2 = (1, 1) if s.group_size == -1 else (h // s.group_size, i // s.group_size)
        total = INT32 * e * (h * (2 * i // pf) + i * (h // pf))
        total += s.param_bytes * e * (g13 * 2 * i + g2 * h)
        total += INT32 * e * (g13 * (2 * i // pf) + g2 * (h // pf))
        return total
    if s.kind == "nvfp4":
        # compressed_tensors_moe_w4a4_nvfp4.py CompressedTensorsW4A4Nvfp4MoEMethod.create_weights
        # and modelopt.py ModelOptNvFp4FusedMoE.create_weights: w13 [E, 2I, H / 2], w2
        # [E, H, I / 2] uint8; block scales [E, 2I, H / 16], [E, H, I / 16] float8_e4m3fn;
        # global weight scales [E, 2] and [E] fp32; input scales [E, 2] and [E] fp32.
        total = e * (2 * i * (h // 2) + h * (i // 2)) + e * (2 * i * (h // 16) + h * (i // 16))
        return total + FP32 * 3 * e + (FP32 * 3 * e if s.input_global_scale else 0)
    if s.kind in ("mxfp4", "gpt_oss_mxfp4"):
        # compressed_tensors_moe_w4a4_mxfp4.py and mxfp4.py GptOssMxfp4MoEMethod.create_weights:
        # w13 [E, 2I, H / 2], w2 [E, H, I / 2] uint8; scales [E, 2I, H / 32], [E, H, I / 32]
        # uint8; gpt-oss adds biases w13_bias [E, 2I] and w2_bias [E, H].
        total = e * (2 * i * (h // 2) + h * (i // 2)) + e * (2 * i * (h // 32) + h * (i // 32))
        if bias:
            total += bias_bytes * e * (2 * i + h)
        return total
    raise ValueError(f"no FusedMoE layout for scheme {s.kind!r}")


def mxfp4_moe_backend(compute_capability: float | None, triton_kernels: bool = True) -> str:
    """The MXFP4 MoE backend vLLM picks for gpt-oss on a GPU of this compute capability:
    "trtllm", "triton", "marlin", or "none" when the GPU is not known. `triton_kernels`: whether
    the Triton backend's kernels are there (Release.vendors_triton_kernels): without them vLLM
    0.10.2 and 0.11.0 run MARLIN on SM 9.0 too (quantization/mxfp4.py get_mxfp4_backend:
    `not has_triton_kernels()` -> Mxfp4Backend.MARLIN).

    fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend takes the first backend of
    _get_priority_backends_for_gpt_oss whose kernels run on the device:
    FLASHINFER_TRTLLM_MXFP4_BF16 on the SM100 family (TrtLlmMxfp4Experts, B200); TRITON
    on 9.0 <= cc < 13 (OAITritonExperts, H100 / H200; on SM110 and SM12x it is moved after
    MARLIN); below SM90 (A100, A10G, L40S) neither TRITON nor the FlashInfer / CUTLASS
    MXFP4 kernels run, and MARLIN is the first that does.
    """
    if compute_capability is None:
        return "none"
    if 10.0 <= compute_capability < 11.0:
        return "trtllm"
    if 9.0 <= compute_capability < 10.0:
        return "triton" if triton_kernels else "marlin"
    return "marlin"


# (hidden multiple, intermediate-per-rank multiple) per backend: fused_moe/oracle/mxfp4.py
# mxfp4_round_up_hidden_size_and_intermediate_size, which GptOssMxfp4MoEMethod.maybe_roundup_sizes
# (quantization/mxfp4.py) applies before create_weights: TRTLLM hidden 256 / intermediate 128,
# MARLIN 256 / 128, TRITON (its `else` branch) intermediate 64 and hidden unchanged.
MXFP4_MOE_ALIGNMENT = {"none": (1, 1), "trtllm": (256, 128), "marlin": (256, 128), "triton": (1, 64)}


def _triton_hopper_expert_bytes(hidden: int, inter: int) -> int:
    """One expert's MXFP4 weights and scales after the OAI Triton kernels' Hopper swizzle.

    convert_gpt_oss_weight_to_mxfp4_moe_kernel_format (TRITON) runs
    quantization/utils/mxfp4_utils.py _swizzle_mxfp4, which on SM90 pads the scale groups
    to a multiple of 4, and store_params_in_triton keeps the swizzled tensors as the
    parameters. The layouts are triton_kernels' HopperMXValueLayout (values: the packed
    dimension to 64 bytes, the other to 256) and HopperMXScaleLayout (rows to
    2 x num_warps(8) x 2 x 8 = 256). ASSUMPTION: the triton_kernels package, which vLLM
    prefers over its vendored copy (import_utils.import_triton_kernels), pads values so;
    the copy vendored in vLLM 0.34 pads them only to 16 x 32 bytes (for gpt-oss-120b
    about 3 GiB less on one GPU). A vLLM 0.14.1 H100 log ("Model loading took 64.38 GiB",
    TP 1, Triton backend) agrees with this layout within 0.2%.
    """
    h, i = hidden, inter
    values = round_up(h // 2, 64) * round_up(2 * i, 256) + round_up(i // 2, 64) * round_up(h, 256)
    scales = round_up(2 * i, 256) * round_up(h // 32, 4) + round_up(h, 256) * round_up(i // 32, 4)
    return values + scales


def _gpt_oss_experts_bytes(s: Scheme, experts: int, hidden: int, inter: int, backend: str) -> int:
    """gpt-oss's MXFP4 FusedMoE on one rank, padded for `backend` (see mxfp4_moe_backend)."""
    h_align, i_align = MXFP4_MOE_ALIGNMENT[backend]
    h, i = round_up(hidden, h_align), round_up(inter, i_align)
    if backend != "triton":
        return experts_bytes(s, experts, h, i, bias=True, bias_bytes=2)
    # The TRITON conversion also turns the expert biases into fp32.
    return experts * (_triton_hopper_expert_bytes(h, i) + FP32 * (2 * i + h))


def experts_on_fullest_rank(experts: int, ranks: int) -> int:
    """Whole experts on the fullest of `ranks` expert-parallel ranks: vLLM gives the remainder
    of an uneven split to the first ranks (0.34.0 fused_moe/expert_map_manager.py
    determine_expert_map)."""
    return -(-experts // ranks)


def group_bytes(
    s: Scheme,
    shapes: tuple,
    *,
    tp: int = 1,
    expert_shards: int = 1,
    expert_parallel: bool = False,
    mxfp4_backend: str = "none",
) -> int:
    """Bytes one rank holds of a quantised parameter group (`Linear` / `Experts` shapes).

    Routed experts are split over `expert_shards` ranks, vLLM's TP flattened across DP
    (TP x DP; fused_moe/config.py FusedMoEParallelConfig.make): with expert parallel the
    fullest rank's whole experts (experts_on_fullest_rank), without it every expert with
    inter / expert_shards of its intermediate size (FusedMoE). gpt-oss MXFP4 experts are
    padded for the MoE kernel that runs them (`mxfp4_backend`, as mxfp4_moe_backend picks it for
    the GPU and the release); "none", the checkpoint's own sizes.
    """
    from infra.catalog.arch import Experts, Linear

    total = 0
    for shape in shapes:
        if isinstance(shape, Linear):
            parts, k = shape.per_rank(tp)
            total += linear_bytes(s, parts, k, shape.inputs)
        elif isinstance(shape, Experts):
            if expert_parallel:
                experts, inter = experts_on_fullest_rank(shape.experts, expert_shards), shape.inter
            else:
                experts, inter = shape.experts, shape.inter // expert_shards
            if s.kind == "gpt_oss_mxfp4":
                total += _gpt_oss_experts_bytes(s, experts, shape.hidden, inter, mxfp4_backend)
            else:
                total += experts_bytes(s, experts, shape.hidden, inter, bias=shape.bias)
        else:
            raise TypeError(f"unknown parameter shape {shape!r}")
    return total


# --- Which modules a quantization_config converts -----------------------------------


def _regex_or_equal(name: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


@dataclass(frozen=True)
class QuantConfig:
    """A parsed quantization_config: the scheme(s) and which modules they leave alone."""

    method: str  # fp8, compressed-tensors, modelopt, awq, gptq, mxfp4
    linear_scheme: Scheme | None  # None: the method leaves linear layers unquantised
    moe_scheme: Scheme | None
    ignore: tuple[str, ...] = ()
    match: str = "exact"  # "exact", "substring", "regex" (compressed-tensors), "modelopt", "gptq"
    lm_head_quantized: bool = False
    targets: tuple[str, ...] = ("Linear",)  # compressed-tensors: names / regexes / class names a group targets

    def _ignored(self, name: str) -> bool:
        if self.match == "exact":
            # quant_utils.is_layer_skipped, match_mode "exact" (Fp8Config): the name is listed.
            return name in self.ignore
        if self.match == "substring":
            # match_mode "substring" (AutoAWQConfig): a listed string occurs in the name.
            return any(entry in name for entry in self.ignore)
        if self.match == "regex":
            # compressed_tensors/utils.py should_ignore_layer: equal, or a "re:" regex matches.
            return any(_regex_or_equal(name, entry) for entry in self.ignore)
        if self.match == "modelopt":
            # modelopt.py ModelOptQuantConfigBase.is_layer_excluded: exact, substring, or
            # an fnmatch wildcard.
            return any(entry in name or fnmatch.fnmatch(name, entry) for entry in self.ignore)
        if self.match == "gptq":
            # gptq_utils.is_layer_gptq_quantized: `modules_in_block_to_quantize` lists the
            # quantised modules (substrings); an empty list means all of them.
            return bool(self.ignore) and not any(entry in name for entry in self.ignore)
        raise ValueError(self.match)

    def _targeted(self, name: str) -> bool:
        if self.method != "compressed-tensors":
            return True
        # compressed_tensors/utils.py find_matched_target: a name / regex target, or the
        # module's class name ("Linear" for every LinearBase).
        return any(t == "Linear" or _regex_or_equal(name, t) for t in self.targets)

    def linear(self, names: list[str]) -> Scheme | None:
        """The scheme of a (possibly fused) linear layer given its checkpoint shard names."""
        if self.linear_scheme is None:
            return None
        skipped = [self._ignored(n) or not self._targeted(n) for n in names]
        if any(skipped) != all(skipped):
            raise UserError(
                f"quantization_config converts some but not all of {', '.join(names)}; vLLM requires "
                "the shards of a fused layer to share one scheme"
            )
        return None if all(skipped) else self.linear_scheme

    def experts(self, prefix: str) -> Scheme | None:
        """The scheme of the routed experts `prefix` (e.g. model.layers.3.mlp.experts)."""
        if self.moe_scheme is None:
            return None
        if self.method == "compressed-tensors":
            # CompressedTensorsMoEMethod.get_moe_method looks up expert 0's projections.
            names = [f"{prefix}.0.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
            return None if all(self._ignored(n) or not self._targeted(n) for n in names) else self.moe_scheme
        return None if self._ignored(prefix) else self.moe_scheme

    def lm_head(self) -> Scheme | None:
        """ParallelLMHead: quantised by ModelOpt unless excluded, by AWQ / GPTQ with `lm_head`
        true, by compressed-tensors when a group targets it by name; never by Fp8Config."""
        if self.linear_scheme is None:
            return None
        if self.method == "modelopt":
            return None if self._ignored("lm_head") else self.linear_scheme
        if self.method == "compressed-tensors":
            named = any(t != "Linear" and _regex_or_equal("lm_head", t) for t in self.targets)
            return self.linear_scheme if named and not self._ignored("lm_head") else None
        if self.method in ("awq", "gptq") and self.lm_head_quantized:
            return self.linear_scheme
        return None


def _fp8_block(block) -> tuple[int, int]:
    if not block or len(block) != 2:
        raise UserError(f"quantization_config weight_block_size {block!r} is not [block_n, block_k]")
    return int(block[0]), int(block[1])


def _parse_fp8(q: dict, param_bytes: int) -> QuantConfig:
    # fp8.py Fp8Config.from_config: ignored_layers, else modules_to_not_convert; exact names.
    block = q.get("weight_block_size")
    static = q.get("activation_scheme", "dynamic") == "static"
    scheme = Scheme(
        kind="fp8", fmt="fp8", strategy="block" if block else "tensor",
        block=_fp8_block(block) if block else (128, 128), static_input=static, param_bytes=param_bytes,
        source="fp8.py Fp8LinearMethod.create_weights / Fp8MoEMethod.create_weights",
    )
    ignore = q.get("ignored_layers") or q.get("modules_to_not_convert") or []
    return QuantConfig("fp8", scheme, scheme, tuple(str(x).strip() for x in ignore), "exact")


def _ct_args(group: dict) -> tuple[dict, dict | None]:
    weights = group.get("weights") or {}
    return weights, group.get("input_activations")


def _parse_compressed_tensors(q: dict, param_bytes: int) -> QuantConfig:
    groups = {
        k: v for k, v in (q.get("config_groups") or {}).items()
        # CompressedTensorsConfig.from_config drops groups that only target an Attention module.
        if not (len(v.get("targets") or []) == 1 and str(v["targets"][0]).endswith("Attention"))
    }
    if len(groups) != 1:
        raise UserError(
            f"compressed-tensors quantization_config with {len(groups)} config groups: only one "
            "scheme per checkpoint is supported by the planner"
        )
    group = next(iter(groups.values()))
    weights, inputs = _ct_args(group)
    fmt = str(group.get("format") or q.get("format") or "")
    bits, wtype = int(weights.get("num_bits", 8)), weights.get("type", "int")
    strategy, gsize = weights.get("strategy"), weights.get("group_size")
    symmetric = bool(weights.get("symmetric", True))
    source = "compressed_tensors/compressed_tensors.py CompressedTensorsConfig._get_scheme_from_parts"
    if bits == 4 and wtype == "float" and strategy == "tensor_group" and gsize == 16:
        scheme = Scheme("nvfp4", "nvfp4", input_global_scale=inputs is not None, param_bytes=param_bytes,
                        source=source + " -> CompressedTensorsW4A4Fp4")
    elif bits == 4 and wtype == "float" and strategy == "group" and gsize == 32:
        scheme = Scheme("mxfp4", "mxfp4", param_bytes=param_bytes, source=source + " -> CompressedTensorsW4A4Mxfp4")
    elif inputs is None and strategy in ("group", "channel") and fmt == "pack-quantized":
        scheme = Scheme(
            "wna16", f"int{bits}" if bits in (4, 8) else "int4", bits=bits,
            group_size=-1 if strategy == "channel" else int(gsize), symmetric=symmetric,
            param_bytes=param_bytes, source=source + " -> CompressedTensorsWNA16",
        )
    elif bits == 8 and inputs is not None and strategy in ("tensor", "channel", "block"):
        static = not bool(inputs.get("dynamic", True))
        kind = "fp8" if wtype == "float" else "int8"
        block = tuple(weights.get("block_structure") or (128, 128))
        scheme = Scheme(kind, kind, strategy=strategy, block=_fp8_block(block), static_input=static,
                        param_bytes=param_bytes, source=source + f" -> CompressedTensorsW8A8{kind.capitalize()}")
    else:
        raise UserError(
            f"compressed-tensors scheme not supported by the planner: format {fmt!r}, weights "
            f"{bits}-bit {wtype} {strategy} group {gsize}, activations {'quantised' if inputs else 'none'}"
        )
    targets = tuple(str(t) for t in group.get("targets") or ["Linear"])
    return QuantConfig("compressed-tensors", scheme, scheme, tuple(q.get("ignore") or []), "regex", targets=targets)


def _parse_modelopt(q: dict, param_bytes: int) -> QuantConfig:
    # modelopt.py ModelOptQuantConfigBase.from_config: hf_quant_config.json's
    # {"quantization": {"quant_algo", "exclude_modules", "group_size"}} or the flat
    # {"quant_algo", "ignore" | "exclude_modules"} form.
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    algo = str(inner.get("quant_algo") or "").upper()
    exclude = inner.get("exclude_modules") if "quantization" in q else inner.get("ignore", inner.get("exclude_modules"))
    exclude = tuple(exclude or [])
    if algo == "NVFP4":
        group = int(inner.get("group_size") or 16)
        if group != 16:
            raise UserError(f"ModelOpt NVFP4 with group_size {group}: only 16 is supported")
        scheme = Scheme("nvfp4", "nvfp4", param_bytes=param_bytes,
                        source="modelopt.py ModelOptLinearMethod (KNvfp4Static + KNvfp4Dynamic) / ModelOptNvFp4FusedMoE")
    elif algo == "FP8":
        scheme = Scheme("fp8", "fp8", strategy="tensor", static_input=True, param_bytes=param_bytes,
                        source="modelopt.py ModelOptLinearMethod (KFp8StaticTensor) / ModelOptFp8MoEMethod")
    else:
        raise UserError(f"ModelOpt quant_algo {algo!r} not supported by the planner (NVFP4, FP8)")
    return QuantConfig("modelopt", scheme, scheme, exclude, "modelopt")


def _parse_awq(q: dict, param_bytes: int) -> QuantConfig:
    # auto_awq.py AutoAWQConfig.from_config: w_bit / bits, q_group_size / group_size,
    # zero_point, lm_head, modules_to_not_convert (substring match).
    bits = int(q.get("w_bit") or q.get("bits") or 4)
    group = int(q.get("q_group_size") or q.get("group_size") or 128)
    scheme = Scheme("awq", "int4" if bits == 4 else "int8", bits=bits, group_size=group, param_bytes=param_bytes,
                    source="auto_awq.py AutoAWQMarlinLinearMethod.create_weights / AutoAWQMoEMethod.create_weights")
    return QuantConfig("awq", scheme, scheme, tuple(q.get("modules_to_not_convert") or []), "substring",
                       lm_head_quantized=bool(q.get("lm_head", False)))


def _parse_gptq(q: dict, param_bytes: int) -> QuantConfig:
    # auto_gptq.py AutoGPTQConfig.from_config: bits, group_size, desc_act, lm_head,
    # modules_in_block_to_quantize.
    bits = int(q.get("bits") or 4)
    group = int(q.get("group_size") if q.get("group_size") is not None else 128)
    if q.get("desc_act") and group != -1:
        raise UserError(
            "GPTQ checkpoint with desc_act (activation order) and groups: vLLM 0.34 refuses it "
            "(gptq_utils.normalize_and_validate_gptq_desc_act)"
        )
    if q.get("dynamic"):
        raise UserError("GPTQ `dynamic` per-module overrides are not supported by the planner")
    scheme = Scheme("gptq", "int4" if bits == 4 else "int8", bits=bits, group_size=group, param_bytes=param_bytes,
                    source="auto_gptq.py AutoGPTQLinearMethod.create_weights / AutoGPTQMoEMethod.create_weights")
    quantized = q.get("modules_in_block_to_quantize") or []
    flat = tuple(m for entry in quantized for m in (entry if isinstance(entry, list) else [entry]))
    return QuantConfig("gptq", scheme, scheme, flat, "gptq", lm_head_quantized=bool(q.get("lm_head", False)))


def _parse_mxfp4(q: dict, param_bytes: int) -> QuantConfig:
    # mxfp4.py Mxfp4Config.get_quant_method: linear layers stay unquantised (UnquantizedLinearMethod
    # whatever modules_to_not_convert says); RoutedExperts get the MXFP4 MoE method.
    scheme = Scheme("gpt_oss_mxfp4", "mxfp4", param_bytes=param_bytes,
                    source="mxfp4.py GptOssMxfp4MoEMethod.create_weights")
    return QuantConfig("mxfp4", None, scheme, tuple(q.get("modules_to_not_convert") or []), "substring")


PARSERS = {
    "fp8": _parse_fp8,
    "compressed-tensors": _parse_compressed_tensors,
    "modelopt": _parse_modelopt,
    "modelopt_fp4": _parse_modelopt,
    "awq": _parse_awq,
    "gptq": _parse_gptq,
    "mxfp4": _parse_mxfp4,
}


def parse_quant_config(c: dict, param_bytes: int = 2) -> QuantConfig | None:
    """The config's quantization_config, or None for an unquantised checkpoint.

    A ModelOpt hf_quant_config.json ({"producer": {"name": "modelopt"}, "quantization": {...}})
    is read as quant_method "modelopt", as vLLM does when it finds that file.
    """
    q = c.get("quantization_config")
    if not q:
        return None
    if not isinstance(q, dict):
        raise UserError("quantization_config is not a JSON object")
    method = str(q.get("quant_method") or "").lower()
    if not method and ((q.get("producer") or {}).get("name") == "modelopt" or "quantization" in q):
        method = "modelopt"
    parser = PARSERS.get(method)
    if parser is None:
        raise UserError(
            f"quantization_config quant_method {method or None!r} is not supported; supported: {', '.join(sorted(PARSERS))}"
        )
    return parser(q, param_bytes)
