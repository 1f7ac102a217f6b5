"""The achieved fractions of `fitted.py`, fitted on measured kernel times.

Source: NVIDIA AIConfigurator's per-kernel databases for vLLM 0.24.0 on H100 SXM
(`tests/fixtures/perf/kernels/*_h100_sxm.csv`, each file naming its path inside the
aiconfigurator-core 0.12.0 wheel; the README there says how they were measured). The
H200 tables are kept apart: they check that the H100 fit transfers to another GPU
(tests/test_perf_calibration.py). A100 SXM's tables (its vLLM 0.14.0 database) give the
A100's own figures (`fitted.AMPERE`): another architecture, other kernels
(FlashAttention-2, no FP8). No serving measurement is used here: those only validate.

Each fit is one named physical figure:
- `hbm`, `kernel_overhead_s`: bf16 GEMMs at 1-8 tokens read their weights and do little
  else; latency = floor + weight bytes / (fraction x datasheet bandwidth), least squares;
- `gemm_bf16`, `gemm_fp8`: GEMM TFLOPS at >= 2,048 tokens over the dense datasheet peak;
- `attention`: FlashAttention prefill TFLOPS at >= 4,096-token sequences over the bf16 peak;
- `attention_floor_s`: decode attention's latency at its smallest reads, beyond one
  kernel floor and its bytes;
- `moe_gemm_*`, `moe_half_inter`: fused-MoE TFLOPS at >= 4,096 tokens over the dense
  GEMM ceiling, falling as each expert's per-rank intermediate size n shrinks:
  e_max x n / (n + n_half), one e_max per kernel family and one n_half for all, once the
  call's activations have moved at `hbm` (ops.moe_activation_bytes);
- `moe_floor_s`: the fused-MoE call's latency at one token beyond its roofline;
- A100's `moe_gemm_4bit`: Marlin's W4A16 fused MoE (what vLLM runs MXFP4 experts with below
  SM 9.0), from the SGLang port's INT4 table in the same wheel, at the n_half of A100's own
  fused-MoE fit; and `gemm_weight_only` (dense FP8 / INT4 weights, Marlin there) that share of
  the bf16 GEMM ceiling;
- `mla_floor_s`, `mla_seq_s`, `mla_seq_head_s`: vLLM's whole MLA attention module in decode
  (projections, latent norm, absorbed BMMs, the MLA kernel, o_proj; timed in a CUDA graph)
  beyond reading its weights and latent cache and the kernel and attention floors the
  model already charges the module: a floor a layer, and a time per decoding sequence
  and per sequence and head (at short contexts, 1-256 sequences, 16-128 heads);
- `allreduce_latency_s`, `allreduce_bw`: vLLM's custom all-reduce in a CUDA graph at
  <= 16 KB, and NCCL's bus bandwidth at >= 64 MB over NVLink per direction.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from infra.catalog.gpus import get_gpu
from infra.catalog.quant import mxfp4_moe_backend
from infra.planning.perf.ops import MLA_MODULE_KERNELS, moe_activation_bytes
from infra.planning.perf.step import head_dim_factor

SYSTEMS = {"h100_sxm": "H100-SXM-80GB", "h200_sxm": "H200-141GB", "a100_sxm": "A100-80GB"}  # AIConfigurator's names
# dtype -> (kernel family, weight bytes a parameter, compute dtype). INT4 (Marlin): half a byte and a
# 2-byte scale per group of 128 (ASSUMPTION: the group size; only the one-token floor reads it).
MOE_FAMILY = {"bfloat16": ("bf16", 2.0, "bf16"), "fp8_block": ("fp8", 1.0, "fp8"), "w4a16_mxfp4": ("4bit", 17 / 32, "bf16"),
              "int4_wo": ("4bit", 66 / 128, "bf16")}  # fmt: skip


def read(path: Path) -> list[dict]:
    """A kernel table: '#' lines are its provenance; numbers as floats."""
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [{k: _number(v) for k, v in r.items()} for r in rows]


def _number(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def fit_gemm(rows: list[dict], gpu) -> dict:
    small = [r for r in rows if r["dtype"] == "bf16" and r["m"] <= 8]
    floor, slope = _line([r["n"] * r["k"] * 2 for r in small], [r["latency_us"] * 1e-6 for r in small])
    out = {"hbm": 1 / (slope * gpu.hbm_bandwidth_bytes_per_s), "kernel_overhead_s": floor}
    for name, dtypes, peak in (("gemm_bf16", ("bf16",), gpu.bf16_dense_tflops), ("gemm_fp8", ("fp8_tensor", "fp8_block"), gpu.fp8_dense_tflops)):
        big = [2 * r["m"] * r["n"] * r["k"] / (r["latency_us"] * 1e-6) / (peak * 1e12) for r in rows if r["dtype"] in dtypes and r["m"] >= 2048]
        if big:  # no FP8 rows where the GPU has no FP8 (A100)
            out[name] = statistics.median(big)
    return out


def fit_attention(prefill: list[dict], decode: list[dict], kernel_floor: float, hbm: float, gpu) -> dict:
    bw = gpu.hbm_bandwidth_bytes_per_s * hbm
    floors = [
        r["latency_us"] * 1e-6 - r["batch"] * r["context_len"] * r["kv_heads"] * r["head_dim"] * 2 * 2 / bw
        for r in decode if r["kv_cache_dtype"] == "bfloat16" and r["batch"] * r["context_len"] <= 4096
    ]  # fmt: skip
    return {"attention": _prefill_efficiency(prefill, gpu), "attention_floor_s": max(0.0, statistics.median(floors) - kernel_floor)}


def _prefill_efficiency(rows: list[dict], gpu) -> float:
    """FlashAttention prefill TFLOPS at >= 4,096-token sequences over the bf16 peak (median)."""
    # Causal prefill: each of seq_len queries meets (on average) half the sequence.
    return statistics.median(
        r["batch"] * r["q_heads"] * r["seq_len"] ** 2 * r["head_dim"] * 2 / (r["latency_us"] * 1e-6) / (gpu.bf16_dense_tflops * 1e12)
        for r in rows if r["seq_len"] >= 4096 and r["kv_cache_dtype"] == "bfloat16"
    )  # fmt: skip


def fit_attention_head_dim(prefill: list[dict], other_dims: list[dict], gpu) -> dict:
    """`attention_half_dim`: the d_half that puts each head size's median prefill efficiency
    (64, 192, 256 from `other_dims`) nearest, in log, to 128's times head_dim_factor."""
    base = _prefill_efficiency(prefill, gpu)
    ratios = {d: _prefill_efficiency([r for r in other_dims if r["head_dim"] == d], gpu) / base
              for d in sorted({r["head_dim"] for r in other_dims})}  # fmt: skip

    def loss(half: float) -> float:
        return sum((math.log(ratio) - math.log(head_dim_factor(d, half))) ** 2 for d, ratio in ratios.items())

    return {"attention_half_dim": float(min(range(0, 513), key=loss))}


def _inter_on_rank(r: dict) -> float:
    """A table row's expert intermediate size on one rank: whole with expert parallel (the
    collector never combines it with TP), else split by TP."""
    return r["inter"] if r["ep"] > 1 else r["inter"] / r["tp"]


def moe_activation_seconds(r: dict, gemm: dict, gpu) -> float:
    """A table row's fused-MoE activations through HBM (ops.moe_activation_bytes: every pair's
    intermediate and output, the other ranks' pairs too with expert parallel, in vLLM's
    fused_experts and Marlin's; the rank's own pairs in the OAI Triton kernel, which fuses them)
    at the GEMMs' achieved bandwidth."""
    nbytes = moe_activation_bytes(fused="oaitriton" in r["kernel_source"], fp8_activations=r["dtype"] == "fp8_block",
                                  top_k=r["topk"], hidden=r["hidden"], inter=_inter_on_rank(r), ep=r["ep"])  # fmt: skip
    return r["num_tokens"] * nbytes / (gpu.hbm_bandwidth_bytes_per_s * gemm["hbm"])


def _moe_points(rows: list[dict], gemm: dict, gpu) -> list[tuple[str, float, float]]:
    """(family, per-rank intermediate size, fraction of the dense GEMM ceiling) at >= 4,096 tokens:
    the routed FLOPs over the time left once the call's activations are moved."""
    out = []
    for r in rows:
        family = MOE_FAMILY.get(r["dtype"])
        if family is None or r["num_tokens"] < 4096 or "flashinfer" in r["kernel_source"]:
            continue
        kernel, _, compute = family
        ranks = r["tp"] * r["ep"]
        flops = 2 * 3 * r["num_tokens"] * r["topk"] * r["hidden"] * r["inter"] / ranks
        peak = (gpu.bf16_dense_tflops if compute == "bf16" else gpu.fp8_dense_tflops) * 1e12 * gemm[f"gemm_{compute}"]
        seconds = r["latency_us"] * 1e-6 - moe_activation_seconds(r, gemm, gpu)
        out.append((kernel, _inter_on_rank(r), flops / seconds / peak))
    return out


def _family_emax(points: list[tuple[str, float, float]], half: float) -> tuple[dict, float]:
    """Each family's e_max at a given n_half (log least squares, closed form), and the loss."""
    emax, loss = {}, 0.0
    for family in {p[0] for p in points}:
        logs = [math.log(e) - math.log(n / (n + half)) for f, n, e in points if f == family]
        emax[family] = math.exp(statistics.fmean(logs))
        loss += sum((lg - math.log(emax[family])) ** 2 for lg in logs)
    return emax, loss


def fit_moe_at(rows: list[dict], gemm: dict, gpu, half: float) -> dict:
    """The families of `rows` (another kernel's table) at an n_half already fitted."""
    emax, _ = _family_emax(_moe_points(rows, gemm, gpu), half)
    return {f"moe_gemm_{k}": min(1.0, v) for k, v in emax.items()}


def fit_moe(rows: list[dict], gemm: dict, gpu) -> dict:
    points = _moe_points(rows, gemm, gpu)
    best = None
    for half in range(0, 2049, 16):  # n_half by grid, e_max per family in closed form
        emax, loss = _family_emax(points, half)
        if best is None or loss < best[0]:
            best = (loss, half, emax)
    _, half, emax = best
    out = {f"moe_gemm_{k}": min(1.0, v) for k, v in emax.items()}
    out["moe_half_inter"] = float(half)
    # One token: the call's time beyond reading that token's experts (top-k of them).
    bw = gpu.hbm_bandwidth_bytes_per_s * gemm["hbm"]
    floors = []
    for r in rows:
        family = MOE_FAMILY.get(r["dtype"])
        if family is None or r["num_tokens"] != 1 or "flashinfer" in r["kernel_source"]:
            continue
        ranks = r["tp"] * r["ep"]
        expert_bytes = 3 * r["hidden"] * r["inter"] * family[1]
        touched = r["topk"] / (r["ep"] if r["ep"] > 1 else 1)
        floors.append(r["latency_us"] * 1e-6 - touched * expert_bytes / (ranks if r["ep"] == 1 else 1) / bw
                      - moe_activation_seconds(r, gemm, gpu))
    out["moe_floor_s"] = statistics.median(floors)
    return out


# DeepSeek-V3's attention dimensions, which the MLA module table was measured with
# (infra/catalog/model_configs/deepseek-v3.json: hidden_size, q_lora_rank, kv_lora_rank,
# qk_nope_head_dim, qk_rope_head_dim, v_head_dim).
MLA_V3 = {"hidden": 7168, "q_lora": 1536, "kv_lora": 512, "nope": 128, "rope": 64, "v_head": 128}


# Bytes of the module's bf16 latent cache a token (kv_lora + rope values, 2 bytes each):
# the 1,152 of kernels/README.md.
MLA_V3_CACHE_BYTES = (MLA_V3["kv_lora"] + MLA_V3["rope"]) * 2


def mla_module_bytes(heads: int) -> float:
    """Weight bytes one decode call of the module reads with `heads` heads on the rank: FP8
    block-scaled q_a and kv_a (replicated), q_b and o_proj (split by heads), and the bf16
    absorbed W_UK and W_UV the decode path multiplies by (kernels/README.md)."""
    d = MLA_V3
    fp8 = d["hidden"] * (d["q_lora"] + d["kv_lora"] + d["rope"]) + d["q_lora"] * heads * (d["nope"] + d["rope"])
    fp8 += heads * d["v_head"] * d["hidden"]
    bf16 = heads * d["kv_lora"] * (d["nope"] + d["v_head"])
    return fp8 + 2 * bf16


MLA_SEQ_MAX_CONTEXT = 512  # fit_mla's rows: contexts this short, where the cache reads are small


def fit_mla(rows: list[dict], kernel_floor: float, attention_floor: float, hbm: float, gpu) -> dict:
    """The module's time (bf16 latent cache, FP8 block GEMMs) less its reads at `hbm` and the
    fixed costs the step model already charges an MLA layer's attention (ops.MLA_MODULE_KERNELS
    kernel floors and one decode attention floor), at contexts up to MLA_SEQ_MAX_CONTEXT and
    every batch (1-256) and head count (16, 32, 128) the table has: what is left grows with the
    batch, and faster with more heads. Least squares on floor + batch x (per_seq + heads x
    per_head): `mla_floor_s` a layer, `mla_seq_s` and `mla_seq_head_s` a decoding token."""
    bw = gpu.hbm_bandwidth_bytes_per_s * hbm
    points = [
        (r["batch"], r["batch"] * r["heads"],
         r["latency_us"] * 1e-6 - (mla_module_bytes(int(r["heads"])) + r["batch"] * r["context_len"] * MLA_V3_CACHE_BYTES) / bw
         - MLA_MODULE_KERNELS * kernel_floor - attention_floor)
        for r in rows if r["kv_cache_dtype"] == "bfloat16" and r["gemm_type"] == "fp8_block" and r["context_len"] <= MLA_SEQ_MAX_CONTEXT
    ]  # fmt: skip
    floor, per_seq, per_head = _least_squares([(1.0, b, bh) for b, bh, _ in points], [y for *_, y in points])
    return {"mla_floor_s": floor, "mla_seq_s": per_seq, "mla_seq_head_s": per_head}


def _least_squares(xs: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """The coefficients minimising sum (y - c . x)^2: the normal equations, by Gauss-Jordan (their
    matrix is symmetric positive definite for independent columns: no pivot is ever zero)."""
    n = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(n)] + [sum(x[i] * y for x, y in zip(xs, ys))] for i in range(n)]
    for col in range(n):
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit_allreduce(rows: list[dict], gpu) -> dict:
    per_direction = gpu.nvlink_bandwidth_bytes_per_s / 2
    small = [r["latency_us"] * 1e-6 for r in rows if r["impl"] == "vllm_custom_graph" and r["message_bytes"] <= 16384]
    busbw = [
        2 * (r["tp"] - 1) / r["tp"] * r["message_bytes"] / (r["latency_us"] * 1e-6) / per_direction
        for r in rows if r["impl"] == "nccl" and r["message_bytes"] >= 64 * 2**20 and r["tp"] == 8
    ]  # fmt: skip
    return {"allreduce_latency_s": statistics.median(small), "allreduce_bw": min(1.0, statistics.median(busbw))}


def calibrate(folder: Path, system: str) -> dict:
    """Every kernel-fitted figure from the tables of one system."""
    gpu = get_gpu(SYSTEMS[system])
    gemm = fit_gemm(read(folder / f"gemm_{system}.csv"), gpu)
    attn = fit_attention(read(folder / f"attn_prefill_{system}.csv"), read(folder / f"attn_decode_{system}.csv"),
                         gemm["kernel_overhead_s"], gemm["hbm"], gpu)  # fmt: skip
    head_dims = folder / f"attn_prefill_hd_{system}.csv"  # none for A100: its table has head size 128 only
    if head_dims.exists():
        attn.update(fit_attention_head_dim(read(folder / f"attn_prefill_{system}.csv"), read(head_dims), gpu))
    mla_table = folder / f"mla_decode_{system}.csv"  # none for A100: AIConfigurator has no vLLM MLA table there
    mla = fit_mla(read(mla_table), gemm["kernel_overhead_s"], attn["attention_floor_s"], gemm["hbm"], gpu) if mla_table.exists() else {}
    moe = fit_moe(read(folder / f"moe_{system}.csv"), gemm, gpu)
    marlin = folder / f"moe_marlin_{system}.csv"  # Marlin's W4A16 fused MoE (gpt-oss's MXFP4 experts without Triton's)
    if marlin.exists():
        moe["moe_gemm_marlin"] = fit_moe_at(read(marlin), gemm, gpu, moe["moe_half_inter"])["moe_gemm_4bit"]
    if mxfp4_moe_backend(float(gpu.compute_capability)) == "marlin":  # below SM 9.0: every 4-bit expert on Marlin
        moe["moe_gemm_4bit"] = moe["moe_gemm_marlin"]
        # ASSUMPTION: Marlin's dense GEMM (FP8, AWQ, GPTQ weights there) reaches the share of the
        # dense ceiling its fused-MoE form does (no dense Marlin table in the wheel).
        moe["gemm_weight_only"] = gemm["gemm_bf16"] * moe["moe_gemm_4bit"]
    return {**gemm, **attn, **moe, **mla, **fit_allreduce(read(folder / f"allreduce_{system}.csv"), gpu)}  # fmt: skip
