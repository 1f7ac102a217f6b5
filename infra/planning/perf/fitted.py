"""What the kernels and the engine achieve of the hardware's peaks: the performance
model's fitted numbers, and where each one comes from.

Three kinds, kept apart:
- KERNEL-FITTED: fitted on measured kernel latencies (NVIDIA AIConfigurator's vLLM
  0.24.0 database for H100 SXM, tests/fixtures/perf/kernels/), by
  `infra.planning.perf.calibrate.calibrate`; tests/test_perf_calibration.py holds these
  constants to what it computes, and checks the H200 tables give the same fractions.
  A100s take their own (`AMPERE`, from its vLLM 0.14.0 tables).
- SERVING-FITTED: the engine's CPU time and the API server's, fitted on the rows of
  tests/fixtures/perf/measurements.jsonl whose role is "fit" and whose load is bounded
  (`fitted_on`; validate.fit says why the burst rows are left out); the other rows only
  validate (`python -m infra perf --validate`).
- ASSUMED: with the source or reason beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Efficiency:
    # KERNEL-FITTED: dense GEMM TFLOPS at >= 2,048 tokens over the datasheet's dense peak
    # (bf16 cuBLAS; FP8 per-tensor CUTLASS and block-scaled DeepGEMM together).
    gemm_bf16: float = 0.794
    gemm_fp8: float = 0.580
    # Dense GEMMs of quantised weights computed in bf16 (weight-only kernels that dequantise as they
    # go: Marlin, Machete; ops.gemm_kernel), over the bf16 peak. ASSUMPTION where no table times
    # them (H100 and on): cuBLAS bf16's. A100 takes Marlin's (AMPERE).
    gemm_weight_only: float = 0.794
    # ASSUMED: FP4 GEMMs as FP8's fraction (no FP4 kernel in the H100 tables).
    gemm_fp4: float = 0.580
    # KERNEL-FITTED: fused-MoE TFLOPS over the dense GEMM ceiling at >= 4,096 tokens, per
    # kernel family (ops.moe_kernel), at wide expert slices, once the call's own activations
    # have moved at `hbm` (ops.moe_activation_bytes: every pair's intermediate and output, and
    # with expert parallel the other ranks' pairs too); it falls as each expert's intermediate
    # size on the rank (n) narrows: x n / (n + moe_half_inter). With the activations apart one
    # figure a family holds the tables' TP and EP 8 rows alike (tests/test_perf_calibration.py);
    # without, EP 8 ran at about half the TP rows' rate.
    moe_gemm_bf16: float = 0.798
    moe_gemm_fp8: float = 0.578
    moe_gemm_4bit: float = 0.700
    # KERNEL-FITTED: Marlin's W4A16 fused MoE, which vLLM 0.10.2 and 0.11.0 run gpt-oss's MXFP4
    # experts with on SM 9.0 when the Triton backend's kernels are missing (Release.vendors_triton_kernels;
    # ops._experts): H100's table of SGLang's port of the kernel (kernels/moe_marlin_h100_sxm.csv,
    # INT4 weights; ASSUMPTION: MXFP4's dequantisation costs what INT4's does), by the same fit as
    # the others at their width term. It runs Ampere's mma.sync on Hopper: 0.40 of the dense ceiling
    # against the Triton MXFP4 kernel's 0.70. A100's own Marlin figure is in AMPERE.
    moe_gemm_marlin: float = 0.399
    moe_half_inter: float = 128.0
    # KERNEL-FITTED: the fused-MoE call's time at one token beyond reading its experts
    # (token alignment, two grouped GEMMs, activation, combine).
    moe_floor_s: float = 33.1e-6
    # KERNEL-FITTED: FlashAttention-3 prefill TFLOPS at >= 4,096-token sequences over the
    # bf16 peak, and decode attention's fixed time beyond one kernel floor and its reads.
    attention: float = 0.601
    attention_floor_s: float = 9.97e-6
    # KERNEL-FITTED: how prefill attention's fraction moves with the head size d (the fraction
    # above is at 128): x d / (d + attention_half_dim), relative to 128 (calibrate.head_dim_factor),
    # from FlashAttention-3's prefill at d = 64, 192 and 256 (H200's tables give 57).
    attention_half_dim: float = 55.0
    # KERNEL-FITTED: HBM fraction that bf16 GEMMs at 1-8 tokens reach reading weights, and
    # their fixed time (the floor every kernel pays inside a CUDA graph).
    hbm: float = 0.820
    kernel_overhead_s: float = 2.08e-6
    # KERNEL-FITTED: vLLM's MLA attention module in decode, timed whole in a CUDA graph
    # (AIConfigurator's collector/vllm/collect_mla_module.py captures generation rows in a
    # graph): its time beyond its weights' and latent cache's reads, MLA_MODULE_KERNELS kernel
    # floors and one attention floor, less the per-sequence terms below (the intercept of
    # calibrate.fit_mla's fit). Paid once per MLA layer a step. ASSUMPTION: DeepSeek-V3.2's module (the same projections and an indexer; no
    # table of its own) pays it too. DeepSeek-V4's attention is not MLA here (ops.is_mla:
    # no latent expansion) and pays only its kernels' floors: no table covers it.
    mla_floor_s: float = 50.7e-6
    # KERNEL-FITTED: the same module's time per decoding sequence beyond its reads, and per sequence
    # and query head on the rank (its table at contexts up to 512, 1-256 sequences, 16-128 heads:
    # calibrate.fit_mla; H200's table gives 91.7 ns and 4.91 ns). At 16 heads a rank, 170 ns a
    # sequence and layer: 10 ms a step for DeepSeek-R1's 61 layers at 1,000 sequences. ASSUMPTION:
    # linear past the table's 256 sequences; paid by decoding tokens only (a prefill chunk's are
    # one large batch of the same GEMMs); DeepSeek-V3.2's pays it at the heads it has, not the 64 its
    # sparse kernel pads them to.
    mla_seq_s: float = 91.9e-9
    mla_seq_head_s: float = 4.89e-9
    # KERNEL-FITTED: vLLM's custom all-reduce in a CUDA graph at <= 16 KB, and NCCL's bus
    # bandwidth at >= 64 MB over TP 8, as a fraction of NVLink per direction.
    allreduce_latency_s: float = 4.59e-6
    allreduce_bw: float = 0.930
    # ASSUMED: without CUDA graphs each of the ~10 kernels of a layer pays a host launch
    # of ~4 us (CUDA's documented launch overhead is a few microseconds): 40 us more.
    eager_layer_overhead_s: float = 40e-6
    # SERVING-FITTED: CPU time of one engine step (scheduling, input preparation; on the
    # bounded-load rows): hidden behind the GPU with async scheduling.
    step_overhead_s: float = 1.37e-3
    # SERVING-FITTED: time per token a step hands on (on the burst rows, the only ones where
    # it shows; without speculative decoding one per sampled sequence), added with or without
    # async scheduling: the burst rows measured both ways (gpt-oss-120b TP1 on H100 and on
    # A100) differ by 3% and 5% in TPOT, where hiding it would halve TPOT
    # (tests/test_perf_validation.py). Which work it is (the sampler over
    # the vocabulary, the output path to the API server) the rows do not separate, and it is
    # more than a step's own work: those bursts' ITL medians sit near the kernel model's
    # decode step (gpt-oss-120b TP4: 21.8 ms measured, 20.4 ms at 1,000 sequences), so it
    # also stands for the stalls the simulation does not produce (docs/planning.md).
    # ASSUMPTION: all of it is per token, not per sequence: with MTP a step verifies k + 1
    # positions of each sequence (step._emitted) and hands on up to that many tokens to detokenize
    # and stream. The one MTP measurement agrees (DeepSeek-V3.2 on 8 x H200, ShareGPT burst, with
    # and without one drafted token: median ITL 145 against 82 ms, x1.77; charged per token the
    # model's median ITL went x1.74, 236 against 136 ms, per sequence x1.10, when the charge was
    # chosen; the row validates).
    seq_overhead_s: float = 57.9e-6
    # SERVING-FITTED: the share of the kernel-fitted compute rates above (GEMMs, fused MoE,
    # prefill attention) that a serving step's compute-bound work reaches. The tables time each
    # kernel alone, warm, at the clock a short run holds; a step with a long prefill chunk or a
    # large batch also runs the kernels they leave out (norms, rotary, activations, MoE routing
    # and permutation, KV-cache writes), eagerly beyond the CUDA-graph sizes, for seconds at the
    # GPU's power limit; and the rows ran releases 0.10.2-0.13.0, older than the tables' (0.24.0;
    # A100's 0.14.0). Which of these it is the rows do not separate. Only those steps are
    # compute-bound, so only the burst rows show it: fitted there, with the per-token time above,
    # which it trades against (a slower prefill-heavy step leaves less for the per-token time to
    # carry; the bursts' ITL medians, near the kernel model's decode step, say that time is
    # small). The memory-bound decode of a small batch reads at `hbm` and does not take it.
    # The burst rows' loss is flat along the valley where the two trade: `--fit` run from the
    # previous figures landed at 0.68 and 106 us (intake 7.5 ms), from those at 0.62 and 97 us,
    # from these at 0.62 and 89 us, each within 1% of the others' loss and 2 points of their
    # validation medians; so read both as +-10%. With ShareGPT's own lengths (sharegpt.py) in
    # place of a lognormal the time per token fell to 69 us and this share stayed. With gpt-oss's
    # H100 rows on Marlin, as their releases ran them (Release.vendors_triton_kernels), it rose to
    # 0.665 and the time per token fell to 63 us: a fixed point of `--fit`. With the fused MoE's
    # activations timed apart (ops.moe_activation_bytes) the share stayed and the time per token
    # came to 58 us.
    serving_compute: float = 0.665
    # SERVING-FITTED: the same share of the A100 tables' rates (`AMPERE`), which an SM 8.0 GPU runs
    # at in place of those above. A share is of its own tables: the A100's are another release's
    # kernels (0.14.0's, not 0.24.0's) timed on another GPU, so what a serving step leaves out of
    # them need not be what it leaves out of H100's. Fitted with the other burst figures; it moves
    # only the A100 rows, so the one A100 burst fit row sets it (the split keeps a dense burst on
    # each of the two generations for this). It came to 0.665, now H100's share too; a fit started
    # from 0.725 lands there, and one started from 0.665 stays (a flat valley, as above).
    serving_compute_ampere: float = 0.665
    # SERVING-FITTED: a request's time outside the engine that does not queue (the HTTP
    # round trip, detokenizing and streaming the first token back): added to its TTFT.
    request_overhead_s: float = 47.6e-3
    # SERVING-FITTED: the same for gpt-oss, whose chat requests take the API server's harmony
    # path both ways (serving_chat.py of 0.10.2 and 0.11.0, `use_harmony`: rendered to token ids
    # by openai_harmony with no chat template, its output parsed by harmony's streaming parser),
    # as its intake below. One figure for both paths left every gpt-oss row at a bounded load
    # 28-46 ms over its measured TTFT (+57% to +78%), the template path's off both ways
    # (Qwen3-8B within 5 ms, DeepSeek-R1 33 ms under). Fitted on the one gpt-oss row with a
    # bounded load.
    request_overhead_harmony_s: float = 13.3e-3
    # SERVING-FITTED: the API server's time per request that does queue (chat template and
    # tokenization in its one process) before the engine sees it (workload.Client). Its one
    # event loop interleaves the requests it is taking in, so they share it: a lone request
    # waits this long, a burst of n all reach the engine about n times this after the burst.
    # In the code path of the rows' releases (vLLM 0.11.0 entrypoints/openai/serving_engine.py
    # _preprocess_chat renders the chat template synchronously on the one API server's event
    # loop; tokenization awaits a one-thread executor, AsyncMicrobatchTokenizer; the engine
    # client awaits its socket), and the bench client sends a burst all at t=0
    # (benchmarks/serve.py get_request: no delay at rate inf). The bursts' measured TTFTs are
    # tight around their means where the engine's own queue is short (rand 128/4: p99 within
    # 1.6x of the mean on 10 of the 14 rows), as all-at-once arrival gives and one-at-a-time would
    # not (TTFTs spread evenly from 0: p99 about 2x the mean).
    # Its size per request is not in the code: fitted, one for the models whose chat requests go
    # through the chat template and the tokenizer (`_preprocess_chat`) and one for gpt-oss below.
    frontend_intake_s: float = 8.18e-3
    # SERVING-FITTED: the same intake for gpt-oss, whose chat requests the API server renders with
    # openai_harmony straight to token ids, with no chat template and no tokenizer (serving_chat.py
    # of 0.10.2 and 0.11.0: `use_harmony = model_config.hf_config.model_type == "gpt_oss"`, then
    # `_make_request_with_harmony`, `render_for_completion`). Fitted on the one gpt-oss burst fit row.
    # ASSUMPTION: a request whose tokenizer encodes the conversation itself, with no chat template
    # either (DeepSeek-V3.2's and -V4's tokenizer modes; predict.chat_path "encoded"), takes it too.
    frontend_intake_harmony_s: float = 1.32e-3
    # The rows of tests/fixtures/perf/measurements.jsonl the SERVING-FITTED figures come from.
    fitted_on: tuple[str, ...] = (
        "gps-dsr1-h200-tp8-sharegpt-burst", "gps-dsr1-h200-tp8-sharegpt-c4", "gps-gptoss120b-h100-tp2-sharegpt-burst",
        "gps-gptoss120b-h100-tp1-sharegpt-c4", "gps-q235b-h100-tp8-bf16-sharegpt-burst", "gps-q235b-h100-tp8-bf16-rand32k",
        "gps-q32b-a100-tp1-bf16-sharegpt-burst", "gps-q32b-h100-tp1-bf16-sharegpt-burst", "gps-q8b-h100-tp1-sharegpt-c1",
        "gps-q8b-h100-tp1-sharegpt-c8",
    )

    def replace(self, **changes) -> "Efficiency":
        return replace(self, **changes)


KERNEL_FITTED = ("gemm_bf16", "gemm_fp8", "moe_gemm_bf16", "moe_gemm_fp8", "moe_gemm_4bit", "moe_gemm_marlin", "moe_half_inter",
                 "moe_floor_s", "attention", "attention_floor_s", "attention_half_dim", "hbm", "kernel_overhead_s",
                 "allreduce_latency_s", "allreduce_bw", "mla_floor_s", "mla_seq_s", "mla_seq_head_s")  # fmt: skip
FITTED_FIELDS = ("step_overhead_s", "request_overhead_s", "request_overhead_harmony_s")  # on the bounded-load fit rows
# Then on the burst fit rows, the others held: what only a large batch or a queue shows
# (at a bounded load a few sequences' time is small beside the GPU's step).
BURST_FITTED_FIELDS = ("seq_overhead_s", "serving_compute", "serving_compute_ampere", "frontend_intake_s",
                       "frontend_intake_harmony_s")
# What the serving fit may choose. ASSUMPTION: a step's CPU time between 20 us and 20 ms.
# ASSUMPTION: a sequence's CPU time per step under 1 ms, the API server's per request under 50 ms.
# ASSUMPTION: a serving step's compute reaches at most the tables' rates, and at least a fifth.
FIT_BOUNDS = {"step_overhead_s": (20e-6, 20e-3), "seq_overhead_s": (1e-6, 1e-3), "request_overhead_s": (0.0, 1.0),
              "request_overhead_harmony_s": (0.0, 1.0),
              "serving_compute": (0.2, 1.0), "serving_compute_ampere": (0.2, 1.0),
              "frontend_intake_s": (0.0, 50e-3), "frontend_intake_harmony_s": (0.0, 50e-3)}

DEFAULT = Efficiency()

# KERNEL-FITTED on A100 SXM's tables (tests/fixtures/perf/kernels/*_a100_sxm.csv: AIConfigurator's
# vLLM 0.14.0 database, the only vLLM one it has for A100), by the same `calibrate` fits: what an
# SM 8.0 GPU (A100 40 GB and 80 GB) runs at in place of the H100 figures above. Its fused MoE
# (Triton, bf16) reaches about the same share of the dense ceiling at every expert width the
# table has once its activations are apart (0.28-0.47 of it with them from 192 to 2,048 wide
# split by TP, 0.15-0.19 with EP 8), so the width term fits to 0; the table routes by a mild
# power law (it has no balanced rows).
# Its 4-bit MoE figure is Marlin's W4A16 kernel, which vLLM runs MXFP4 experts with below SM 9.0
# (0.11.0 quantization/mxfp4.py get_mxfp4_backend): from the wheel's SGLang 0.5.10 table of its port
# of the kernel (kernels/moe_marlin_a100_sxm.csv, INT4 weights; ASSUMPTION: MXFP4's dequantisation
# costs what INT4's does), at the width term above: 0.55 of the dense ceiling, against H100's
# Triton MXFP4 kernel's 0.70. Dense layers of FP8 and INT4 weights run Marlin on A100 too
# (ops.gemm_kernel): `gemm_weight_only` is that share of the bf16 GEMM ceiling (ASSUMPTION: a
# dense Marlin GEMM reaches what its fused-MoE form does; the wheel times no dense Marlin GEMM).
# ASSUMPTION: the figures no A100 table covers (FP8 and FP4 kernels, the MLA module, the head-size
# term: its table has head size 128 only) stay H100's.
AMPERE = {"hbm": 0.696, "kernel_overhead_s": 3.00e-6, "gemm_bf16": 0.889, "attention": 0.553, "attention_floor_s": 14.7e-6,
          "gemm_weight_only": 0.489, "moe_gemm_bf16": 0.336, "moe_gemm_4bit": 0.550, "moe_gemm_marlin": 0.550,
          "moe_half_inter": 0.0, "moe_floor_s": 21.3e-6,
          "allreduce_latency_s": 5.33e-6, "allreduce_bw": 0.694}  # fmt: skip


def for_gpu_kernels(eff: Efficiency, gpu) -> Efficiency:
    """`eff` with the kernel-fitted figures of the GPU's own tables where the repo has them
    (A100: `AMPERE`, with the serving share fitted against them); the other serving-fitted and
    the assumed figures are left as they are."""
    if gpu.compute_capability != "8.0":
        return eff
    return eff.replace(**AMPERE, serving_compute=eff.serving_compute_ampere)
