"""Checks of a serving stack, run as Jobs: the EFA fabric and the serving benchmark.

- `efa_check_service(spec)` + `efa_check_job(spec)`: `fi_info -p efa` and an
  NCCL all-reduce across two GPU nodes, failing below a bus-bandwidth floor.
- `benchmark_job(spec)`: `vllm bench serve` against the Service, failing when
  p99 TTFT or TPOT miss their thresholds (`check_benchmark_result`).

The serving image must carry the EFA userspace (libfabric >= 1.18) and the
aws-ofi-nccl plugin (>= 1.7) on its library path; without them NCCL silently
falls back to TCP sockets. The EFA check Job fails in exactly that case.
"""

from __future__ import annotations

import inspect
import shlex
import textwrap

from infra.k8s.raycluster import (
    gpu_pod_resources,
    nccl_env,
    node_selector,
    shm_mount,
    shm_volume,
    spec_hash,
    tolerations,
    weights_mount,
    weights_volume,
)
from infra.k8s.serving_spec import (
    API_PORT,
    CHECK_LABEL,
    EFA_CHECK_NODES,
    PART_OF,
    PROBE_PATH,
    RDZV_PORT,
    SPEC_HASH_ANNOTATION,
    GiB,
    ServingSpec,
    ready_timeout_s,
)

# --- EFA check ------------------------------------------------------------------
# nccl-tests reaches peak bus bandwidth with messages of a few GiB; 2 GiB, 5
# warm-up and 20 timed all-reduces take seconds on EFA and minutes on TCP.
ALLREDUCE_BYTES = 2 * GiB
ALLREDUCE_WARMUP = 5
ALLREDUCE_ITERS = 20
BUSBW_MARKER = "GPU_SERVING_BUSBW_GBPS="
EFA_CHECK_DEADLINE_S = 1800  # image pull, rendezvous and the run
FI_INFO_FALLBACK = "/opt/amazon/efa/bin/fi_info"  # where the EFA installer puts it

# --- Benchmark -------------------------------------------------------------------
BENCHMARK_RESULT_DIR = "/tmp/bench"
BENCHMARK_RESULT_FILE = "result.json"
BENCHMARK_RUN_ALLOWANCE_S = 1800
BENCHMARK_RESOURCES = {"requests": {"cpu": "250m", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}


# --- Checks: pure verdicts (their source runs inside the Jobs) -----------------------


def allreduce_bus_bandwidth_gbps(size_bytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of one all-reduce, GB/s: algbw x 2(n-1)/n (nccl-tests doc/PERFORMANCE.md)."""
    if seconds <= 0 or world_size < 1:
        raise ValueError("seconds must be positive and world_size at least 1")
    return size_bytes / seconds / 1e9 * (2 * (world_size - 1) / world_size)


def efa_check_problems(log_text: str, floor_gbps: float, efa_interfaces: int) -> list[str]:
    """Why an EFA check run failed (empty: it passed), from its log.

    The log must show aws-ofi-nccl selecting the EFA provider (NCCL_DEBUG=INFO,
    subsystem NET: `NET/OFI Selected Provider is efa (found N nics)`), no
    fallback to NCCL's Socket transport, and the all-reduce's bus bandwidth
    (the `GPU_SERVING_BUSBW_GBPS=` line) at or above the floor.
    """
    import re as _re

    problems = []
    if efa_interfaces > 0 and not _re.search(r"NET/OFI Selected Provider is efa", log_text, _re.IGNORECASE):
        problems.append(
            "NCCL did not select the EFA provider (no 'NET/OFI Selected Provider is efa' in the log): "
            "the image lacks libfabric/aws-ofi-nccl, or the pod got no EFA devices"
        )
    if _re.search(r"Using network Socket", log_text):
        problems.append("NCCL fell back to its Socket transport (TCP), not EFA")
    found = _re.findall(r"GPU_SERVING_BUSBW_GBPS=([0-9.]+)", log_text)
    if not found:
        problems.append("no bus bandwidth in the log: the all-reduce did not complete")
    else:
        busbw = min(float(x) for x in found)
        if busbw < floor_gbps:
            problems.append(f"all-reduce bus bandwidth {busbw:.1f} GB/s is below the floor of {floor_gbps:g} GB/s")
    return problems


def check_benchmark_result(result: dict, ttft_p99_ms: float, tpot_p99_ms: float, expected_requests: int) -> list[str]:
    """Why a `vllm bench serve --save-result` result misses its thresholds (empty: it passed).

    Field names as vllm/benchmarks/serve.py writes them: `completed`, and for
    `--percentile-metrics ttft,tpot --metric-percentiles 99` the keys
    `p99_ttft_ms` and `p99_tpot_ms` (`f"p{p}_{metric}_ms"`). Thresholds are
    strict: a p99 equal to its threshold fails.
    """
    problems = []
    completed = result.get("completed")
    if not isinstance(completed, (int, float)):
        problems.append("the result has no 'completed' count")
    elif completed < expected_requests:
        problems.append(f"{expected_requests - int(completed)} of {expected_requests} requests failed")
    for key, limit, label in (("p99_ttft_ms", ttft_p99_ms, "TTFT"), ("p99_tpot_ms", tpot_p99_ms, "TPOT")):
        value = result.get(key)
        if not isinstance(value, (int, float)) or value != value:
            problems.append(f"the result has no {key} (run with --percentile-metrics ttft,tpot --metric-percentiles 99)")
        elif not value < limit:
            problems.append(f"p99 {label} {value:.1f} ms is not below {limit:g} ms")
    return problems


def _embedded(*functions) -> str:
    """Source of pure functions, to run them unchanged inside a Job's python."""
    return "from __future__ import annotations\n\n" + "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in functions)


# --- EFA check ----------------------------------------------------------------------------


def efa_check_name(spec: ServingSpec) -> str:
    return f"{spec.name}-efa-check"


def _efa_check_labels(spec: ServingSpec) -> dict[str, str]:
    return {**PART_OF, CHECK_LABEL: efa_check_name(spec)}


def efa_check_service(spec: ServingSpec) -> dict:
    """Headless Service giving the check's pods DNS names (`<job>-<index>.<service>`) for the rendezvous."""
    name = efa_check_name(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": dict(PART_OF)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {CHECK_LABEL: name},
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }


def allreduce_script() -> str:
    """The all-reduce benchmark torchrun runs on every GPU (torch.distributed over NCCL)."""
    return _embedded(allreduce_bus_bandwidth_gbps) + textwrap.dedent(
        f"""

        import os, time
        import torch
        import torch.distributed as dist

        SIZE_BYTES, WARMUP, ITERS = {ALLREDUCE_BYTES}, {ALLREDUCE_WARMUP}, {ALLREDUCE_ITERS}


        def main():
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            world = dist.get_world_size()
            x = torch.zeros(SIZE_BYTES // 4, dtype=torch.float32, device="cuda")
            for _ in range(WARMUP):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(ITERS):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            per_op = torch.tensor([(time.perf_counter() - start) / ITERS], dtype=torch.float64, device="cuda")
            dist.all_reduce(per_op, op=dist.ReduceOp.MAX)  # the slowest rank decides
            busbw = allreduce_bus_bandwidth_gbps(SIZE_BYTES, per_op.item(), world)
            if local_rank == 0:
                print(f"{BUSBW_MARKER}{{busbw:.3f}}", flush=True)
            dist.destroy_process_group()


        main()
        """
    )


def efa_verdict_script(spec: ServingSpec) -> str:
    return _embedded(efa_check_problems) + textwrap.dedent(
        f"""

        import sys

        problems = efa_check_problems(open(sys.argv[1]).read(), {float(spec.nccl_busbw_floor_gbps)!r}, {spec.efa_interfaces})
        for p in problems:
            print("EFA CHECK FAILED:", p, file=sys.stderr)
        if not problems:
            print("EFA check passed")
        sys.exit(1 if problems else 0)
        """
    )


def efa_check_script(spec: ServingSpec) -> str:
    name = efa_check_name(spec)
    master = f"{name}-0.{name}.{spec.namespace}.svc.cluster.local"
    return "\n".join(
        [
            "set -uo pipefail",
            'echo "max locked memory: `ulimit -l` (EFA wants unlimited)"',
            f"FI_INFO=`command -v fi_info || echo {FI_INFO_FALLBACK}`",
            'echo "== $FI_INFO -p efa"',
            'if ! "$FI_INFO" -p efa; then',
            '  echo "EFA CHECK FAILED: fi_info -p efa lists no EFA device (no libfabric in the image, or no EFA devices in the pod)" >&2',
            "  exit 1",
            "fi",
            "cat > /tmp/allreduce.py <<'PY'",
            allreduce_script().rstrip("\n"),
            "PY",
            "cat > /tmp/verdict.py <<'PY'",
            efa_verdict_script(spec).rstrip("\n"),
            "PY",
            f"torchrun --nnodes {EFA_CHECK_NODES} --nproc-per-node {spec.gpus_per_node} "
            f'--node-rank "$JOB_COMPLETION_INDEX" --master-addr {master} --master-port {RDZV_PORT} '
            "/tmp/allreduce.py 2>&1 | tee /tmp/allreduce.log",
            "rc=${PIPESTATUS[0]}",
            'if [ "$rc" -ne 0 ]; then echo "EFA CHECK FAILED: the all-reduce exited with $rc" >&2; exit "$rc"; fi',
            "exec python3 /tmp/verdict.py /tmp/allreduce.log",
        ]
    ) + "\n"


def efa_check_job(spec: ServingSpec) -> dict:
    """Indexed Job: one pod on each of two GPU nodes, each owning the whole node like a serving pod.

    It needs two free GPU nodes: the serving pods hold every GPU, so it runs at
    first bring-up (the RayCluster waits for it) or in a maintenance window.
    It uses the serving image (its torch, NCCL and aws-ofi-nccl are what vLLM
    uses) and torchrun's own rendezvous, so no MPI operator is needed (AWS's EKS
    EFA guide runs nccl-tests through the MPI operator instead).
    """
    name = efa_check_name(spec)
    container = {
        "name": "efa-check",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/bin/bash", "-c", efa_check_script(spec)],
        "env": nccl_env(spec),
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
        "resources": gpu_pod_resources(spec),
        "volumeMounts": [shm_mount()],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": dict(PART_OF)},
        "spec": {
            "completionMode": "Indexed",
            "completions": EFA_CHECK_NODES,
            "parallelism": EFA_CHECK_NODES,
            "backoffLimit": 0,
            "activeDeadlineSeconds": EFA_CHECK_DEADLINE_S,
            "template": {
                "metadata": {"labels": _efa_check_labels(spec)},
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": name,
                    "enableServiceLinks": False,
                    "nodeSelector": node_selector(spec),
                    "tolerations": tolerations(),
                    "containers": [container],
                    "volumes": [shm_volume(spec)],
                },
            },
        },
    }


# --- Benchmark -------------------------------------------------------------------------------


def benchmark_name(spec: ServingSpec) -> str:
    return f"{spec.name}-benchmark"


def benchmark_argv(spec: ServingSpec) -> list[str]:
    """`vllm bench serve` against the Service (flags of vllm/benchmarks/serve.py and datasets.py)."""
    return [
        "vllm", "bench", "serve",
        "--backend", "openai",
        "--base-url", f"http://{spec.service_name}.{spec.namespace}.svc.cluster.local:{API_PORT}",
        "--endpoint", "/v1/completions",
        "--model", spec.model_dir,
        "--served-model-name", spec.served_model_name,
        "--tokenizer", spec.model_dir,
        "--dataset-name", "random",
        "--random-input-len", str(spec.benchmark_input_len),
        "--random-output-len", str(spec.benchmark_output_len),
        "--num-prompts", str(spec.benchmark_prompts),
        "--max-concurrency", str(spec.benchmark_concurrency),
        "--ignore-eos",
        "--percentile-metrics", "ttft,tpot",
        "--metric-percentiles", "99",
        "--save-result",
        "--result-dir", BENCHMARK_RESULT_DIR,
        "--result-filename", BENCHMARK_RESULT_FILE,
    ]  # fmt: skip


def benchmark_verdict_script(spec: ServingSpec) -> str:
    return _embedded(check_benchmark_result) + textwrap.dedent(
        f"""

        import json, sys

        result = json.load(open(sys.argv[1]))
        problems = check_benchmark_result(result, {float(spec.ttft_p99_ms)!r}, {float(spec.tpot_p99_ms)!r}, {spec.benchmark_prompts})
        print(f"p99 TTFT {{result.get('p99_ttft_ms')}} ms (< {spec.ttft_p99_ms:g}), p99 TPOT {{result.get('p99_tpot_ms')}} ms (< {spec.tpot_p99_ms:g})")
        for p in problems:
            print("BENCHMARK FAILED:", p, file=sys.stderr)
        sys.exit(1 if problems else 0)
        """
    )


def _health_wait_script(url: str, timeout_s: int) -> str:
    return textwrap.dedent(
        f"""\
        import sys, time, urllib.request
        deadline = time.monotonic() + {int(timeout_s)}
        while True:
            try:
                with urllib.request.urlopen({url!r}, timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception as exc:
                print("waiting for the endpoint:", exc, flush=True)
            if time.monotonic() >= deadline:
                sys.exit("the endpoint did not become healthy")
            time.sleep(10)
        """
    )


def benchmark_script(spec: ServingSpec) -> str:
    health = f"http://{spec.service_name}.{spec.namespace}.svc.cluster.local:{API_PORT}{PROBE_PATH}"
    return "\n".join(
        [
            "set -euo pipefail",
            "python3 - <<'PY'",
            _health_wait_script(health, ready_timeout_s(spec)).rstrip("\n"),
            "PY",
            shlex.join(benchmark_argv(spec)),
            "cat > /tmp/verdict.py <<'PY'",
            benchmark_verdict_script(spec).rstrip("\n"),
            "PY",
            f"exec python3 /tmp/verdict.py {BENCHMARK_RESULT_DIR}/{BENCHMARK_RESULT_FILE}",
        ]
    ) + "\n"


def benchmark_job(spec: ServingSpec) -> dict:
    """`vllm bench serve` against the Service; the Job fails when p99 TTFT or TPOT miss their thresholds.

    CPU only, but placed on a GPU node (toleration + node selector): the
    tokenizer comes from the weights claim, and the weights' file system is
    reachable from the GPU subnet. The pod template carries a hash of the
    RayCluster, so any change to what is served replaces the Job and re-runs it.
    """
    container = {
        "name": "benchmark",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/bin/bash", "-c", benchmark_script(spec)],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "resources": {k: dict(v) for k, v in BENCHMARK_RESOURCES.items()},
        "volumeMounts": [weights_mount(spec)],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": benchmark_name(spec), "namespace": spec.namespace, "labels": dict(PART_OF)},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": ready_timeout_s(spec) + BENCHMARK_RUN_ALLOWANCE_S,
            "template": {
                "metadata": {"labels": dict(PART_OF), "annotations": {SPEC_HASH_ANNOTATION: spec_hash(spec)}},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "nodeSelector": node_selector(spec),
                    "tolerations": tolerations(),
                    "containers": [container],
                    "volumes": [weights_volume(spec)],
                },
            },
        },
    }
