"""Serving parameters derived from a layout: vLLM and Ray arguments, pod sizes,
/dev/shm and the model-weight storage figures (sized in infra/planning/startup.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

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
) -> list[str]:
    """Arguments of `vllm serve` for the whole cluster.

    `speculative`: the `--speculative-config` JSON (engine/arg_utils.py parses it
    with json.loads into SpeculativeConfig, e.g. {"method": "mtp",
    "num_speculative_tokens": 1}). `async_scheduling`: set only to override the
    release's default (--async-scheduling / --no-async-scheduling).

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
    args += [
        # Ray spans the nodes of a replica; one node could use "mp", but the
        # stack always runs vLLM inside a RayCluster, so it is always "ray".
        "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    return args
