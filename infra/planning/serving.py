"""Serving parameters derived from a layout: vLLM and Ray arguments, pod sizes,
/dev/shm and the model-weight storage figures (sized in infra/planning/startup.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from infra.catalog.arch import ModelArch
from infra.catalog.instances import InstanceType
from infra.planning.memory import GiB, MiB

# vLLM's defaults for the OpenAI API server (vllm/engine/arg_utils.py,
# EngineArgs.get_batch_defaults / _set_default_args, 0.10-0.34): GPUs with at
# least 70 GiB that are not A100s get 8192 batched tokens and 1024 sequences,
# others 2048 and 256; from 0.28 GPUs with at least 160 GiB get 16384 and 1024.
LARGE_GPU_BYTES = 70 * GiB
HUGE_GPU_BYTES = 160 * GiB
DEFAULT_BATCHED_TOKENS = {"huge": 16384, "large": 8192, "small": 2048}
DEFAULT_MAX_NUM_SEQS = {"huge": 1024, "large": 1024, "small": 256}

# Smallest --max-num-batched-tokens the search tries. ASSUMPTION: vLLM's own
# default for GPUs under 70 GiB (above); a smaller chunk makes long prompts take
# more scheduler steps than the reservations it saves are worth.
MIN_SEARCHED_BATCHED_TOKENS = 2048
# A batch knob leaves vLLM's default only when that holds this much more
# (ASSUMPTION: 10%): smaller chunks and synchronous scheduling cost prefill and
# decode throughput.
BATCH_KNOB_GAIN = 0.10

# max-model-len when neither the stack nor the user sets it: the model's own
# limit, capped. ASSUMPTION: 128 Ki tokens is what a production chat / agent
# endpoint is usually offered at; longer contexts are a deliberate choice.
DEFAULT_MAX_MODEL_LEN_CAP = 131072

# Typical context of a live request, used to size max-num-seqs from the KV cache.
# ASSUMPTION: 8 Ki tokens (prompt + output) for chat and agent traffic.
TYPICAL_CONTEXT_TOKENS = 8192

# Kept back on each node for the kubelet, the OS and the DaemonSets (GPU operator,
# EFA device plugin, VPC CNI, node exporter). ASSUMPTION: 10% of vCPUs (at least
# 1) and 10% of RAM (at least 2 GiB); EKS's own kube-reserved is smaller.
SYSTEM_CPU_FRACTION = 0.10
SYSTEM_MEMORY_FRACTION = 0.10

# Ray's object store: vLLM moves tensors over NCCL, not through the object store,
# so it needs little. ASSUMPTION: 10% of the pod's memory, capped at 64 GiB
# (Ray's own default is 30% of available memory, far more than vLLM uses).
OBJECT_STORE_FRACTION = 0.10
OBJECT_STORE_CAP = 64 * GiB
# /dev/shm holds Ray's object store plus NCCL's shared-memory transport and vLLM's
# shared-memory broadcast queues. ASSUMPTION: 16 GiB on top of the object store,
# at most half of the pod's memory.
SHM_EXTRA = 16 * GiB

# Model-weight storage. ASSUMPTION: 15% over the checkpoint's weights for the
# tokenizer, configs and room for a second revision of the small files.
STORAGE_MARGIN = 1.15
# What one NFS client reads at most: Amazon EFS quotes 1,500 MiB/s per client
# (EFS user guide, "Amazon EFS quotas": throughput per client).
NFS_CLIENT_BYTES_PER_S = 1500 * MiB


# Root volume of a GPU node: container images and caches, not weights (those
# are on the shared file system). ASSUMPTION: the vLLM image is ~20 GiB
# compressed and ~40 GiB unpacked; containerd keeps both, and two versions live
# side by side during an upgrade (~120 GiB); torch.compile, Triton and
# FlashInfer JIT caches ~20 GiB; the OS, logs and kubelet ~20 GiB; rounded up
# with a margin to 200 GiB.
ROOT_VOLUME_GIB = 200


def _gpu_tier(visible_bytes: int, gpu_name: str, release) -> str:
    if release.at_least("0.28") and visible_bytes >= HUGE_GPU_BYTES:
        return "huge"
    if visible_bytes >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower():
        return "large"
    return "small"


def default_batched_tokens(visible_bytes: int, gpu_name: str, release) -> int:
    return DEFAULT_BATCHED_TOKENS[_gpu_tier(visible_bytes, gpu_name, release)]


def default_max_num_seqs(visible_bytes: int, gpu_name: str, release) -> int:
    return DEFAULT_MAX_NUM_SEQS[_gpu_tier(visible_bytes, gpu_name, release)]


def batch_knobs(batched_tokens: int | None, seqs: int | None, max_model_len: int, visible_bytes: int, gpu_name: str,
                release) -> tuple[int, int]:  # fmt: skip
    """(--max-num-batched-tokens, --max-num-seqs) as vLLM resolves them (engine/arg_utils.py): each
    pinned value as given, else the release's default for the GPU; from 0.12 a defaulted batched
    tokens at most max-num-seqs x max-model-len (Release.caps_default_batched_tokens), then from
    0.10.1 a defaulted max-num-seqs at most the batched tokens (Release.caps_default_max_num_seqs)."""
    tokens = batched_tokens or default_batched_tokens(visible_bytes, gpu_name, release)
    n = seqs or default_max_num_seqs(visible_bytes, gpu_name, release)
    if not batched_tokens and release.caps_default_batched_tokens:
        tokens = min(n * max_model_len, tokens)
    if not seqs and release.caps_default_max_num_seqs:
        n = min(n, tokens)
    return tokens, n


def searched_batched_tokens(default: int) -> list[int]:
    """--max-num-batched-tokens the search tries: powers of two from the floor up to
    vLLM's default (a larger chunk only adds activations and reservations)."""
    out, n = [], MIN_SEARCHED_BATCHED_TOKENS
    while n < default:
        out.append(n)
        n *= 2
    return out + [default]


@dataclass(frozen=True)
class PodResources:
    cpu: int  # cores requested by the Ray pod that owns the node
    memory_bytes: int
    gpus: int
    efa_interfaces: int
    shm_bytes: int  # memory-backed /dev/shm emptyDir
    object_store_bytes: int  # Ray --object-store-memory



def pod_resources(itype: InstanceType) -> PodResources:
    cpu = itype.vcpus - max(1, math.ceil(itype.vcpus * SYSTEM_CPU_FRACTION))
    memory = itype.memory_bytes - max(2 * GiB, int(itype.memory_bytes * SYSTEM_MEMORY_FRACTION))
    object_store = min(int(memory * OBJECT_STORE_FRACTION), OBJECT_STORE_CAP)
    shm = min(object_store + SHM_EXTRA, memory // 2)
    gib = lambda n: n // GiB * GiB  # whole GiB, so the Kubernetes quantities stay readable  # noqa: E731
    return PodResources(
        cpu=cpu,
        memory_bytes=gib(memory),
        gpus=itype.gpu_count,
        efa_interfaces=itype.max_efa_interfaces,
        shm_bytes=gib(shm),
        object_store_bytes=gib(object_store),
    )


def ray_start_params(pod: PodResources) -> dict[str, str]:
    """`ray start` parameters for every node (head included: it runs a vLLM rank)."""
    return {
        "num-cpus": str(pod.cpu),
        "num-gpus": str(pod.gpus),
        "object-store-memory": str(pod.object_store_bytes),
    }


@dataclass(frozen=True)
class Storage:
    size_bytes: int  # provisioned size of the model-weight file system
    checkpoint_bytes: int  # the checkpoint as published (MTP layers included)
    read_bytes: int  # what all nodes read at a cold start (each reads the whole checkpoint)
    required_read_bytes_per_s: int  # to read it within the cold-start target
    cold_start_target_s: float
    estimated_cold_start_s: float  # read at the required rate (or the client limit) + engine init
    per_node_read_bytes: int
    # Computed by infra.planning.startup.storage_plan.



def vllm_args(
    *,
    tp: int,
    pp: int,
    dp: int,
    expert_parallel: bool,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_cache_dtype: str,
    speculative: dict | None = None,
    async_scheduling: bool | None = None,
    mfu_metrics: bool = False,
    nodes: int = 1,
) -> list[str]:
    """Arguments of `vllm serve` for the whole cluster.

    `speculative`: the `--speculative-config` JSON (engine/arg_utils.py parses it
    with json.loads into SpeculativeConfig, e.g. {"method": "mtp",
    "num_speculative_tokens": 1}). `async_scheduling`: set only to override the
    release's default (--async-scheduling / --no-async-scheduling). `mfu_metrics`:
    pass --enable-mfu-metrics (the estimated FLOPs / bytes counters), which the plan
    does when `mfu_metrics_gap` finds none for the model as served.

    vLLM 0.34's extensible KV cache stays on (no --no-enable-extensible-kv-cache):
    it sizes the cache from memory measured after the real CUDA-graph capture,
    which the planner models (memory.kv_budget_bytes), rather than from the
    capture estimate that over-states some layouts.
    """
    args = [
        "--tensor-parallel-size", str(tp),
        "--pipeline-parallel-size", str(pp),
    ]  # fmt: skip
    if dp > 1:
        args += ["--data-parallel-size", str(dp)]
        if nodes > 1 and dp % nodes == 0:  # uneven only in a layout the plan refuses (TP not dividing a node)
            args += data_parallel_over_nodes(dp, nodes)
    if expert_parallel:
        args.append("--enable-expert-parallel")
    args += [
        "--gpu-memory-utilization", f"{gpu_memory_utilization:.2f}",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--max-num-batched-tokens", str(max_num_batched_tokens),
        "--kv-cache-dtype", kv_cache_dtype,
    ]  # fmt: skip
    if speculative:
        args += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    if async_scheduling is not None:
        args.append("--async-scheduling" if async_scheduling else "--no-async-scheduling")
    if mfu_metrics:
        args.append("--enable-mfu-metrics")
    args += [
        # Ray spans the nodes of a replica; one node could use "mp", but the
        # stack always runs vLLM inside a RayCluster, so it is always "ray".
        "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    return args


def data_parallel_over_nodes(dp: int, nodes: int) -> list[str]:
    """The flags that let one `vllm serve` on the head start data-parallel ranks on every node
    (vLLM 0.34.0; docs/serving/data_parallel_deployment.md, "This DP mode can also be used
    with Ray"). Without them the default "mp" backend starts every rank's engine on the head
    (engine/arg_utils.py: data_parallel_size_local defaults to data_parallel_size) with
    127.0.0.1 as the DP address (ParallelConfig.master_addr), where every worker's world group
    meets (distributed/parallel_state.py init_distributed_environment, data_parallel_size > 1):
    the Ray workers the ranks on the other pods get cannot reach it, and the engine never
    starts. With the "ray" backend the head's IP is the address (arg_utils.py: get_ip(), i.e.
    VLLM_HOST_IP, the pod IP) and v1/engine/utils.py create_dp_placement_groups gives the head
    `--data-parallel-size-local` ranks and every other node as many (VLLM_RAY_DP_PACK_STRATEGY
    "strict", its default: a rank's TP GPUs on one node, as the layout rules keep them), so
    the flag is the ranks per node: the head refuses to start with fewer GPUs than it asks for."""
    return ["--data-parallel-size-local", str(dp // nodes), "--data-parallel-backend", "ray"]


# --- --enable-mfu-metrics ---------------------------------------------------------------
#
# What the flag does in vLLM 0.34.0 (paths inside the wheel's `vllm/`):
# - v1/core/sched/scheduler.py `Scheduler.__init__` builds `v1/metrics/perf.py::ModelMetrics`
#   (only with log stats on, the server's default); `Scheduler.update_from_output` calls
#   `ModelMetrics.get_step_perf_stats_per_gpu(scheduler_output)` once per engine step, in the
#   engine-core process (the one that schedules; with the Ray executor the workers never
#   see it). That is a Python loop over the step's scheduled requests (a dict lookup and
#   `ExecutionContext.add` each) and a fixed set of closed-form sums per component; pure
#   integer arithmetic on the scheduler output: no tensor, no kernel, no GPU sync.
#   Models with sliding-window layers walk the requests three more times
#   (`ExecutionContext.total_token_context_product` and the `*_for_window` sums).
#   benchmarks/mfu_step_cost.py times the wheel's own loop (taken by ast, vLLM not imported):
#   0.3-0.8 us per scheduled request on a development machine (Python 3.11), 0.1 ms at 256
#   requests, as much again with sliding-window layers. That is under 1% of the fitted
#   69 us per token a step hands on (perf/fitted.py `seq_overhead_s`), below what
#   the fit resolves (ASSUMPTION: the engine's CPU is of the same class): the performance
#   model is left as is.
# - The figures travel in `SchedulerStats.perf_stats` to the API server, where
#   v1/metrics/loggers.py `PrometheusStatLogger` feeds perf.py `PerfMetricsProm`: counters
#   `vllm:estimated_flops_per_gpu_total`, `vllm:estimated_read_bytes_per_gpu_total`,
#   `vllm:estimated_write_bytes_per_gpu_total`, labels `model_name`, `engine` (Ray's
#   wrappers export the same, `ray_wrappers.py::RayPerfMetricsProm`). `PerfMetricsProm` is
#   built whatever the flag, so without it the series exist and stay at 0.
#   VLLM_DEBUG_MFU_METRICS=1 adds a per-component breakdown and the calculation's own share
#   of the interval to the periodic log line (`PerfMetricsDebugLogging`).
# - "Per GPU" is the average stage: layers are divided by --pipeline-parallel-size
#   (FFN and MLA with floor division), heads by --tensor-parallel-size; the LM head is billed
#   to every GPU (`UnembedMetrics` divides by TP only) although only the last stage runs it.
# - Each `ComponentMetrics` (attention, MLA attention, FFN, LM head) is instantiated from the
#   config or dropped when a parser raises `InvalidComponent`, logged at DEBUG only: the
#   counters then silently count the rest. tests/fixtures/metrics/vllm-0.34.0-mfu-estimator.json
#   holds what the parsers accept (extracted from the wheel).
#
# The plan passes the flag only where the figures mean what the dashboard says they mean.

# perf.py `_QUANT_WEIGHT_BYTE_SIZE`: the quantization methods (`QuantizationConfig.get_name()`)
# the attention and FFN parsers accept; any other drops both components.
MFU_QUANT_METHODS = frozenset({
    "awq", "awq_marlin", "compressed-tensors", "experts_int8", "fbgemm_fp8", "fp8", "gptq", "gptq_marlin", "inc",
    "modelopt", "modelopt_fp4", "modelopt_mxfp8", "moe_wna16", "mxfp4", "petit_nvfp4", "ptpc_fp8", "quark", "torchao",
})  # fmt: skip

# Text model types whose layers perf.py's components describe, read against the family's
# config and vLLM's model: GQA attention (`AttentionMetrics`, sliding windows from
# `layer_types`), MLA (`MLAAttentionMetrics`: kv_lora_rank, qk_nope/rope, v_head_dim;
# DeepSeek-V3's dense first layers from `first_k_dense_replace`), SwiGLU dense and MoE FFN.
# ASSUMPTION: MLA's attention core is billed un-absorbed (q.k over qk_nope + qk_rope, per
# head) while decode runs absorbed over the 512 + 64 latent; its KV-cache reads (the
# compressed latent) are right, and at chat contexts the core is a small share of a step.
MFU_FAMILIES = frozenset({"llama", "qwen3", "qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3", "kimi_k2"})

# Families the estimator has no component for, or bills as something they are not.
MFU_FAMILY_GAPS: dict[str, str] = {
    "deepseek_v4": (
        "vLLM 0.34.0's estimator (v1/metrics/perf.py) has no component for DeepSeek-V4's compressed sparse "
        "attention: AttentionMetrics skips it (is_deepseek_mla), MLAAttentionMetrics needs kv_lora_rank, which "
        "DeepseekV4Config does not have, and its quantization method deepseek_v4_fp8 is not in "
        "_QUANT_WEIGHT_BYTE_SIZE, so FfnMetrics is dropped too: the counters would hold the LM head alone"
    ),
    "kimi_linear": (
        "vLLM 0.34.0's estimator (v1/metrics/perf.py) bills every Kimi K3 layer as MLA over the whole context "
        "(is_deepseek_mla lists kimi_linear): its KDA linear-attention layers, three in four, keep a fixed state "
        "instead, and the latent MoE's routed_expert_hidden_size is not read, so FLOPs and bytes would be wrong"
    ),
    "deepseek_v32": (
        "vLLM 0.34.0's estimator (v1/metrics/perf.py) bills DeepSeek-V3.2's sparse attention (the lightning "
        "indexer's top-2048 tokens) as dense MLA over the whole context and leaves the indexer out, so FLOPs and "
        "bytes would be wrong past 2,048 tokens of context"
    ),
}

DATA_PARALLEL_GAP = (
    "with --data-parallel-size {dp}, vLLM 0.34.0's estimator shards every FFN over the data x tensor parallel GPUs "
    "(v1/metrics/perf.py FfnParallelParser: ffn_tp_size = dp_size * tp_size): a dense MLP, which each engine "
    "shards over its own tensor-parallel GPUs, is under-counted {dp}-fold, and a MoE's figure is one engine's share "
    "of every GPU's work, which neither an average nor a sum over the engines' counters turns into a per-GPU figure "
    "(vLLM's own aggregated log line leaves them out for that reason: loggers.py "
    "AggregatedLoggingStatLogger._enable_perf_stats)"
)

SPECULATIVE_GAP = (
    "with speculative decoding, vLLM 0.34.0's estimator bills each decode step that carries draft tokens as a "
    "prefill chunk (v1/metrics/perf.py ModelMetrics.get_step_perf_stats_per_gpu: is_prefill = num_tokens > 1): "
    "KV-cache reads at the activation dtype (MLA's as decompressed K and V), logits for one token per request, "
    "and the draft model's own forward not at all"
)

# How vLLM 0.34.0 names a checkpoint's quantization (`get_name()`), by the scheme the
# planner read for its quantised groups (infra/catalog/quant.py `Scheme.kind`) or, for
# groups without one, their stored format: awq/gptq load as auto_awq/auto_gptq
# (quantization/auto_awq.py, auto_gptq.py), gpt-oss's mxfp4 as gpt_oss_mxfp4 (mxfp4.py
# GptOssMxfp4Config), compressed-tensors' pack-quantized and MXFP4 as compressed-tensors,
# ModelOpt NVFP4 as modelopt_fp4, FP8 block checkpoints as fp8 (DeepSeek-V4's as
# deepseek_v4_fp8, models/deepseek_v4/quant_config.py, a family gap above anyway).
_SCHEME_METHODS = {"awq": "auto_awq", "gptq": "auto_gptq", "gpt_oss_mxfp4": "gpt_oss_mxfp4",
                   "wna16": "compressed-tensors", "int8": "compressed-tensors", "mxfp4": "compressed-tensors",
                   "nvfp4": "modelopt_fp4", "fp8": "fp8"}  # fmt: skip
_FORMAT_METHODS = {"fp8": "fp8", "nvfp4": "modelopt_fp4"}
_UNQUANTISED = {"bf16", "fp16", "fp32"}


def vllm_quant_method(arch: ModelArch) -> str | None:
    """The quantization method vLLM 0.34.0 loads `arch`'s checkpoint with (None: unquantised;
    "unknown (<formats> weights)" when the plan cannot tell, the methods joined with "+" when
    its groups disagree)."""
    methods, unknown = set(), set()
    for layer in arch.layers:
        for group in layer.params:
            kind = getattr(group.scheme, "kind", None)
            if kind is not None:
                methods.add(_SCHEME_METHODS.get(kind, kind))
            elif group.fmt not in _UNQUANTISED:
                (methods.add(_FORMAT_METHODS[group.fmt]) if group.fmt in _FORMAT_METHODS else unknown.add(group.fmt))
    if arch.model_type == "deepseek_v4" and methods | unknown:
        return "deepseek_v4_fp8"
    if unknown:
        return f"unknown ({'+'.join(sorted(unknown))} weights)"
    if len(methods) > 1:
        return "+".join(sorted(methods))
    return next(iter(methods), None)


def mfu_metrics_gap(arch: ModelArch, *, speculative: bool, dp: int) -> str | None:
    """Why vLLM 0.34.0's estimated FLOPs / bytes counters would not measure `arch` as served
    (`speculative`: with a --speculative-config; `dp`: --data-parallel-size); None: they do,
    and the plan passes --enable-mfu-metrics."""
    if arch.model_type in MFU_FAMILY_GAPS:
        return MFU_FAMILY_GAPS[arch.model_type]
    if arch.model_type not in MFU_FAMILIES:
        return (f"vLLM 0.34.0's estimator (v1/metrics/perf.py) has not been read against {arch.model_type} "
                "models here; it drops what it does not recognise without a word")  # fmt: skip
    method = vllm_quant_method(arch)
    if method is not None and method not in MFU_QUANT_METHODS:
        return (f"the checkpoint loads as quantization method {method}, which vLLM 0.34.0's estimator does not know "
                "(v1/metrics/perf.py _QUANT_WEIGHT_BYTE_SIZE): it drops the attention and FFN components and the "
                "counters would hold the LM head alone")  # fmt: skip
    if speculative:
        return SPECULATIVE_GAP
    if dp > 1:
        return DATA_PARALLEL_GAP.format(dp=dp)
    return None
