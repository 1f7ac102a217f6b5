"""Checks of a serving stack, run as Jobs: the EFA fabric and the serving benchmark.

- `efa_check_service(spec)` + `efa_check_job(spec)`: `fi_info -p efa` and an
  NCCL all-reduce across two GPU nodes, failing below a bus-bandwidth floor
  (`infra/k8s/scripts/efa_check.sh` and `efa_allreduce.py`).
- `benchmark_job(spec)`: `vllm bench serve` against the Service, failing when
  p99 TTFT or TPOT miss their thresholds (`infra/k8s/scripts/benchmark.py`).

Both Jobs run their scripts from the serving layer's ConfigMap
(`raycluster.scripts_config_map`), mounted read-only, with the figures as
arguments. Their containers drop every capability and add none (the EFA
check gets its locked-memory limit from the node, as the Ray containers do),
never escalate privileges, have read-only root file systems (they write to an
emptyDir at /tmp), run as a non-root user and mount no service-account token
(infra/k8s/pod_security.py).

The serving image must carry the EFA userspace (libfabric >= 1.18) and the
aws-ofi-nccl plugin (>= 1.7) on its library path; without them NCCL silently
falls back to TCP sockets. The EFA check Job fails in exactly that case.
"""

from __future__ import annotations

import json

from infra.k8s import pod_security, script_files
from infra.k8s.raycluster import (
    ray_security_context,
    gpu_pod_resources,
    nccl_env,
    node_selector,
    quiet_env,
    api_key_file_env,
    api_key_mount,
    api_key_volume,
    scripts_volume,
    shm_mount,
    shm_volume,
    spec_hash,
    tmp_mount,
    tmp_volume,
    tolerations,
    weights_mount,
    weights_volume,
)
from infra.k8s.serving_spec import (
    BENCHMARK_SCRIPT,
    BENCHMARK_SCRIPTS,
    CHECK_LABEL,
    EFA_CHECK_NODES,
    EFA_CHECK_SCRIPT,
    EFA_CHECK_SCRIPTS,
    PART_OF,
    PROBE_PATH,
    RDZV_PORT,
    SPEC_HASH_ANNOTATION,
    ServingSpec,
    ready_timeout_s,
)

EFA_CHECK_DEADLINE_S = 1800  # image pull, rendezvous and the run
EFA_CHECK_AWAIT = {"pulumi.com/skipAwait": "true", "pulumi.com/deletionPropagationPolicy": "background"}  # efa_check_job

BENCHMARK_RESULT_DIR = "/tmp/bench"
BENCHMARK_RESULT_FILE = "result.json"
# The container's termination message (Container.terminationMessagePath's default): the
# kubelet keeps what the script writes there in the pod's status after it exits, for
# `python -m infra benchmark-report`; no API token or RBAC needed to publish it.
BENCHMARK_SUMMARY_PATH = "/dev/termination-log"
BENCHMARK_RUN_ALLOWANCE_S = 1800
# `vllm bench serve` is one asyncio process (vllm/benchmarks/serve.py, asyncio.run(main_async)): a
# core of its own keeps the client from adding to the latencies it measures, and a limit of two
# leaves it unthrottled while bounding what it can take from the system nodes (an assumption).
BENCHMARK_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}


# --- EFA check ----------------------------------------------------------------------------


def efa_check_name(spec: ServingSpec) -> str:
    return f"{spec.name}-efa-check"


def efa_check_selector(spec: ServingSpec) -> dict[str, str]:
    """The label of the EFA check's pods: its Service and network policy select them by it."""
    return {CHECK_LABEL: efa_check_name(spec)}


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
            "selector": efa_check_selector(spec),
            "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }


def efa_check_args(spec: ServingSpec) -> list[str]:
    """efa_check.sh's arguments: the rendezvous (the Job's pod of index 0) and the verdict's figures.

    An Indexed Job's pod is named `<job>-<index>` as its hostname and gets its index in
    `JOB_COMPLETION_INDEX`; with `subdomain` set to a headless Service of that name it
    resolves as `<hostname>.<subdomain>.<namespace>.svc.cluster.local` (Kubernetes docs,
    "Jobs", completion mode Indexed; "DNS for Services and Pods").
    """
    name = efa_check_name(spec)
    master = f"{name}-0.{name}.{spec.namespace}.svc.cluster.local"
    return [
        str(EFA_CHECK_NODES),
        str(spec.gpus_per_node),
        master,
        str(RDZV_PORT),
        str(float(spec.nccl_busbw_floor_gbps)),
        str(spec.efa_interfaces),
    ]


def efa_check_job(spec: ServingSpec) -> dict:
    """Indexed Job: one pod on each of two GPU nodes, each owning the whole node like a serving pod.

    It needs two free GPU nodes: the serving pods hold every GPU, so it runs at
    first bring-up (while the weights are staged, before the serving pods exist)
    or in a maintenance window; Pulumi does not wait for it, and the RayCluster
    does not depend on it. It fails on a fallback to TCP (efa_allreduce.py).
    It uses the serving image (its torch, NCCL and aws-ofi-nccl are what vLLM
    uses) and torchrun's own rendezvous, so no MPI operator is needed (AWS's EKS
    EFA guide runs nccl-tests through the MPI operator instead).
    """
    name = efa_check_name(spec)
    container = {
        "name": "efa-check",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/bin/bash", script_files.path(EFA_CHECK_SCRIPT)],
        "args": efa_check_args(spec),
        # INFO whatever the stack: the verdict reads NCCL's transport lines.
        "env": [*quiet_env(), *nccl_env(spec, info=True)],
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}],
        "resources": gpu_pod_resources(spec),
        **ray_security_context(),
        "volumeMounts": [shm_mount(), script_files.volume_mount(), tmp_mount()],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        # Pulumi creates it and moves on (pulumi-kubernetes provider/pkg/await/awaiters.go,
        # SkipAwaitLogic): the check waits for free GPU nodes, and a RayCluster update must
        # never wait for it (components/serving.py). For a Job, skipAwait also skips the wait
        # for its deletion (provider/pkg/metadata/overrides.go, allowsSkipAwaitWithDelete),
        # and the provider deletes in the foreground unless told otherwise (DeletionPropagation):
        # the old Job would still exist, waiting for its pods, when its replacement of the same
        # name is created (delete_before_replace), and the create would fail with AlreadyExists.
        # In the background the API server removes the Job at once and collects its pods after.
        "metadata": {"name": name, "namespace": spec.namespace, "labels": dict(PART_OF), "annotations": dict(EFA_CHECK_AWAIT)},
        "spec": {
            "completionMode": "Indexed",
            "completions": EFA_CHECK_NODES,
            "parallelism": EFA_CHECK_NODES,
            "backoffLimit": 0,
            "activeDeadlineSeconds": EFA_CHECK_DEADLINE_S,
            "template": {
                "metadata": {"labels": {**PART_OF, **efa_check_selector(spec)}, "annotations": script_files.hash_annotation(EFA_CHECK_SCRIPTS)},
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": name,
                    "enableServiceLinks": False,
                    **pod_security.hardened_pod(pod_security.NONROOT_UID),
                    "nodeSelector": node_selector(spec),
                    "tolerations": tolerations(),
                    "containers": [container],
                    "volumes": [shm_volume(spec), scripts_volume(spec), tmp_volume()],
                },
            },
        },
    }


# --- Benchmark -------------------------------------------------------------------------------


def benchmark_name(spec: ServingSpec) -> str:
    return f"{spec.name}-benchmark"


def benchmark_selector(spec: ServingSpec) -> dict[str, str]:
    """The label of the benchmark's pods: the network policies select them by it."""
    return {CHECK_LABEL: benchmark_name(spec)}


def benchmark_argv(spec: ServingSpec) -> list[str]:
    """`vllm bench serve` against the Service (flags of vllm/benchmarks/serve.py and datasets/datasets.py
    add_random_dataset_args in 0.34.0: --random-range-ratio draws lengths uniformly within mean x (1 +- R),
    --random-prefix-len prepends tokens every prompt shares)."""
    return [
        "vllm", "bench", "serve",
        "--backend", "openai",
        "--base-url", spec.api_url,
        "--endpoint", "/v1/completions",
        "--model", spec.model_dir,
        "--served-model-name", spec.served_model_name,
        "--tokenizer", spec.model_dir,
        "--dataset-name", "random",
        "--random-input-len", str(spec.benchmark_input_len),
        "--random-output-len", str(spec.benchmark_output_len),
        "--random-range-ratio", str(spec.benchmark_range_ratio),
        "--random-prefix-len", str(spec.benchmark_prefix_len),
        "--num-prompts", str(spec.benchmark_prompts),
        "--max-concurrency", str(spec.benchmark_concurrency),
        "--ignore-eos",
        "--percentile-metrics", "ttft,tpot",
        "--metric-percentiles", "50,99",
        "--save-result",
        "--result-dir", BENCHMARK_RESULT_DIR,
        "--result-filename", BENCHMARK_RESULT_FILE,
    ]  # fmt: skip


def benchmark_args(spec: ServingSpec) -> list[str]:
    """benchmark.py's arguments: the endpoint to wait for, the thresholds, then the benchmark command."""
    return [
        "--health-url", f"{spec.api_url}{PROBE_PATH}",
        "--timeout-s", str(ready_timeout_s(spec)),
        "--result", f"{BENCHMARK_RESULT_DIR}/{BENCHMARK_RESULT_FILE}",
        "--ttft-p99-ms", str(float(spec.ttft_p99_ms)),
        "--tpot-p99-ms", str(float(spec.tpot_p99_ms)),
        "--requests", str(spec.benchmark_prompts),
        "--predicted", json.dumps(dict(spec.benchmark_predicted), sort_keys=True),
        "--summary", BENCHMARK_SUMMARY_PATH,
        "--",
        *benchmark_argv(spec),
    ]  # fmt: skip


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
        "command": ["python3", script_files.path(BENCHMARK_SCRIPT)],
        "args": benchmark_args(spec),
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            *quiet_env(),
            # benchmark.py reads the key's file into OPENAI_API_KEY, which `vllm bench serve` sends as the bearer token.
            api_key_file_env(),
        ],
        "resources": {k: dict(v) for k, v in BENCHMARK_RESOURCES.items()},
        "securityContext": pod_security.container_security_context(),
        "volumeMounts": [weights_mount(spec), script_files.volume_mount(), tmp_mount(), api_key_mount()],
        # The summary written there is the message; if the script dies first, the log's tail is.
        "terminationMessagePath": BENCHMARK_SUMMARY_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": benchmark_name(spec), "namespace": spec.namespace, "labels": dict(PART_OF)},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": ready_timeout_s(spec) + BENCHMARK_RUN_ALLOWANCE_S,
            "template": {
                "metadata": {
                    "labels": {**PART_OF, **benchmark_selector(spec)},
                    "annotations": {SPEC_HASH_ANNOTATION: spec_hash(spec), **script_files.hash_annotation(BENCHMARK_SCRIPTS)},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    **pod_security.hardened_pod(pod_security.NONROOT_UID),
                    "nodeSelector": node_selector(spec),
                    "tolerations": tolerations(),
                    "containers": [container],
                    "volumes": [weights_volume(spec), scripts_volume(spec), tmp_volume(), api_key_volume(spec)],
                },
            },
        },
    }
