"""Serving parameters derived from a layout: vLLM and Ray arguments, pod sizes,
/dev/shm and the model-weight storage figures (sized in infra/planning/startup.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.catalog.instances import InstanceType
from infra.planning.memory import GiB, MiB

# vLLM's defaults for the OpenAI API server (vllm/engine/arg_utils.py,
# EngineArgs._set_default_args, v0.10-0.11): GPUs with at least 70 GiB get 8192
# batched tokens and 1024 sequences, smaller ones 2048 and 256.
LARGE_GPU_BYTES = 70 * GiB
DEFAULT_BATCHED_TOKENS = {True: 8192, False: 2048}
DEFAULT_MAX_NUM_SEQS = {True: 1024, False: 256}

# KV block size in tokens: vLLM's default on CUDA is 16; the MLA backends
# (FlashMLA, CUTLASS MLA) use 64 (vllm/platforms/cuda.py, check_and_update_config).
BLOCK_SIZE_DEFAULT = 16
BLOCK_SIZE_MLA = 64

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


def uses_mla_blocks(kinds: set[str]) -> bool:
    return bool(kinds & {"mla", "compressed"})


def default_batched_tokens(visible_bytes: int) -> int:
    return DEFAULT_BATCHED_TOKENS[visible_bytes >= LARGE_GPU_BYTES]


def default_max_num_seqs(visible_bytes: int) -> int:
    return DEFAULT_MAX_NUM_SEQS[visible_bytes >= LARGE_GPU_BYTES]


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
) -> list[str]:
    """Arguments of `vllm serve` for the whole cluster."""
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
        # Ray spans the nodes of a replica; one node could use "mp", but the
        # stack always runs vLLM inside a RayCluster, so it is always "ray".
        "--distributed-executor-backend", "ray",
    ]  # fmt: skip
    return args
