"""Cross-check against NVIDIA AIConfigurator (`python -m infra perf --compare-aiconfigurator`).

`compare(request, root=...)` asks AIConfigurator 0.12.0 for the aggregated-serving
(one engine, no prefill/decode split) TTFT, TPOT and output tokens/s per GPU and per
user of one layout at several concurrencies. It is `cli_estimate` (aiconfigurator/cli/api.py)
in database mode SILICON: GEMMs, attention/MLA, MoE and collectives come from NVIDIA's
measured kernel tables (aiconfigurator_core/systems/data/<system>/<op>/<backend>/<version>/),
norms, activations and embeddings from its formulas (`op_sources` counts both). A
point its tables do not cover comes back with covered false and the reason (no system
or no database for the GPU, model not supported, a kernel shape missing, does not fit),
never as an error.

AIConfigurator is not a dependency of the stack: it runs in its own virtualenv,
venv-perf/, installed from requirements-perf.txt on first use (`ensure_venv`, as
infra/preview/scan.py does for checkov), through `aiconfigurator_driver.py` (JSON on
stdin and stdout), the only file that imports it.

Request: {"model": the Hugging Face repo of the checkpoint served, "gpu": a catalog GPU
name, "tp", "pp", "dp", "expert_parallel": bool (vLLM --enable-expert-parallel: EP over
tp x dp) or an EP size, "isl", "osl", "concurrencies": [...], "weights": None (the
checkpoint's own; best) | "bf16" | "fp8" | "mxfp4" | "nvfp4" | "int4" | a catalog label such
as "fp8+mxfp4 experts", "kv_cache_dtype": None |
"auto" | "bfloat16" | "fp8"... (None, auto: aiconfigurator's choice, fp8 for DeepSeek's
checkpoints), "backend": "vllm" (default) | "trtllm" | "sglang", "backend_version": None
(the package's current one, vLLM 0.24.0 on H100/H200/B200)}.

Answer, per concurrency: concurrency, covered, reason ("" when covered), ttft_ms, tpot_ms,
output_tokens_per_s_per_gpu, output_tokens_per_s_per_user, system, backend,
backend_version; and batch_size (per pipeline stage and DP rank), request_latency_ms,
gpus, parallel, quant, memory_gib, op_sources, warning (KV cache too small for the
batch), support_matrix (the wheel's own verdict on model x system x backend, agg),
note, aiconfigurator_version.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

from infra.errors import UserError, unknown_name
from infra.preview import tool_venv

AIC_VERSION = "0.12.0"
REQUIREMENTS = "requirements-perf.txt"
VENV = "venv-perf"
STAMP = ".requirements-perf.sha256"
DRIVER = Path(__file__).with_name("aiconfigurator_driver.py")
BACKENDS = ("vllm", "trtllm", "sglang")
TIMEOUT_S = 120  # loading one system's tables (~15 s on 2 cores) ...
TIMEOUT_PER_POINT_S = 60  # ... then 2-7 s a point

# Catalog GPU (infra/catalog/gpus.py) -> AIConfigurator system (aiconfigurator_core/systems/<name>.yaml).
# None: the package has no system for that GPU.
SYSTEMS: dict[str, Optional[str]] = {
    "H100-SXM-80GB": "h100_sxm",
    "H200-141GB": "h200_sxm",
    "B200": "b200_sxm",
    "B300": "b300_sxm",
    "A100-80GB": "a100_sxm",  # its a100_sxm.yaml is the 80 GiB part
    "A100-40GB": None,  # no 40 GB A100 system
    "L40S": "l40s",
    "L4": "l4",  # a system file without data: not covered
    "A10G": None,
    "RTX-PRO-6000-Server": "rtx_pro_6000_server",
}

# Weight format (a --weight-format, or the catalog's label of a checkpoint: "fp8",
# "bf16+mxfp4 experts") -> cli_estimate's GEMM and MoE quant modes (GEMMQuantMode,
# MoEQuantMode in aiconfigurator_core/sdk/common.py). None: aiconfigurator's own reading
# of the checkpoint's config. fp8 is the 128 x 128 block-scaled format of the catalog
# (infra/catalog/formats.py). MXFP4 experts run W4A16 on Hopper, as vLLM runs them there
# (Marlin / Triton: the `w4a16_mxfp4` rows of h100_sxm/moe/vllm); elsewhere aiconfigurator picks.
GEMM = {"bf16": "bfloat16", "fp8": "fp8_block", "nvfp4": "nvfp4", "int4": "int4_wo", "mxfp4": None}
MOE = {"bf16": "bfloat16", "fp8": "fp8_block", "nvfp4": "nvfp4", "int4": "int4_wo", "mxfp4": None}
HOPPER = ("h100_sxm", "h200_sxm")
# --kv-cache-dtype -> KVCacheQuantMode (same file); "auto": what aiconfigurator infers from the checkpoint.
KV_CACHE = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_inc": "fp8", "fp8_ds_mla": "fp8"}


# --------------------------------------------------------------------------- the request


def system_for(gpu: str) -> Optional[str]:
    if gpu not in SYSTEMS:
        raise unknown_name("GPU", gpu, SYSTEMS)
    return SYSTEMS[gpu]


def quant_overrides(weights: Optional[str], system: str) -> dict[str, str]:
    if weights in (None, "", "auto"):
        return {}
    dense, _, experts = weights.partition("+")
    dense, experts = dense.strip(), experts.removesuffix("experts").strip() or dense.strip()
    for fmt in (dense, experts):
        if fmt not in GEMM:
            raise unknown_name("weight format", fmt, GEMM)
    moe = "w4a16_mxfp4" if experts == "mxfp4" and system in HOPPER else MOE[experts]
    return {k: v for k, v in (("gemm_quant_mode", GEMM[dense]), ("moe_quant_mode", moe)) if v}


def kv_override(kv_cache_dtype: Optional[str]) -> dict[str, str]:
    if kv_cache_dtype in (None, "", "auto"):
        return {}
    if kv_cache_dtype not in KV_CACHE:
        raise unknown_name("KV-cache dtype", kv_cache_dtype, [*KV_CACHE, "auto"])
    return {"kvcache_quant_mode": KV_CACHE[kv_cache_dtype]}


def batch_size(concurrency: int, pp: int, dp: int) -> int:
    """AIConfigurator's batch size for `concurrency` requests in flight.

    Its agg concurrency is batch_size x pp x attention-DP size (one batch per pipeline
    stage and DP rank; aiconfigurator_core/sdk/backends/base_backend.py, "correct
    output_throughput and concurrency for attention dp"), so the batch is the
    concurrency shared out, rounded up.
    """
    return max(1, math.ceil(concurrency / (pp * dp)))


def driver_request(request: dict[str, Any], system: str) -> dict[str, Any]:
    """The driver's JSON request for a validated `request` on `system`."""
    tp, pp, dp = (int(request.get(k, 1)) for k in ("tp", "pp", "dp"))
    if min(tp, pp, dp) < 1:
        raise UserError(f"tp, pp and dp must be at least 1, not {tp}, {pp}, {dp}")
    backend = request.get("backend", "vllm")
    if backend not in BACKENDS:
        raise unknown_name("backend", backend, BACKENDS)
    concurrencies = [int(c) for c in request["concurrencies"]]
    if not concurrencies or min(concurrencies) < 1:
        raise UserError(f"concurrencies must be positive: {request['concurrencies']!r}")
    # vLLM's FusedMoE spans the tp x dp ranks: sharded (TP) by default, whole
    # experts per rank (EP) with --enable-expert-parallel (vllm/model_executor/layers/fused_moe/config.py).
    # An int > 1 is an EP size of its own, the rest of the width sharding each expert.
    width, ep = tp * dp, request.get("expert_parallel")
    ep = width if ep is True else int(ep or 1)
    if width % ep:
        raise UserError(f"expert-parallel size {ep} does not divide tp x dp = {width}")
    return {
        "model": request["model"],
        "system": system,
        "backend": backend,
        "backend_version": request.get("backend_version"),
        "tp": tp, "pp": pp, "dp": dp,
        "moe_tp": width // ep,
        "moe_ep": ep,
        "isl": int(request["isl"]),
        "osl": int(request["osl"]),
        "quant": {**quant_overrides(request.get("weights"), system), **kv_override(request.get("kv_cache_dtype"))},
        "points": [{"concurrency": c, "batch_size": batch_size(c, pp, dp)} for c in concurrencies],
    }  # fmt: skip


def not_covered(request: dict[str, Any], reason: str, system: Optional[str] = None) -> list[dict[str, Any]]:
    return [{"concurrency": int(c), "covered": False, "reason": reason, "system": system,
             "backend": request.get("backend", "vllm"), "backend_version": None}
            for c in request["concurrencies"]]  # fmt: skip


# --------------------------------------------------------------------------- venv-perf/




def venv_python(root: Path) -> Path:
    return root / VENV / "bin" / "python"


def ensure_venv(root: Path, *, install: bool = True, log: Callable[[str], None] = lambda m: None) -> Path:
    """venv-perf/'s python, (re)installed from requirements-perf.txt when missing or out of date."""
    return tool_venv.ensure(
        root, venv=VENV, requirements=REQUIREMENTS, stamp=STAMP, tool="AIConfigurator", pinned="AIConfigurator's",
        note=f" (AIConfigurator {AIC_VERSION}, once; about 850 MB, 1-2 minutes)", install=install, log=log,
    )  # fmt: skip


def driver_env() -> dict[str, str]:
    """The driver's environment: nothing inherited but PATH and the locale; Hugging Face offline."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    return env


def run_driver(python: Path, payload: dict[str, Any], *, driver: Path = DRIVER, timeout: Optional[float] = None) -> dict[str, Any]:
    timeout = timeout or TIMEOUT_S + TIMEOUT_PER_POINT_S * len(payload["points"])
    try:
        proc = subprocess.run([str(python), "-I", str(driver)], input=json.dumps(payload), capture_output=True, text=True,
                              env=driver_env(), timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(f"AIConfigurator did not answer in {timeout:.0f} s") from None
    try:
        answer = json.loads(proc.stdout) if proc.returncode == 0 else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or len(answer.get("points", ())) != len(payload["points"]):
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"AIConfigurator's driver exited {proc.returncode}: {last}")
    return answer


def compare(request: dict[str, Any], *, root: Path, install: bool = True, python: Optional[Path] = None,
            driver: Path = DRIVER, log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """AIConfigurator's estimate of each concurrency of `request`: one dict per concurrency, in order.

    `python`: the interpreter to run the driver with instead of venv-perf/'s (nothing is installed then).
    """
    system = system_for(request["gpu"])
    if system is None:
        return not_covered(request, f"aiconfigurator has no system for {request['gpu']}")
    payload = driver_request(request, system)
    python = python or ensure_venv(root, install=install, log=log)
    answer = run_driver(python, payload, driver=driver)
    out = []
    for asked, got in zip(payload["points"], answer["points"]):
        point = {"ttft_ms": None, "tpot_ms": None, "output_tokens_per_s_per_gpu": None, "output_tokens_per_s_per_user": None,
                 **got, "concurrency": asked["concurrency"], "batch_size": asked["batch_size"],
                 "aiconfigurator_version": answer.get("aiconfigurator_version")}  # fmt: skip
        point["covered"] = bool(point.get("covered"))
        out.append(point)
    return out
