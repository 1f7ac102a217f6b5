"""The serving RayCluster: one pod per GPU node, the head running vLLM.

`raycluster(spec)` builds a `ray.io/v1` RayCluster. The head is a full GPU node
and vLLM rank 0; one worker group `gpu` with nodes - 1 replicas (min = max, no
autoscaling). One pod per node: every pod requests all of the node's GPUs and
EFA interfaces, CPU and memory (requests = limits) from the plan, a
memory-backed `/dev/shm` of the plan's size, the weights claim read-only, the
GPU taint's toleration and the GPU node group's labels. An init container
waits for the weight-staging Job's completion marker
(`infra/k8s/scripts/wait_for_weights.sh`). `scripts_config_map(spec)` is the
ConfigMap of the serving layer's pod scripts, mounted read-only where they run.

The head's command (KubeRay 1.7.0)
----------------------------------
KubeRay runs its generated `ray start ... --block` as the Ray container's
command; anything placed after a blocking `ray start` never runs. With the pod
annotation `ray.io/overwrite-container-cmd: "true"` KubeRay leaves our command
alone and still puts the generated command in `KUBERAY_GEN_RAY_START_CMD`
(ray-operator/controllers/ray/utils/constant.go, RayOverwriteContainerCmdAnnotationKey;
common/pod.go, BuildPod and setContainerEnvVars). `setMissingRayStartParams`
always sets `block: "true"`, which `convertParamMap` renders as ` --block `. So
the head (`infra/k8s/scripts/ray_head.sh`) runs the generated command with
`--block` removed: `ray start` then returns as soon as the head's GCS, raylet
and dashboard are up (they keep running as daemons), which keeps KubeRay's
parameters (`--head`, ports, `--num-gpus`, `--memory`, the metrics port)
without copying them. It then waits until Ray reports every GPU of the plan
(nodes x GPUs per node) on as many nodes (`ray_wait.py`), and `exec`s its
arguments, `vllm serve <model path> --served-model-name <checkpoint> <plan's
vllm_args>`, so vLLM is the container's main process: when the engine dies the
container exits and the kubelet restarts it. Before Ray starts it checks the
locked-memory limit (below). Workers carry the same annotation and run
`ray_worker.sh`, which makes the same check and `exec`s KubeRay's generated,
blocking `ray start` unchanged.

Probes (head)
-------------
- startupProbe `GET /health` on 8000 every 10 s; failureThreshold x period =
  the plan's start-up budget (`Deployment.startup`, infra/planning/startup.py):
  600 s for Ray to see every GPU node (the head's wait gives up at that point
  with a clear message) + 1.5 x the estimated cold start (every node reads the
  whole checkpoint at its share of the planned storage throughput, plus engine
  init: a 50% margin, because the estimate assumes the file system delivers its
  planned throughput); the engine's share is also `VLLM_ENGINE_READY_TIMEOUT_S`.
  Kubernetes runs neither liveness nor readiness probes until the startup probe
  has succeeded, so a loading server is never killed by them (Kubernetes docs,
  "Configure Liveness, Readiness and Startup Probes").
- readinessProbe `GET /health` every 5 s, 3 failures: the Service sends traffic
  only to a head whose engine answers.
- livenessProbe `GET /health` every 10 s, timeout 10 s, 6 failures (1 minute of
  a hung engine), only after startup.
Workers keep KubeRay's injected probes (raylet health on the dashboard agent
port; chosen by `rayVersion`, so `spec.rayVersion` must be the image's Ray).

Compile cache
-------------
What vLLM compiles at start (torch.compile/Inductor artefacts and their Triton
kernels, DeepGEMM and FlashInfer JIT kernels, the CUDA driver's PTX JIT) is kept
in an emptyDir on the node's disk (the instance store's RAID0 where the type
has one, infra/aws/gpu_nodes.py), mounted at `/var/cache/gpu-serving`, so a
restarted container finds it and skips compilation; a new pod compiles once.
Not a hostPath that would outlive the pod: Pod Security `baseline` forbids
host paths, and a writable host directory that outlives pods is a way to
leave code for the next one (the compile output is code vLLM loads). vLLM 0.34
keys its entries by a hash of the environment, configuration, code and
compiler, with a directory per global rank (`compilation/backends.py`,
`compilation/decorators.py`), so a changed deployment never reuses a stale
entry. Node-local rather than the shared weights file system: the compilers
lock files while they write, and FlashInfer's locks are known to misbehave on
NFS (`flashinfer/jit/core.py`, "This should help Lock on NFS"); the serving
pods keep the weights read-only; the local disk is faster for many small
files; and a pod's cache never depends on the file system's throughput being
free. The cost: a recreated pod (a rollout, a node replacement, KubeRay
recreating the cluster) compiles once more (startup.py COMPILE_S). Variables:
- `VLLM_CACHE_ROOT` (`envs.py`; torch.compile cache, and DeepGEMM's by default),
- `TRITON_CACHE_DIR` (vLLM sets it only on its non-AOT path,
  `compilation/compiler_interface.py`; the AOT path, 0.34's default with
  torch >= 2.10, leaves it at `~/.triton`, lost with the container),
- `DG_JIT_CACHE_DIR` (DeepGEMM, `utils/deep_gemm.py`; given explicitly),
- `FLASHINFER_WORKSPACE_BASE` (FlashInfer's `jit/env.py`: `<base>/.cache/flashinfer`),
- `CUDA_CACHE_PATH` (the driver's JIT cache, default `~/.nv/ComputeCache`).
CUDA graphs are captured at every start; vLLM never writes them to disk. The
emptyDir's size limit is 20 GiB, the share of the node's root volume planned
for caches: past it the kubelet evicts the pod rather than fill the disk.

EFA memory registration
-----------------------
libfabric's EFA provider pins host memory; the kernel refuses pins beyond
RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK (`ib_umem_get`).
Kubernetes has no ulimit field, so the nodes raise it: on EFA instance types
the launch template's nodeadm NodeConfig sets RLIMIT_MEMLOCK in containerd's
base runtime spec beyond the node's memory (infra/aws/gpu_nodes.py
`node_config`; Bottlerocket does it by itself when EFA is attached), and every
container starts with it: the Ray containers and the EFA check run as a
non-root user with no capability. They start by checking it
(`memlock_check.py`: the limit covers the node's memory, or CAP_IPC_LOCK is
effective; otherwise the container stops with the fix).

Ray's ports and authentication
------------------------------
Ray's token authentication is on: the RayCluster's `authOptions.mode: token`
makes KubeRay 1.7.0 create a Secret named after the cluster with a random
32-byte token (raycluster_controller.go, `reconcileAuthSecret`; owned by the
RayCluster, so it goes with it) and set `RAY_AUTH_MODE=token` and
`RAY_AUTH_TOKEN` (from that Secret) in the Ray container of every pod and in
its `wait-gcs-ready` init container (common/pod.go, `configureTokenAuth`); it
needs Ray 2.52 or later (utils/validation.go). Ray 2.60.0 then checks the
token on the GCS and raylet gRPC servers (the C++ AuthenticationTokenLoader
reads `RAY_AUTH_TOKEN` first, `src/ray/rpc/authentication/`), the Ray client
server on 10001 and the dashboard agents' gRPC (`ray/_private/grpc_utils.py`,
`create_grpc_server_with_interceptors`; `ray/dashboard/agent.py`), and the
dashboard's and agents' HTTP APIs, job submission included
(`ray/_private/authentication/http_token_authentication.py`), except their
health endpoints (`/api/healthz`, `/api/local_raylet_healthz`,
`ray/dashboard/http_server_agent.py` and `http_server_head.py`): the probes
KubeRay gives the workers (an HTTP GET of `/api/healthz` on the agent's port
52365 for Ray >= 2.53, common/pod.go `initLivenessAndReadinessProbe`) keep
working without a token. Processes started in the container (`ray_wait.py`,
vLLM's Ray executor) inherit the token from the environment.
KubeRay sets `dashboard-host: 0.0.0.0` on the head unless told otherwise
(common/pod.go, `setMissingRayStartParams`); here it is `127.0.0.1`, so the
dashboard and its job API answer inside the head pod only (`kubectl
port-forward` reaches a pod's loopback), unless `spec.dashboard_clients` names
who may reach it (then it listens on the pod's address and a NetworkPolicy
admits exactly those). A plain RayCluster needs neither from outside: KubeRay
calls a head's dashboard only for RayJob and RayService, and Ray's workers
reach the head through the GCS. Who may open which port at all is the
NetworkPolicies' business (infra/k8s/network_policies.py).

Pod security
------------
Every container drops all capabilities, adds none, never escalates privileges
and has a read-only root file system; the pods run as a non-root user
(`pod_security.NONROOT_UID`, named by `USER` for Python's getpass), use the
runtime's default seccomp profile and mount no service-account token: they
pass Pod Security `restricted` (infra/k8s/pod_security.py). What the
containers write goes to `/dev/shm`, the compile cache, and an emptyDir at
`/tmp` (Ray's session directory and logs, temporary files, and `HOME`, so the
caches and configs libraries keep under `~` stay writable). KubeRay copies the Ray
container's security context and mounts into the `wait-gcs-ready` init
container it adds to the workers (common/pod.go).

Environment (every Ray container)
---------------------------------
- `HOME=/tmp` (above); `RAY_USAGE_STATS_ENABLED=0`, `VLLM_NO_USAGE_STATS=1`
  and `DO_NOT_TRACK=1`: Ray and vLLM send no usage reports (the network
  policies would drop them anyway).
- `VLLM_HOST_IP` = the pod IP (vLLM's multi-node serving guide sets it per node;
  it is vLLM's internal address, not the API server's).
- `HF_HUB_OFFLINE=1`: the weights are local; nothing may reach the Hub.
- `VLLM_ENGINE_READY_TIMEOUT_S` and `VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`: from
  the plan's start-up calculation (`Deployment.startup`; what each bounds in
  vLLM 0.34: infra/planning/startup.py), so vLLM never gives up on a start the
  startup probe still allows, nor on a step that JIT-compiles a kernel.
- `NCCL_DEBUG=WARN` in production (`ServingSpec.production`); elsewhere
  `NCCL_DEBUG=INFO` with `NCCL_DEBUG_SUBSYS=INIT,NET`: NCCL logs its transport
  once per communicator, including aws-ofi-nccl's `NET/OFI Selected provider is
  efa, fabric is efa (found N nics)` and `via NET/Libfabric/...`, the proof that
  EFA carries the traffic (not Socket). The EFA check always logs at INFO: its
  verdict reads those lines.
- The compile cache's variables (above).
- `FI_EFA_USE_HUGE_PAGE=0` on EFA instances: the pods request no `hugepages-2Mi`,
  so their hugetlb cgroup limit is 0; libfabric's huge-page bounce buffers then
  fail at allocation or fork. aws-ofi-nccl's EFA cheatsheet
  (doc/efa-env-var.md) prescribes exactly this setting for those memory errors
  ("minor performance hit").
- Deliberately not set: `FI_EFA_USE_DEVICE_RDMA`, `FI_PROVIDER=efa`,
  `NCCL_PROTO=simple` (the cheatsheet: needed only for aws-ofi-nccl < 1.7 /
  libfabric < 1.18, i.e. never with a current image), `RDMAV_FORK_SAFE` ("do not
  use"), `NCCL_SOCKET_IFNAME` (a pod has only `eth0` besides `lo`).
- `enableServiceLinks: false`: Kubernetes would otherwise inject `<SERVICE>_PORT`
  variables for every Service in the namespace, and vLLM reads `VLLM_*`
  variables (vLLM docs, "Environment Variables": do not name a service `vllm`).
  The API Service is `<name>-api` as well.

What the serving image must carry for EFA, and the check that catches its
absence: infra/k8s/checks.py.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from infra.catalog.instances import get_instance_type
from infra.k8s import pod_security, scheduling, script_files
from infra.planning.serving import ROOT_VOLUME_GIB
from infra.k8s.serving_spec import (
    API_KEY_DIR,
    API_KEY_FILE_ENV,
    API_KEY_SECRET_KEY,
    API_PORT,
    API_PORT_NAME,
    CLIENT_PORT,
    CLIENT_PORT_NAME,
    DASHBOARD_PORT,
    DASHBOARD_PORT_NAME,
    GCS_PORT,
    GCS_PORT_NAME,
    HEAD_CONTAINER,
    HEAD_SCRIPT,
    HEAD_SCRIPTS,
    METRICS_PATH,
    OVERWRITE_CMD_ANNOTATION,
    PART_OF,
    PROBE_PATH,
    RAY_CLUSTER_LABEL,
    RAY_METRICS_PORT,
    RAY_METRICS_PORT_NAME,
    RAY_NODE_TYPE_LABEL,
    SERVING_SCRIPTS,
    WAIT_SCRIPT,
    WORKER_CONTAINER,
    WORKER_GROUP,
    WORKER_SCRIPT,
    WORKER_SCRIPTS,
    GiB,
    MiB,
    ServingSpec,
    startup_failure_threshold,
)

READINESS = {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3, "successThreshold": 1}
LIVENESS = {"periodSeconds": 10, "timeoutSeconds": 10, "failureThreshold": 6, "successThreshold": 1}
WEIGHTS_POLL_S = 30  # how often the init container looks for the staging Job's marker
# Small containers (waits, the benchmark client). Requests = limits for CPU and
# memory in the GPU pods' init containers, so the pods stay in the Guaranteed class.
WAIT_CONTAINER_RESOURCES = {"cpu": "100m", "memory": "128Mi"}


# --- Small builders ------------------------------------------------------------------


def quantity(n_bytes: int) -> str:
    """A Kubernetes quantity for a byte count, in whole Gi or Mi when exact."""
    n = int(n_bytes)
    if n % GiB == 0:
        return f"{n // GiB}Gi"
    if n % MiB == 0:
        return f"{n // MiB}Mi"
    return str(n)


def tolerations() -> list[dict]:
    """Tolerations for the GPU nodes' taint (infra/k8s/scheduling.py)."""
    return scheduling.gpu_tolerations()


def node_selector(spec: ServingSpec) -> dict[str, str]:
    """The GPU node group (role) of the plan's instance type (infra/k8s/scheduling.py)."""
    return scheduling.gpu_node_selector(get_instance_type(spec.instance_type))


def gpu_pod_resources(spec: ServingSpec) -> dict:
    """All of a node's GPUs and EFA interfaces, CPU and memory from the plan; requests = limits.

    `nvidia.com/gpu` is what the GPU operator's device plugin advertises,
    `vpc.amazonaws.com/efa` what the EFA device plugin does (EKS user guide, "Run
    machine learning training on Amazon EKS with Elastic Fabric Adapter").
    """
    pod = spec.deployment.pod
    amounts = {
        "cpu": str(pod.cpu),
        "memory": quantity(pod.memory_bytes),
        "nvidia.com/gpu": str(pod.gpus),
    }
    if pod.efa_interfaces > 0:
        amounts["vpc.amazonaws.com/efa"] = str(pod.efa_interfaces)
    return {"requests": dict(amounts), "limits": dict(amounts)}


SHM_VOLUME = "dshm"
WEIGHTS_VOLUME = "weights"
COMPILE_CACHE_VOLUME = "compile-cache"
# The compile cache: an emptyDir on the node's disk (module doc, "Compile cache"), mounted at COMPILE_CACHE_DIR.
COMPILE_CACHE_DIR = "/var/cache/gpu-serving"
# Its bound: the node root volume's allowance for caches (infra/planning/serving.py,
# ROOT_VOLUME_GIB: "torch.compile, Triton and FlashInfer JIT caches ~20 GiB"); past it
# the kubelet evicts the pod rather than letting the node's disk fill.
COMPILE_CACHE_BUDGET_BYTES = 20 * GiB
assert COMPILE_CACHE_BUDGET_BYTES < ROOT_VOLUME_GIB * GiB
# The containers' root file systems are read-only; what Ray, vLLM and the compilers
# write outside the compile cache and /dev/shm goes to this emptyDir at /tmp (Ray's
# session directory, sockets and logs; temporary files; HOME, module doc). Its bound:
# most of the node root volume's allowance for logs (infra/planning/serving.py,
# ROOT_VOLUME_GIB: "the OS, logs and kubelet ~20 GiB"); past it the kubelet evicts the
# pod rather than letting the node's disk fill.
TMP_VOLUME = "tmp"
TMP_DIR = "/tmp"
TMP_VOLUME_LIMIT = "16Gi"
# The name getpass.getuser() gives the pods' non-root UID (quiet_env).
RUN_AS_USER_NAME = "serving"


def shm_volume(spec: ServingSpec) -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": quantity(spec.deployment.pod.shm_bytes)}}


def weights_volume(spec: ServingSpec) -> dict:
    return {"name": WEIGHTS_VOLUME, "persistentVolumeClaim": {"claimName": spec.pvc_name, "readOnly": True}}


def compile_cache_volume() -> dict:
    return {"name": COMPILE_CACHE_VOLUME, "emptyDir": {"sizeLimit": quantity(COMPILE_CACHE_BUDGET_BYTES)}}


def compile_cache_mount() -> dict:
    return {"name": COMPILE_CACHE_VOLUME, "mountPath": COMPILE_CACHE_DIR}


def compile_cache_env() -> list[dict]:
    """Where vLLM, Triton, DeepGEMM, FlashInfer and the CUDA driver keep what they compile (module doc).

    In vLLM 0.34.0: `VLLM_CACHE_ROOT` in vllm/envs.py; `TRITON_CACHE_DIR`, which
    vllm/compilation/compiler_interface.py (`initialize_inductor_cache`) keeps when
    the caller sets it; `DG_JIT_CACHE_DIR`, which vllm/utils/deep_gemm.py otherwise
    sets to `<VLLM_CACHE_ROOT>/deep_gemm` (the same directory as here).
    """
    return [
        {"name": "VLLM_CACHE_ROOT", "value": f"{COMPILE_CACHE_DIR}/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{COMPILE_CACHE_DIR}/triton"},
        {"name": "DG_JIT_CACHE_DIR", "value": f"{COMPILE_CACHE_DIR}/vllm/deep_gemm"},
        {"name": "FLASHINFER_WORKSPACE_BASE", "value": COMPILE_CACHE_DIR},
        {"name": "CUDA_CACHE_PATH", "value": f"{COMPILE_CACHE_DIR}/nv-compute"},
    ]


def _script_init_container(spec: ServingSpec, name: str, script: str, args: list[str], mount: dict) -> dict:
    """A small init container of a serving pod that runs one POSIX sh script of the ConfigMap with `mount`."""
    return {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["sh", script_files.path(script)],
        "args": args,
        "resources": {"requests": dict(WAIT_CONTAINER_RESOURCES), "limits": dict(WAIT_CONTAINER_RESOURCES)},
        "securityContext": pod_security.container_security_context(),
        "volumeMounts": [mount, script_files.volume_mount()],
    }


def ray_security_context() -> dict:
    """Every capability dropped, no escalation, a read-only root; the pod's non-root user (module doc, "Pod security")."""
    return {"securityContext": pod_security.container_security_context()}


def tmp_volume() -> dict:
    return {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": TMP_VOLUME_LIMIT}}


def tmp_mount() -> dict:
    return {"name": TMP_VOLUME, "mountPath": TMP_DIR}


def memlock_required(spec: ServingSpec) -> str:
    """memlock_check.py's verdict counts on EFA nodes only: "1" or "0"."""
    return "1" if spec.efa_interfaces > 0 else "0"


def shm_mount() -> dict:
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def weights_mount(spec: ServingSpec) -> dict:
    return {"name": WEIGHTS_VOLUME, "mountPath": spec.mount_path, "readOnly": True}


def nccl_env(spec: ServingSpec, info: bool = False) -> list[dict]:
    """NCCL's settings: INFO on the transport outside production or when asked (the EFA check reads it), else WARN.

    `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS`: NCCL's user guide, "Environment Variables";
    `FI_EFA_USE_HUGE_PAGE`: aws-ofi-nccl's doc/efa-env-var.md (module doc).
    """
    if info or not spec.production:
        env = [
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET"},
        ]
    else:
        env = [{"name": "NCCL_DEBUG", "value": "WARN"}]
    if spec.efa_interfaces > 0:
        env.append({"name": "FI_EFA_USE_HUGE_PAGE", "value": "0"})
    return env


def vllm_timeouts_env(spec: ServingSpec) -> list[dict]:
    """vLLM's start-up and per-step timeouts, from the plan's start-up calculation.

    Both read by vLLM 0.34.0's vllm/envs.py (defaults 600 s and 300 s).
    """
    startup = spec.deployment.startup
    return [
        {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(startup.engine_ready_timeout_s)},
        {"name": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "value": str(startup.execute_model_timeout_s)},
    ]


def quiet_env() -> list[dict]:
    """A writable HOME on the read-only root file system, a user name, and no usage reports (nothing may leave the cluster).

    `USER`: the pods run as a UID with no passwd entry in the image, and Python's
    `getpass.getuser()` reads LOGNAME, USER, LNAME and USERNAME before it looks the UID up
    (and fails: Python docs, getpass); torch Inductor names its cache directory with it
    (torch/_inductor/runtime/cache_dir_utils.py) and vLLM 0.34.0 its temporary directory
    (vllm/config/vllm.py). `RAY_USAGE_STATS_ENABLED`: Ray's python/ray/_private/usage/usage_lib.py (vLLM 0.34.0's
    Ray executor sets it to 0 itself when unset, vllm/v1/executor/ray_utils.py; this covers
    `ray start` as well); `VLLM_NO_USAGE_STATS` and `DO_NOT_TRACK` (read as
    `VLLM_DO_NOT_TRACK`'s fallback): vLLM 0.34.0 vllm/envs.py.
    """
    return [
        {"name": "HOME", "value": TMP_DIR},
        {"name": "USER", "value": RUN_AS_USER_NAME},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]


def ray_env(spec: ServingSpec) -> list[dict]:
    """The Ray containers' environment (see the module doc for each variable).

    `VLLM_HOST_IP`: vLLM 0.34.0 vllm/envs.py; `HF_HUB_OFFLINE`: huggingface_hub's
    constants.py, which vLLM reads for `local_files_only` (vllm/transformers_utils/config.py).
    """
    return [
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        *quiet_env(),
        *vllm_timeouts_env(spec),
        *compile_cache_env(),
        *nccl_env(spec),
    ]


API_KEY_VOLUME = "api-key"


def api_key_volume(spec: ServingSpec) -> dict:
    """The API key's Secret as a volume: one read-only file (must exist: the pod does not start without it)."""
    return {
        "name": API_KEY_VOLUME,
        "secret": {
            "secretName": spec.api_key_secret_name,
            "items": [{"key": API_KEY_SECRET_KEY, "path": API_KEY_SECRET_KEY}],
            "defaultMode": 0o444,
            "optional": False,
        },
    }


def api_key_mount() -> dict:
    return {"name": API_KEY_VOLUME, "mountPath": API_KEY_DIR, "readOnly": True}


def api_key_file_env() -> dict:
    """Where the key's file is; the program that needs the key reads it (ray_head.sh into VLLM_API_KEY)."""
    return {"name": API_KEY_FILE_ENV, "value": f"{API_KEY_DIR}/{API_KEY_SECRET_KEY}"}


def scripts_config_map(spec: ServingSpec) -> dict:
    """The ConfigMap of every serving and check script, in the serving namespace."""
    return script_files.config_map(spec.scripts_config_map_name, spec.namespace, SERVING_SCRIPTS, PART_OF)


def scripts_volume(spec: ServingSpec) -> dict:
    return script_files.volume(spec.scripts_config_map_name)


def wait_for_weights_container(spec: ServingSpec) -> dict:
    """Init container: wait (without a time limit, 0) until the staging Job marked the weights complete."""
    args = [spec.marker, "0", str(WEIGHTS_POLL_S)]
    return _script_init_container(spec, "wait-for-weights", WAIT_SCRIPT, args, weights_mount(spec))


def _http_probe(port: Any, **settings: int) -> dict:
    return {"httpGet": {"path": PROBE_PATH, "port": port}, **settings}


def head_probes(spec: ServingSpec) -> dict:
    return {
        "startupProbe": _http_probe(
            API_PORT_NAME,
            periodSeconds=spec.deployment.startup.startup_probe_period_s,
            timeoutSeconds=5,
            failureThreshold=startup_failure_threshold(spec),
            successThreshold=1,
        ),
        "readinessProbe": _http_probe(API_PORT_NAME, **READINESS),
        "livenessProbe": _http_probe(API_PORT_NAME, **LIVENESS),
    }


def scrape_annotations(port: int) -> dict[str, str]:
    """The `prometheus.io/*` annotations: a convention of Prometheus's example Kubernetes scrape
    configuration (prometheus documentation/examples/prometheus-kubernetes.yml), not a built-in."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": METRICS_PATH}


# --- The head's command ------------------------------------------------------------


def head_command(spec: ServingSpec) -> list[str]:
    return ["/bin/bash", script_files.path(HEAD_SCRIPT)]


def head_args(spec: ServingSpec) -> list[str]:
    """What ray_head.sh waits for (every GPU of the plan on every node, how long), then what it runs."""
    return [
        str(spec.total_gpus),
        str(spec.nodes),
        str(spec.deployment.startup.ray_join_timeout_s),
        memlock_required(spec),
        *spec.serve_argv,
    ]


def worker_command(spec: ServingSpec) -> list[str]:
    return ["/bin/bash", script_files.path(WORKER_SCRIPT)]


def worker_args(spec: ServingSpec) -> list[str]:
    """ray_worker.sh's arguments: whether the locked-memory check must pass."""
    return [memlock_required(spec)]


# --- RayCluster ------------------------------------------------------------------------


def _ray_ports(head: bool) -> list[dict]:
    ports = [{"name": RAY_METRICS_PORT_NAME, "containerPort": RAY_METRICS_PORT, "protocol": "TCP"}]
    if head:
        ports = [
            {"name": GCS_PORT_NAME, "containerPort": GCS_PORT, "protocol": "TCP"},
            {"name": DASHBOARD_PORT_NAME, "containerPort": DASHBOARD_PORT, "protocol": "TCP"},
            {"name": CLIENT_PORT_NAME, "containerPort": CLIENT_PORT, "protocol": "TCP"},
            {"name": API_PORT_NAME, "containerPort": API_PORT, "protocol": "TCP"},
            *ports,
        ]
    return ports


def _pod_spec(spec: ServingSpec, container: dict) -> dict:
    return {
        "enableServiceLinks": False,
        **pod_security.hardened_pod(pod_security.NONROOT_UID),
        "nodeSelector": node_selector(spec),
        "tolerations": tolerations(),
        "initContainers": [wait_for_weights_container(spec)],
        "containers": [container],
        "volumes": [shm_volume(spec), weights_volume(spec), scripts_volume(spec), compile_cache_volume(), tmp_volume()],
    }


def pod_labels(spec: ServingSpec, node_type: str) -> dict[str, str]:
    """The template's labels: the stack's, and the two KubeRay sets on the pod anyway (and lets no template
    change, common/pod.go `labelPod`), so what selects the pods (network policies, the Service) reads the
    same in the template as on the pod."""
    return {**PART_OF, RAY_CLUSTER_LABEL: spec.name, RAY_NODE_TYPE_LABEL: node_type}


def _ray_mounts(spec: ServingSpec) -> list[dict]:
    return [shm_mount(), weights_mount(spec), script_files.volume_mount(), compile_cache_mount(), tmp_mount()]


def head_pod_template(spec: ServingSpec) -> dict:
    annotations = {OVERWRITE_CMD_ANNOTATION: "true", **script_files.hash_annotation(HEAD_SCRIPTS)}
    if spec.monitoring == "annotations":
        annotations.update(scrape_annotations(API_PORT))
    container = {
        "name": HEAD_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": head_command(spec),
        "args": head_args(spec),
        "env": [*ray_env(spec), api_key_file_env()],
        "ports": _ray_ports(head=True),
        "resources": gpu_pod_resources(spec),
        **ray_security_context(),
        "volumeMounts": [*_ray_mounts(spec), api_key_mount()],
        **head_probes(spec),
    }
    pod = _pod_spec(spec, container)
    pod["volumes"] = [*pod["volumes"], api_key_volume(spec)]  # the head serves the API; the workers never see the key
    return {
        "metadata": {"labels": pod_labels(spec, "head"), "annotations": annotations},
        "spec": pod,
    }


def worker_pod_template(spec: ServingSpec) -> dict:
    annotations = {OVERWRITE_CMD_ANNOTATION: "true", **script_files.hash_annotation(WORKER_SCRIPTS)}
    metadata: dict = {"labels": pod_labels(spec, "worker"), "annotations": annotations}
    if spec.monitoring == "annotations":
        metadata["annotations"].update(scrape_annotations(RAY_METRICS_PORT))
    container = {
        "name": WORKER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        # ray_worker.sh checks the locked-memory limit, then execs KubeRay's generated, blocking `ray start`.
        "command": worker_command(spec),
        "args": worker_args(spec),
        "env": ray_env(spec),
        "ports": _ray_ports(head=False),
        "resources": gpu_pod_resources(spec),
        **ray_security_context(),
        "volumeMounts": _ray_mounts(spec),
    }
    return {"metadata": metadata, "spec": _pod_spec(spec, container)}


def head_ray_start_params(spec: ServingSpec) -> dict[str, str]:
    """The plan's parameters, and where the dashboard listens (module doc, "Ray's ports and authentication")."""
    return {**spec.ray_start_params, "dashboard-host": spec.dashboard_host}


def raycluster_spec(spec: ServingSpec) -> dict:
    body: dict = {
        "rayVersion": spec.ray_version,
        "enableInTreeAutoscaling": False,
        # Ray's token authentication (module doc, "Ray's ports and authentication").
        "authOptions": {"mode": "token"},
        # A template change (new arguments, image, sizes) must reach the pods: KubeRay
        # deletes every pod and creates new ones (raycluster_types.go, RayClusterRecreate).
        # A TP x PP engine cannot roll pod by pod anyway.
        "upgradeStrategy": {"type": "Recreate"},
        "headGroupSpec": {
            "rayStartParams": head_ray_start_params(spec),
            "template": head_pod_template(spec),
        },
    }
    if spec.suspended:
        # KubeRay deletes every pod and keeps the RayCluster; without the field it creates them again
        # (ray-project/kuberay#1711; docs.ray.io, KubeRay Observability: state Suspended). With no serving
        # pod left, a GPU node roll has nothing for the PodDisruptionBudget to block. Absent, not false,
        # when serving: a running stack's RayCluster stays exactly as it was.
        body["suspend"] = True
    workers = spec.nodes - 1
    if workers > 0:
        body["workerGroupSpecs"] = [
            {
                "groupName": WORKER_GROUP,
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "numOfHosts": 1,
                "rayStartParams": dict(spec.ray_start_params),
                "template": worker_pod_template(spec),
            }
        ]
    return body


def raycluster_metadata(spec: ServingSpec) -> dict:
    return {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": dict(PART_OF),
        # `pulumi up` creates it and moves on (pulumi-kubernetes provider/pkg/await/awaiters.go,
        # SkipAwaitLogic): the pods wait for the weights (hours on a first `up`), then Ray and vLLM
        # start, and an `up` that waited held the way in (the SSM tunnel) that long.
        # `python -m infra rollout` follows it instead, to the head's readiness (vLLM's /health;
        # KubeRay 1.7.0 reports it as the HeadPodReady condition) and the endpoint's answer.
        # A custom resource's deletion is still awaited (provider/pkg/metadata/overrides.go,
        # allowsSkipAwaitWithDelete lists built-in kinds only): KubeRay's finalizers go first.
        "annotations": {"pulumi.com/skipAwait": "true"},
    }


def raycluster(spec: ServingSpec) -> dict:
    """The `ray.io/v1` RayCluster manifest."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": raycluster_metadata(spec),
        "spec": raycluster_spec(spec),
    }


def spec_hash(spec: ServingSpec) -> str:
    """A short hash of the RayCluster: changes whenever what is served changes."""
    doc = json.dumps(raycluster(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]
