"""The serving cluster's start: what each node reads, how long a cold start takes, and every budget derived from it.

One calculation, so the figures cannot drift apart: the plan's cold-start
estimate, the storage throughput it needs, the head's startup probe, how long
the head may take to be Ready once placed (what `python -m infra rollout` and
the benchmark Job allow; `pulumi up` waits for neither the weights nor the
head), and the two vLLM timeouts set in the pods
(`VLLM_ENGINE_READY_TIMEOUT_S`, `VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`). `plan`
prints them ("Start-up") and the plan's JSON carries them (`startup`).

What a node reads at a cold start (vLLM 0.34.0, the default safetensors loader)
------------------------------------------------------------------------------
Every rank reads every shard of the checkpoint: `model_loader/default_loader.py`
`DefaultModelLoader._prepare_weights` hands each rank the full list of
`*.safetensors` files in the index, and `model_loader/weight_utils.py`
`safetensors_weights_iterator` opens each one and `get_tensor`s every key;
the pipeline stage's filter (`is_pp_missing_parameter`) and the tensor-parallel
slicing (each parameter's `weight_loader`) run inside `model.load_weights`,
after the read. A shard is skipped only when the model declares every tensor in
it unused (`filter_safetensors_files_by_weight_name`, defined for MTP draft
models, not for DeepSeek-V4 or Kimi K3), and expert tensors only with
`--enable-expert-parallel --enable-ep-weight-filter`. The MTP layers and a
vision tower the plan leaves out are read too and dropped by name. So each node
reads the whole checkpoint from the weight store, once if its page cache holds
it (the ranks of a pod read the same files of the same mount, and the page cache
is shared; it is charged to the pod's memory limit), and the cluster reads it
once per node. The automatic prefetch on NFS/Lustre (same function) splits the
files by global rank and so warms only a node's share, in parallel; it changes
how fast, not how much, a node reads.

The timeouts (0.34.0)
---------------------
- `VLLM_ENGINE_READY_TIMEOUT_S` (`envs.py`, default 600): the API server's wait
  for the engine's first message (`v1/engine/core_client.py`). With one API
  server the engine is started in-process and the load is not bounded by it; it
  is a hard limit when the frontend is a separate process (the Rust frontend,
  `--api-server-count` > 1, data parallel), where a long load ends in
  "Timed out waiting for engine core processes to start". Set to the engine's
  share of the startup probe, so the kubelet, not vLLM, decides first.
- `VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS` (default 300): each `execute_model` /
  `sample_tokens` RPC of `v1/executor/multiproc_executor.py` (inherited by
  `RayExecutorV2`); load, compile and warm-up RPCs have none. A step may
  JIT-compile kernels the warm-up did not (DeepGEMM, Triton, on a shape first
  seen, with a cold cache), so it gets vLLM's default plus the compile allowance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.planning.memory import GiB
from infra.planning.serving import NFS_CLIENT_BYTES_PER_S, STORAGE_MARGIN, PodResources, Storage

# Engine start after the weights are read: Ray workers, torch.compile and the
# JIT kernels, KV-cache profiling, CUDA-graph capture. ASSUMPTION: 180 s for a
# large MoE (vLLM logs show 30-90 s compile and 10-60 s graph capture), of which
# COMPILE_S is compilation, what a kept compile cache saves on the next start
# (CUDA graphs are captured at every start; vLLM never writes them to disk).
ENGINE_INIT_S = 180.0
COMPILE_S = 90.0
# The estimate assumes the store delivers its planned throughput: 50 % margin.
COLD_START_MARGIN = 1.5
RAY_JOIN_TIMEOUT_S = 600  # the head waits this long for every GPU node to join Ray (ray_wait.py)
STARTUP_PERIOD_S = 10  # the head's startupProbe period
# What the head may take beyond the startup budget: pulling the serving image onto
# fresh nodes. ASSUMPTION: 20 minutes covers a ~20 GiB image from ECR in region.
IMAGE_PULL_ALLOWANCE_S = 1200
VLLM_EXECUTE_MODEL_TIMEOUT_DEFAULT_S = 300  # vllm/envs.py
# Host memory of one GPU rank's process besides the page cache (CUDA context,
# pinned buffers, the Python process). ASSUMPTION: 16 GiB per rank.
HOST_BYTES_PER_RANK = 16 * GiB


def storage_plan(*, checkpoint_bytes: int, nodes: int, cold_start_target_s: float) -> Storage:
    """Size and throughput of the weight store: every node reads the whole checkpoint (module doc)."""
    per_node = checkpoint_bytes
    read = per_node * max(nodes, 1)
    load_budget = max(cold_start_target_s - ENGINE_INIT_S, 1.0)
    required = math.ceil(read / load_budget)
    per_node_rate = min(required / max(nodes, 1), NFS_CLIENT_BYTES_PER_S)
    return Storage(
        size_bytes=math.ceil(checkpoint_bytes * STORAGE_MARGIN / GiB) * GiB,
        checkpoint_bytes=checkpoint_bytes,
        read_bytes=read,
        required_read_bytes_per_s=required,
        cold_start_target_s=cold_start_target_s,
        estimated_cold_start_s=per_node / per_node_rate + ENGINE_INIT_S,
        per_node_read_bytes=per_node,
    )


@dataclass(frozen=True)
class Startup:
    node_read_bytes: int  # what one node reads from the weight store: the whole checkpoint
    node_read_bytes_per_s: int  # its share of the store's throughput, at most one NFS client's
    weights_read_s: float
    engine_init_s: float
    compile_s: float  # part of engine_init_s a kept compile cache saves
    cold_start_s: float  # weights read + engine init, from an empty compile cache
    restart_s: float  # the same for a container restart, which keeps the pod's compile cache (an emptyDir)
    page_cache_bytes: int  # what the pod's memory leaves for the page cache
    page_cache_holds_checkpoint: bool  # else a node may read parts of the checkpoint more than once
    ray_join_timeout_s: int
    engine_ready_timeout_s: int  # VLLM_ENGINE_READY_TIMEOUT_S
    execute_model_timeout_s: int  # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
    startup_probe_period_s: int
    startup_probe_failure_threshold: int
    startup_budget_s: int  # the head's startup probe: container start to a healthy engine
    image_pull_allowance_s: int
    ready_wait_s: int  # how long the head may take to be Ready once its pod is placed (rollout, benchmark)


def startup_plan(storage: Storage, pod: PodResources) -> Startup:
    per_node = storage.per_node_read_bytes
    read_s = storage.estimated_cold_start_s - ENGINE_INIT_S
    rate = math.floor(per_node / read_s) if read_s > 0 else per_node
    cold = storage.estimated_cold_start_s
    engine_ready = math.ceil(COLD_START_MARGIN * cold)
    threshold = math.ceil((RAY_JOIN_TIMEOUT_S + engine_ready) / STARTUP_PERIOD_S)
    budget = threshold * STARTUP_PERIOD_S
    cache = max(pod.memory_bytes - pod.shm_bytes - pod.gpus * HOST_BYTES_PER_RANK, 0)
    return Startup(
        node_read_bytes=per_node,
        node_read_bytes_per_s=rate,
        weights_read_s=read_s,
        engine_init_s=ENGINE_INIT_S,
        compile_s=COMPILE_S,
        cold_start_s=cold,
        restart_s=cold - COMPILE_S,
        page_cache_bytes=cache,
        page_cache_holds_checkpoint=per_node <= cache,
        ray_join_timeout_s=RAY_JOIN_TIMEOUT_S,
        engine_ready_timeout_s=engine_ready,
        execute_model_timeout_s=VLLM_EXECUTE_MODEL_TIMEOUT_DEFAULT_S + math.ceil(COLD_START_MARGIN * COMPILE_S),
        startup_probe_period_s=STARTUP_PERIOD_S,
        startup_probe_failure_threshold=threshold,
        startup_budget_s=budget,
        image_pull_allowance_s=IMAGE_PULL_ALLOWANCE_S,
        ready_wait_s=budget + IMAGE_PULL_ALLOWANCE_S,
    )
