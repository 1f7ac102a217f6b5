"""Weight storage formats and what one parameter really costs in each.

The cost includes the quantisation scales that travel with the weights, so
`count x bytes_per_param` is what a checkpoint (and vLLM's copy of it in GPU
memory) takes. Each figure names where it comes from.

These per-parameter costs serve the `--weight-format` override and the layers
of the DeepSeek / Kimi families. A checkpoint whose quantization_config the
parsers read into a vLLM scheme (infra.catalog.quant) is costed instead from the
parameters vLLM creates for each layer's shape: scales per block, channel,
group or shard, zero points, kernel padding. The format names below then only
label those layers.

`hardware_min_cc` is the lowest CUDA compute capability whose tensor cores
compute in the format natively. It is informative only: vLLM also has
weight-only kernels (Marlin) that run FP8 / FP4 / INT4 weights on older GPUs
by dequantising to bf16, so a lower capability does not make a format
unusable; it makes it slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from infra.errors import unknown_name


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bytes_per_param: Fraction | float
    hardware_min_cc: float | None = None
    source: str = ""


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat(
            name="bf16",
            bytes_per_param=Fraction(2),
            hardware_min_cc=8.0,
            source="bfloat16: 16 bits, no scales; bf16 tensor cores from Ampere (sm80).",
        ),
        WeightFormat(
            name="fp8",
            # One FP8 E4M3 byte per weight plus one fp32 scale per 128 x 128 block
            # (16384 weights): 1 + 4/16384.
            bytes_per_param=1 + Fraction(4, 16384),
            hardware_min_cc=8.9,
            source=(
                "FP8 E4M3 block-scaled 128x128 with one fp32 scale per block, as in the "
                "DeepSeek-V3 checkpoint (quantization_config.weight_block_size [128, 128]; "
                "vLLM Fp8LinearMethod weight_scale_inv). DeepSeek-V3.2/V4 store the block "
                "scale as one UE8M0 byte (scale_fmt ue8m0): 1 + 1/16384, a 0.02% difference "
                "that is ignored. FP8 tensor cores from Ada/Hopper (sm89/sm90)."
            ),
        ),
        WeightFormat(
            name="mxfp4",
            # 4-bit E2M1 (half a byte) plus one E8M0 scale byte per 32 weights: 17/32.
            bytes_per_param=Fraction(1, 2) + Fraction(1, 32),
            hardware_min_cc=10.0,
            source=(
                "OCP Microscaling MXFP4: E2M1 4-bit elements, one E8M0 (1 byte) scale per "
                "block of 32 (OCP MX spec v1.0; vLLM Mxfp4MoEMethod w13_weight_scale with "
                "hidden_size // 32 entries). FP4 tensor cores from Blackwell (sm100)."
            ),
        ),
        WeightFormat(
            name="nvfp4",
            # 4-bit E2M1 plus one FP8 E4M3 scale per 16 weights: 9/16. The one fp32
            # global scale per tensor is ignored.
            bytes_per_param=Fraction(1, 2) + Fraction(1, 16),
            hardware_min_cc=10.0,
            source=(
                "NVIDIA NVFP4: E2M1 4-bit elements, one FP8 E4M3 scale per block of 16, plus "
                "one fp32 scale per tensor (ignored here). FP4 tensor cores from Blackwell."
            ),
        ),
        WeightFormat(
            name="int4",
            # ASSUMPTION: group size 128 with one bf16 scale per group: 0.5 + 2/128.
            # AWQ additionally stores a 4-bit zero point per group (+0.5/128), GPTQ
            # with act-order a g_idx; both ignored.
            bytes_per_param=Fraction(1, 2) + Fraction(2, 128),
            hardware_min_cc=None,  # no int4 tensor-core path; weight-only kernels (Marlin) from sm80
            source=(
                "INT4 weight-only (GPTQ / AWQ / compressed-tensors W4A16). Assumes group size "
                "128 with one bf16 scale per group; AWQ adds a zero point per group, not counted."
            ),
        ),
        WeightFormat(
            name="int8",
            # One int8 byte per weight plus one fp32 scale per output channel (~4/K), ignored.
            bytes_per_param=Fraction(1),
            hardware_min_cc=7.5,
            source=(
                "INT8 weights (compressed-tensors W8A8 int8, 8-bit GPTQ / AWQ): one byte per weight; "
                "the per-channel fp32 scale (4 bytes per input row) is left out of this figure. "
                "INT8 tensor cores from Turing (sm75)."
            ),
        ),
        WeightFormat(
            name="fp32",
            bytes_per_param=Fraction(4),
            hardware_min_cc=None,
            source=(
                "float32: routers' correction biases, DeepSeek-V4 hyper-connection mixers and "
                "compressor position biases, KDA decay parameters are kept in fp32 by vLLM."
            ),
        ),
    )
}

# Formats a 4-bit `--weight-format` override means (see models.with_weight_format).
FOUR_BIT_FORMATS = frozenset({"mxfp4", "nvfp4", "int4"})


def get_format(name: str) -> WeightFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise unknown_name("weight format", name, FORMATS) from None
