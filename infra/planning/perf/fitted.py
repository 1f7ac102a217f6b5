"""What the kernels achieve of the hardware's peaks: the performance model's only
fitted numbers, and the ones taken from published measurements instead.

Each figure says whether it is FITTED (with the measurement rows it was fitted
on, `tests/fixtures/perf/measurements.jsonl` rows whose role is "fit": none of
them is used to validate) or ASSUMED (with the source it comes from). `python -m
infra perf --fit` re-fits the fitted ones on the fit rows and prints them; the
validation rows only ever judge the result (`python -m infra perf --validate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Efficiency:
    # ASSUMED: dense GEMM ceilings measured on H100/H200 (stas00/ml-engineering,
    # compute/accelerator, "maximum achievable matmul FLOPS": ~790 of 989 BF16 TFLOPS,
    # ~1,450 of 1,979 FP8): 0.80 and 0.73 of the dense datasheet peak.
    gemm_bf16: float = 0.80
    gemm_fp8: float = 0.73
    # ASSUMED: FP4 GEMMs as FP8's fraction (no measured ceiling in the sources read).
    gemm_fp4: float = 0.73
    # FITTED: fraction of the GEMM ceiling above that the fused MoE kernels reach
    # (grouped GEMMs over many small per-expert problems, the routing's gather/scatter),
    # per kernel family (ops.moe_kernel): unquantised, block FP8, 4-bit.
    moe_gemm_bf16: float = 0.6
    moe_gemm_fp8: float = 0.1
    moe_gemm_4bit: float = 0.15
    # ASSUMED: FlashAttention-3 forward on H100 reaches 740 of 989 BF16 TFLOPS at long
    # sequences (Shah et al. 2024, FlashAttention-3, fig. 5); vLLM's varlen prefill with
    # short chunks does less: 0.55 taken (labelled, not fitted).
    attention: float = 0.55
    # FITTED: fraction of the datasheet HBM bandwidth that weight and KV reads achieve.
    hbm: float = 0.6
    # ASSUMED: NCCL all-reduce bus bandwidth on 8 x H100/H200 NVLink, 370-480 GB/s of the
    # 450 GB/s per direction (nccl-tests issues, quoted in FACTS.md): 0.82.
    allreduce_bw: float = 0.82
    # FITTED: the latency of one small all-reduce (vLLM's custom all-reduce / NCCL LL).
    allreduce_latency_s: float = 68e-6
    # FITTED: GPU time per kernel beyond the roofline of the big operations (launch gaps
    # inside a CUDA graph, the ramp and tail of each kernel, the small kernels' own work:
    # norms, rotary, routing, activation quantisation), times the kernels each layer
    # launches (ops.layer_kernels).
    kernel_overhead_s: float = 3e-6
    # ASSUMED: without CUDA graphs each of the ~10 kernels of a layer pays a host launch
    # of ~4 us (CUDA's documented launch overhead is a few microseconds): 40 us more.
    eager_layer_overhead_s: float = 40e-6
    # FITTED: CPU time of one engine step (scheduling, input preparation, sampling,
    # output processing) and per sequence in the batch; hidden behind the GPU with
    # async scheduling.
    step_overhead_s: float = 0.095e-3
    seq_overhead_s: float = 120e-6
    # FITTED: time a request spends outside the engine before its first token (HTTP,
    # chat template and tokenization in the API server, detokenizing and streaming the
    # first token back): added to each request's TTFT.
    request_overhead_s: float = 57e-3
    # The rows of tests/fixtures/perf/measurements.jsonl the FITTED figures come from
    # (`python -m infra perf --fit`, two rounds of coordinate search from the previous
    # values). hbm and moe_gemm end at the lower bounds of FIT_BOUNDS: the fit would
    # go lower to slow the burst rows down, which says the model misses a cost of
    # large batches, not that HBM runs at 60% (see the README, Performance).
    fitted_on: tuple[str, ...] = (
        "gps-dsr1-h200-tp8-sharegpt-burst", "gps-dsr1-h200-tp8-sharegpt-c4", "gps-gptoss120b-h100-tp2-sharegpt-burst",
        "gps-gptoss120b-h100-tp1-sharegpt-c4", "gps-q235b-h100-tp8-bf16-sharegpt-burst", "gps-q235b-h100-tp8-bf16-rand32k",
        "gps-q32b-a100-tp1-bf16-sharegpt-burst", "gps-q32b-h100-tp1-bf16-sharegpt-burst", "gps-q8b-h100-tp1-sharegpt-c1",
        "gps-q8b-h100-tp1-sharegpt-c8",
    )

    def replace(self, **changes) -> "Efficiency":
        return replace(self, **changes)


FITTED_FIELDS = ("hbm", "moe_gemm_bf16", "moe_gemm_fp8", "moe_gemm_4bit", "allreduce_latency_s", "kernel_overhead_s", "step_overhead_s", "seq_overhead_s",
                 "request_overhead_s")

# What the fit may choose: a fraction stays within what the hardware's own benchmarks
# show is reachable, so the fit cannot buy a better error with an unphysical figure.
# ASSUMPTION: HBM reads reach 60-95% of the datasheet (H100 STREAM-like copies reach
# ~90%); a fused MoE kernel 10-100% of the dense GEMM ceiling.
FIT_BOUNDS = {"hbm": (0.6, 0.95), "moe_gemm_bf16": (0.1, 1.0), "moe_gemm_fp8": (0.1, 1.0), "moe_gemm_4bit": (0.1, 1.0)}

DEFAULT = Efficiency()
