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
    # (grouped GEMMs over many small per-expert problems, the routing's gather/scatter).
    moe_gemm: float = 0.5
    # ASSUMED: FlashAttention-3 forward on H100 reaches 740 of 989 BF16 TFLOPS at long
    # sequences (Shah et al. 2024, FlashAttention-3, fig. 5); vLLM's varlen prefill with
    # short chunks does less: 0.55 taken (labelled, not fitted).
    attention: float = 0.55
    # FITTED: fraction of the datasheet HBM bandwidth that weight and KV reads achieve.
    hbm: float = 0.80
    # ASSUMED: NCCL all-reduce bus bandwidth on 8 x H100/H200 NVLink, 370-480 GB/s of the
    # 450 GB/s per direction (nccl-tests issues, quoted in FACTS.md): 0.82.
    allreduce_bw: float = 0.82
    # FITTED: the latency of one small all-reduce (vLLM's custom all-reduce / NCCL LL).
    allreduce_latency_s: float = 12e-6
    # FITTED: GPU time per decoder layer beyond the roofline of its big operations (the
    # norms, rotary, routing, quantisation of activations and kernel boundaries), with
    # CUDA graphs.
    layer_overhead_s: float = 25e-6
    # ASSUMED: without CUDA graphs each of the ~10 kernels of a layer pays a host launch
    # of ~4 us (CUDA's documented launch overhead is a few microseconds): 40 us more.
    eager_layer_overhead_s: float = 40e-6
    # FITTED: CPU time of one engine step (scheduling, input preparation, sampling,
    # output processing) and per sequence in the batch; hidden behind the GPU with
    # async scheduling.
    step_overhead_s: float = 1.5e-3
    seq_overhead_s: float = 15e-6
    # FITTED: time a request spends outside the engine before its first token (HTTP,
    # chat template and tokenization in the API server, detokenizing and streaming the
    # first token back): added to each request's TTFT.
    request_overhead_s: float = 20e-3
    fitted_on: tuple[str, ...] = ()

    def replace(self, **changes) -> "Efficiency":
        return replace(self, **changes)


FITTED_FIELDS = ("hbm", "moe_gemm", "allreduce_latency_s", "layer_overhead_s", "step_overhead_s", "seq_overhead_s",
                 "request_overhead_s")

DEFAULT = Efficiency()
