"""The serving layer's Kubernetes objects, as plain manifests built from the plan.

Pure functions (no Pulumi, no cluster calls): `components/serving.py` hands
their dicts to pulumi-kubernetes, and the tests validate them against the
KubeRay 1.7.0 CRD and the Kubernetes OpenAPI schemas. Every figure comes from
the plan (`Plan.to_json_dict()`); the constants below are the serving layer's
own settings (ports, probe periods, margins), each with its reason.

What is built
-------------
- `raycluster(spec)`: a `ray.io/v1` RayCluster. The head is a full GPU node and
  vLLM rank 0; one worker group `gpu` with nodes - 1 replicas (min = max, no
  autoscaling). One pod per node: every pod requests all of the node's GPUs and
  EFA interfaces, CPU and memory (requests = limits) from the plan, a
  memory-backed `/dev/shm` of the plan's size, the weights claim read-only, the
  GPU taint's toleration and the GPU node group's labels. An init container
  waits for the weight-staging Job's completion marker.
- `service(spec)`: port 8000 on the head pod; ClusterIP, or an internal NLB.
- `pdb(spec)`: no voluntary disruption of any serving pod.
- `pod_monitor(spec)` or scrape annotations (`spec.monitoring`).
- `efa_check_service(spec)` + `efa_check_job(spec)`: `fi_info -p efa` and an
  NCCL all-reduce across two GPU nodes, failing below a bus-bandwidth floor.
- `benchmark_job(spec)`: `vllm bench serve` against the Service, failing when
  p99 TTFT or TPOT miss their thresholds (`check_benchmark_result`).

The head's command (KubeRay 1.7.0)
----------------------------------
KubeRay runs its generated `ray start ... --block` as the Ray container's
command; anything placed after a blocking `ray start` never runs. With the pod
annotation `ray.io/overwrite-container-cmd: "true"` KubeRay leaves our command
alone and still puts the generated command in `KUBERAY_GEN_RAY_START_CMD`
(ray-operator/controllers/ray/utils/constant.go, RayOverwriteContainerCmdAnnotationKey;
common/pod.go, BuildPod and setContainerEnvVars). `setMissingRayStartParams`
always sets `block: "true"`, which `convertParamMap` renders as ` --block `. So
the head runs the generated command with `--block` removed: `ray start` then
returns as soon as the head's GCS, raylet and dashboard are up (they keep
running as daemons), which keeps KubeRay's parameters (`--head`, ports,
`--num-gpus`, `--memory`, the metrics port) without copying them. It then waits
until Ray reports every GPU of the plan (nodes x GPUs per node) on as many
nodes, and `exec`s `vllm serve <model path> --served-model-name <checkpoint>
<plan's vllm_args>`, so vLLM is the container's main process: when the engine
dies the container exits and the kubelet restarts it. Workers keep KubeRay's
generated, blocking `ray start` (no annotation): a worker has nothing else to run.

Probes (head)
-------------
- startupProbe `GET /health` on 8000 every 10 s; failureThreshold x period =
  1.5 x the plan's estimated cold start (the weights read at the planned storage
  throughput plus engine init: a 50% margin, because the estimate assumes the
  file system delivers its planned throughput) + 600 s for Ray to see every GPU
  node (the head's wait gives up at that point with a clear message). Prod:
  1.5 x 600 s + 600 s = 1,500 s. Kubernetes runs neither liveness nor readiness
  probes until the startup probe has succeeded, so a loading server is never
  killed by them (Kubernetes docs, "Configure Liveness, Readiness and Startup Probes").
- readinessProbe `GET /health` every 5 s, 3 failures: the Service sends traffic
  only to a head whose engine answers.
- livenessProbe `GET /health` every 10 s, timeout 10 s, 6 failures (1 minute of
  a hung engine), only after startup.
Workers keep KubeRay's injected probes (raylet health on the dashboard agent
port; chosen by `rayVersion`, so `spec.rayVersion` must be the image's Ray).

Environment (every Ray container)
---------------------------------
- `VLLM_HOST_IP` = the pod IP (vLLM's multi-node serving guide sets it per node;
  it is vLLM's internal address, not the API server's).
- `HF_HUB_OFFLINE=1`: the weights are local; nothing may reach the Hub.
- `NCCL_DEBUG=INFO` with `NCCL_DEBUG_SUBSYS=INIT,NET`: NCCL logs its transport
  once per communicator, including aws-ofi-nccl's `NET/OFI Selected Provider is
  efa (found N nics)`, the proof that EFA carries the traffic (not Socket).
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

The serving image must carry the EFA userspace (libfabric >= 1.18) and the
aws-ofi-nccl plugin (>= 1.7) on its library path; without them NCCL silently
falls back to TCP sockets. The EFA check Job fails in exactly that case.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import shlex
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from infra.k8s import scheduling, staging
from infra.catalog.instances import get_instance_type
from infra.errors import UserError

GiB = 2**30
MiB = 2**20

# --- Ports ---------------------------------------------------------------------
API_PORT = 8000  # vLLM's default `--port` (vllm/entrypoints/openai/cli_args.py); the command leaves it at that
API_PORT_NAME = "http"
RAY_METRICS_PORT = 8080  # KubeRay DefaultMetricsPort: the `--metrics-export-port` it sets (utils/constant.go)
RAY_METRICS_PORT_NAME = "metrics"  # KubeRay's MetricsPortName; it adds the port itself when it is missing
GCS_PORT = 6379  # KubeRay DefaultRedisPort (the GCS)
DASHBOARD_PORT = 8265  # KubeRay DefaultDashboardPort
CLIENT_PORT = 10001  # KubeRay DefaultClientPort (Ray client)
RDZV_PORT = 29500  # torchrun's default master port (EFA check)

# --- KubeRay 1.7.0 names (ray-operator/controllers/ray/utils/constant.go) ------
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
OVERWRITE_CMD_ANNOTATION = "ray.io/overwrite-container-cmd"
GEN_RAY_START_CMD_ENV = "KUBERAY_GEN_RAY_START_CMD"
WORKER_GROUP = "gpu"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"

# --- The weights ----------------------------------------------------------------
MARKER_NAME = staging.MARKER_NAME  # written by the weight-staging Job (infra/k8s/staging.py)
WEIGHTS_POLL_S = 30

# --- Probes and waits ---------------------------------------------------------
PROBE_PATH = "/health"  # vLLM's OpenAI server: 200 once the engine is up, an error when it is dead
STARTUP_PERIOD_S = 10
COLD_START_MARGIN = 1.5  # on the plan's estimated cold start (see the module doc)
RAY_JOIN_TIMEOUT_S = 600  # the head waits this long for every GPU node to join Ray
READINESS = {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3, "successThreshold": 1}
LIVENESS = {"periodSeconds": 10, "timeoutSeconds": 10, "failureThreshold": 6, "successThreshold": 1}
# What Pulumi waits for the head to become Ready: the startup budget plus pulling
# the serving image onto fresh nodes. ASSUMPTION: 20 minutes covers a ~20 GiB
# image pulled from ECR in the same region.
IMAGE_PULL_ALLOWANCE_S = 1200
# Small containers (waits, the benchmark client). Requests = limits for CPU and
# memory in the GPU pods' init containers, so the pods stay in the Guaranteed class.
WAIT_CONTAINER_RESOURCES = {"cpu": "100m", "memory": "128Mi"}

# --- Labels -------------------------------------------------------------------
PART_OF = {"app.kubernetes.io/part-of": "gpu-serving"}
CHECK_LABEL = "gpu-serving/check"
SPEC_HASH_ANNOTATION = "gpu-serving/serving-spec-hash"

# --- EFA check ------------------------------------------------------------------
EFA_CHECK_NODES = 2
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

SERVICE_TYPES = ("cluster-ip", "internal-lb")
MONITORING_KINDS = ("podmonitor", "annotations")

# Internal NLB. This stack installs no AWS Load Balancer Controller, so the
# Service is handled by the cloud provider's legacy service controller on EKS,
# which reads `aws-load-balancer-type: nlb` and `aws-load-balancer-internal`.
# `aws-load-balancer-scheme: internal` is what the AWS Load Balancer Controller
# reads (its NLB guide; it also defaults to internal since v2.2): with both, the
# load balancer is internal whichever controller takes the Service. No
# `loadBalancerClass`, so either may.
INTERNAL_NLB_ANNOTATIONS = {
    "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
}

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 40  # leaves room for the suffixes below within 63 characters


@dataclass(frozen=True)
class ServingSpec:
    """Everything the serving objects need: the plan plus the stack's settings.

    `plan` is `Plan.to_json_dict()`. `image` is the pinned serving image (vLLM
    with Ray, and the EFA userspace); `ray_version` is the Ray inside it (KubeRay
    picks its probes by it). `pvc_name` is the weights claim
    (components/storage.py), mounted read-only at `mount_path`.
    """

    plan: Mapping[str, Any]
    namespace: str
    image: str
    ray_version: str
    pvc_name: str
    name: str = "vllm"
    mount_path: str = "/models"
    # Where the staging Job put the checkpoint and its marker (infra.staging.model_path /
    # marker_path, which know the S3 layout); defaults: <mount_path>/<checkpoint>[/<marker>].
    model_path: Optional[str] = None
    marker_path: Optional[str] = None
    service_type: str = "cluster-ip"  # "cluster-ip" | "internal-lb"
    monitoring: str = "annotations"  # "podmonitor" | "annotations"
    monitor_labels: Mapping[str, str] = field(default_factory=dict)  # labels a Prometheus selects PodMonitors by
    efa_check: bool = False
    nccl_busbw_floor_gbps: float = 100.0  # GB/s (gigabytes per second, the unit nccl-tests prints busbw in)
    benchmark: bool = False
    ttft_p99_ms: float = 250.0
    tpot_p99_ms: float = 40.0
    benchmark_prompts: int = 200
    benchmark_input_len: int = 1024
    benchmark_output_len: int = 256
    benchmark_concurrency: int = 16
    image_pull_policy: str = "IfNotPresent"
    load_balancer_tags: Mapping[str, str] = field(default_factory=dict)  # the stack's tags, for an internal NLB

    def __post_init__(self) -> None:
        p = self.plan
        if not p.get("feasible"):
            raise UserError("the plan does not fit, so there is nothing to serve: " + "; ".join(p.get("errors") or ["infeasible"]))
        if not p["model"].get("checkpoint"):
            raise UserError(f"no published checkpoint of {p['model']['name']} is known: the serving layer needs weights to load")
        if not _DNS1035.match(self.name) or len(self.name) > MAX_NAME:
            raise UserError(f"serving name {self.name!r} must be a DNS-1035 label of at most {MAX_NAME} characters")
        if not _DNS1123.match(self.namespace) or len(self.namespace) > 63:
            raise UserError(f"namespace {self.namespace!r} must be a DNS-1123 label")
        if self.service_type not in SERVICE_TYPES:
            raise UserError(f"service type {self.service_type!r} is not one of {', '.join(SERVICE_TYPES)}")
        if self.monitoring not in MONITORING_KINDS:
            raise UserError(f"monitoring {self.monitoring!r} is not one of {', '.join(MONITORING_KINDS)}")
        if not self.mount_path.startswith("/"):
            raise UserError(f"mount path {self.mount_path!r} must be absolute")
        if p["pod"]["gpus"] != p["layout"]["gpus_per_node"]:
            raise UserError("the plan's pod does not take all of the node's GPUs; the serving layer runs one pod per node")
        for label, value in (
            ("nccl bus bandwidth floor", self.nccl_busbw_floor_gbps),
            ("TTFT p99 threshold", self.ttft_p99_ms),
            ("TPOT p99 threshold", self.tpot_p99_ms),
        ):
            if not value > 0:
                raise UserError(f"{label} must be positive, got {value}")
        for label, value in (
            ("benchmark prompts", self.benchmark_prompts),
            ("benchmark input length", self.benchmark_input_len),
            ("benchmark output length", self.benchmark_output_len),
            ("benchmark concurrency", self.benchmark_concurrency),
        ):
            if value < 1:
                raise UserError(f"{label} must be at least 1, got {value}")
        if self.efa_check:
            if self.nodes < EFA_CHECK_NODES:
                raise UserError(
                    f"the EFA check runs an all-reduce across {EFA_CHECK_NODES} GPU nodes; this stack has {self.nodes}"
                )
            if self.efa_interfaces < 1:
                raise UserError(f"the EFA check needs EFA; {p['instance']['type']} has no EFA interface")

    # --- Figures from the plan ----------------------------------------------------
    @property
    def nodes(self) -> int:
        return int(self.plan["layout"]["nodes"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.plan["pod"]["gpus"])

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def efa_interfaces(self) -> int:
        return int(self.plan["pod"]["efa_interfaces"])

    @property
    def instance_type(self) -> str:
        return str(self.plan["instance"]["type"])

    @property
    def served_model_name(self) -> str:
        return str(self.plan["model"]["checkpoint"])

    @property
    def model_dir(self) -> str:
        return self.model_path or f"{self.mount_path.rstrip('/')}/{self.served_model_name}"

    @property
    def marker(self) -> str:
        return self.marker_path or f"{self.model_dir}/{MARKER_NAME}"

    @property
    def vllm_args(self) -> list[str]:
        return [str(a) for a in self.plan["vllm_args"]]

    @property
    def ray_start_params(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.plan["ray_start_params"].items()}

    @property
    def service_name(self) -> str:
        return f"{self.name}-api"

    @property
    def endpoint(self) -> str:
        return f"http://{self.service_name}.{self.namespace}.svc.cluster.local:{API_PORT}/v1"


# --- Budgets -----------------------------------------------------------------------


def startup_budget_s(spec: ServingSpec) -> int:
    """Seconds the head may take from container start to a healthy engine."""
    cold = float(spec.plan["storage"]["estimated_cold_start_s"])
    return math.ceil(cold * COLD_START_MARGIN) + RAY_JOIN_TIMEOUT_S


def startup_failure_threshold(spec: ServingSpec) -> int:
    return math.ceil(startup_budget_s(spec) / STARTUP_PERIOD_S)


def ready_timeout_s(spec: ServingSpec) -> int:
    """How long Pulumi waits for the head to be Ready (image pull + startup budget)."""
    return startup_budget_s(spec) + IMAGE_PULL_ALLOWANCE_S


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
    """All of a node's GPUs and EFA interfaces, CPU and memory from the plan; requests = limits."""
    pod = spec.plan["pod"]
    amounts = {
        "cpu": str(int(pod["cpu"])),
        "memory": quantity(pod["memory_bytes"]),
        "nvidia.com/gpu": str(int(pod["gpus"])),
    }
    if int(pod["efa_interfaces"]) > 0:
        amounts["vpc.amazonaws.com/efa"] = str(int(pod["efa_interfaces"]))
    return {"requests": dict(amounts), "limits": dict(amounts)}


SHM_VOLUME = "dshm"
WEIGHTS_VOLUME = "weights"


def shm_volume(spec: ServingSpec) -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": quantity(spec.plan["pod"]["shm_bytes"])}}


def weights_volume(spec: ServingSpec) -> dict:
    return {"name": WEIGHTS_VOLUME, "persistentVolumeClaim": {"claimName": spec.pvc_name, "readOnly": True}}


def shm_mount() -> dict:
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def weights_mount(spec: ServingSpec) -> dict:
    return {"name": WEIGHTS_VOLUME, "mountPath": spec.mount_path, "readOnly": True}


def nccl_env(spec: ServingSpec) -> list[dict]:
    env = [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET"},
    ]
    if spec.efa_interfaces > 0:
        env.append({"name": "FI_EFA_USE_HUGE_PAGE", "value": "0"})
    return env


def ray_env(spec: ServingSpec) -> list[dict]:
    """The Ray containers' environment (see the module doc for each variable)."""
    return [
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        *nccl_env(spec),
    ]


def wait_for_weights_container(spec: ServingSpec) -> dict:
    """Init container: wait (without a time limit) until the staging Job marked the weights complete.

    The wait is infra/k8s/staging.py's, the same module that writes the marker.
    """
    return {
        "name": "wait-for-weights",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": staging.wait_for_weights_command(spec.marker, timeout_s=0, interval_s=WEIGHTS_POLL_S),
        "resources": {"requests": dict(WAIT_CONTAINER_RESOURCES), "limits": dict(WAIT_CONTAINER_RESOURCES)},
        "volumeMounts": [weights_mount(spec)],
    }


def _http_probe(port: Any, **settings: int) -> dict:
    return {"httpGet": {"path": PROBE_PATH, "port": port}, **settings}


def head_probes(spec: ServingSpec) -> dict:
    return {
        "startupProbe": _http_probe(
            API_PORT_NAME,
            periodSeconds=STARTUP_PERIOD_S,
            timeoutSeconds=5,
            failureThreshold=startup_failure_threshold(spec),
            successThreshold=1,
        ),
        "readinessProbe": _http_probe(API_PORT_NAME, **READINESS),
        "livenessProbe": _http_probe(API_PORT_NAME, **LIVENESS),
    }


def scrape_annotations(port: int) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


# --- The head's command ------------------------------------------------------------


def ray_wait_script(gpus: int, nodes: int, timeout_s: int) -> str:
    """Python that waits until Ray reports `gpus` GPUs on `nodes` live nodes, or exits 1 after `timeout_s`."""
    return textwrap.dedent(
        f"""\
        import os, sys, time
        import ray

        WANT_GPUS, WANT_NODES, TIMEOUT_S = {int(gpus)}, {int(nodes)}, {int(timeout_s)}
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
        deadline = time.monotonic() + TIMEOUT_S
        last = None
        while True:
            gpu_nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {{}}).get("GPU", 0) > 0]
            gpus = sum(n["Resources"]["GPU"] for n in gpu_nodes)
            seen = (int(gpus), len(gpu_nodes))
            if seen != last:
                print(f"Ray reports {{seen[0]}}/{{WANT_GPUS}} GPUs on {{seen[1]}}/{{WANT_NODES}} nodes", flush=True)
                last = seen
            if gpus >= WANT_GPUS and len(gpu_nodes) >= WANT_NODES:
                break
            if time.monotonic() >= deadline:
                print(f"gave up after {{TIMEOUT_S}} s: Ray reports {{seen[0]}}/{{WANT_GPUS}} GPUs on "
                      f"{{seen[1]}}/{{WANT_NODES}} nodes; check the worker pods", file=sys.stderr, flush=True)
                sys.exit(1)
            time.sleep(5)
        ray.shutdown()
        """
    )


def vllm_serve_argv(spec: ServingSpec) -> list[str]:
    """`vllm serve <model path> --served-model-name <checkpoint> <the plan's arguments>`."""
    return ["vllm", "serve", spec.model_dir, "--served-model-name", spec.served_model_name, *spec.vllm_args]


def head_script(spec: ServingSpec) -> str:
    """The head container's script (see the module doc)."""
    gen = GEN_RAY_START_CMD_ENV
    return "\n".join(
        [
            "set -euo pipefail",
            'ulimit -n "${RAY_START_ULIMIT_OPEN_FILES:-65536}" || echo "could not raise the open-file limit" >&2',
            f': "${{{gen}:?KubeRay did not set {gen}: is the {OVERWRITE_CMD_ANNOTATION} annotation on the head template?}}"',
            "# KubeRay's generated command always ends in --block; without it `ray start`",
            "# returns once the head's processes are up and the script goes on.",
            f'ray_start="${{{gen}//--block/}}"',
            'echo "starting Ray: ${ray_start}"',
            '/bin/bash -c "${ray_start}"',
            "python3 - <<'PY'",
            ray_wait_script(spec.total_gpus, spec.nodes, RAY_JOIN_TIMEOUT_S).rstrip("\n"),
            "PY",
            "exec " + shlex.join(vllm_serve_argv(spec)),
        ]
    ) + "\n"


def head_command(spec: ServingSpec) -> list[str]:
    return ["/bin/bash", "-c", head_script(spec)]


def serve_argv_from_script(script: str) -> list[str]:
    """The argv of the `exec vllm serve ...` line of a head script (for checks and tests)."""
    lines = [line for line in script.splitlines() if line.startswith("exec vllm serve ")]
    if len(lines) != 1:
        raise ValueError(f"expected one `exec vllm serve` line, found {len(lines)}")
    return shlex.split(lines[0])[1:]


# --- RayCluster ------------------------------------------------------------------------


def _ray_ports(head: bool) -> list[dict]:
    ports = [{"name": RAY_METRICS_PORT_NAME, "containerPort": RAY_METRICS_PORT, "protocol": "TCP"}]
    if head:
        ports = [
            {"name": "gcs-server", "containerPort": GCS_PORT, "protocol": "TCP"},
            {"name": "dashboard", "containerPort": DASHBOARD_PORT, "protocol": "TCP"},
            {"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"},
            {"name": API_PORT_NAME, "containerPort": API_PORT, "protocol": "TCP"},
            *ports,
        ]
    return ports


def _pod_spec(spec: ServingSpec, container: dict) -> dict:
    return {
        "enableServiceLinks": False,
        "nodeSelector": node_selector(spec),
        "tolerations": tolerations(),
        "initContainers": [wait_for_weights_container(spec)],
        "containers": [container],
        "volumes": [shm_volume(spec), weights_volume(spec)],
    }


def head_pod_template(spec: ServingSpec) -> dict:
    annotations = {OVERWRITE_CMD_ANNOTATION: "true"}
    if spec.monitoring == "annotations":
        annotations.update(scrape_annotations(API_PORT))
    container = {
        "name": HEAD_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": head_command(spec),
        "env": ray_env(spec),
        "ports": _ray_ports(head=True),
        "resources": gpu_pod_resources(spec),
        "volumeMounts": [shm_mount(), weights_mount(spec)],
        **head_probes(spec),
    }
    return {
        "metadata": {"labels": dict(PART_OF), "annotations": annotations},
        "spec": _pod_spec(spec, container),
    }


def worker_pod_template(spec: ServingSpec) -> dict:
    metadata: dict = {"labels": dict(PART_OF)}
    if spec.monitoring == "annotations":
        metadata["annotations"] = scrape_annotations(RAY_METRICS_PORT)
    container = {
        "name": WORKER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        # No command: KubeRay runs its generated, blocking `ray start`.
        "env": ray_env(spec),
        "ports": _ray_ports(head=False),
        "resources": gpu_pod_resources(spec),
        "volumeMounts": [shm_mount(), weights_mount(spec)],
    }
    return {"metadata": metadata, "spec": _pod_spec(spec, container)}


def head_ray_start_params(spec: ServingSpec) -> dict[str, str]:
    return {**spec.ray_start_params, "dashboard-host": "0.0.0.0"}


def raycluster_spec(spec: ServingSpec) -> dict:
    body: dict = {
        "rayVersion": spec.ray_version,
        "enableInTreeAutoscaling": False,
        # A template change (new arguments, image, sizes) must reach the pods: KubeRay
        # deletes every pod and creates new ones (raycluster_types.go, RayClusterRecreate).
        # A TP x PP engine cannot roll pod by pod anyway.
        "upgradeStrategy": {"type": "Recreate"},
        "headGroupSpec": {
            "rayStartParams": head_ray_start_params(spec),
            "template": head_pod_template(spec),
        },
    }
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
        # pulumi-kubernetes waits for this condition (KubeRay sets HeadPodReady from
        # the head pod's readiness, i.e. vLLM's /health): `pulumi up` ends when the
        # endpoint serves, or fails after the resource's custom timeout.
        "annotations": {"pulumi.com/waitFor": "condition=HeadPodReady"},
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


# --- Service, PDB, monitoring ----------------------------------------------------------


def head_selector(spec: ServingSpec) -> dict[str, str]:
    return {RAY_CLUSTER_LABEL: spec.name, RAY_NODE_TYPE_LABEL: "head"}


def service(spec: ServingSpec) -> dict:
    """Port 8000 of the head pod: ClusterIP, or an internal NLB (`internal-lb`)."""
    metadata: dict = {"name": spec.service_name, "namespace": spec.namespace, "labels": dict(PART_OF)}
    body: dict = {
        "selector": head_selector(spec),
        "ports": [{"name": API_PORT_NAME, "port": API_PORT, "targetPort": API_PORT_NAME, "protocol": "TCP"}],
    }
    if spec.service_type == "internal-lb":
        metadata["annotations"] = dict(INTERNAL_NLB_ANNOTATIONS)
        if spec.load_balancer_tags:
            # The load balancer is made by Kubernetes, not Pulumi: without the stack's
            # tags the leak sweeper could not recognise it, and the VPC would not go.
            metadata["annotations"]["service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags"] = ",".join(
                f"{k}={v}" for k, v in sorted(spec.load_balancer_tags.items())
            )
        body["type"] = "LoadBalancer"
    else:
        body["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": body}


def pdb(spec: ServingSpec) -> dict:
    """No voluntary disruption of any serving pod.

    The engine is one TP x PP group over every pod: losing any pod (head or
    worker) kills it, so an eviction (node drain, EKS node group update) must
    wait for an operator; `maxUnavailable: 0` blocks it whatever the pod count.
    Pods that are not Ready may still be evicted (`AlwaysAllow`): the engine is
    already down then, and a broken pod must not block a drain forever. KubeRay
    deletes pods directly (not through eviction), so its Recreate upgrade is
    not blocked.
    """
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": dict(PART_OF)},
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {RAY_CLUSTER_LABEL: spec.name}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def pod_monitor(spec: ServingSpec) -> dict:
    """A PodMonitor (Prometheus operator) for vLLM's /metrics on the head and Ray's on every pod."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {**PART_OF, **dict(spec.monitor_labels)}},
        "spec": {
            "selector": {"matchLabels": {RAY_CLUSTER_LABEL: spec.name}},
            "namespaceSelector": {"matchNames": [spec.namespace]},
            "podMetricsEndpoints": [
                {"port": API_PORT_NAME, "path": "/metrics", "interval": "30s"},  # vLLM (head only)
                {"port": RAY_METRICS_PORT_NAME, "path": "/metrics", "interval": "30s"},  # Ray (every pod)
            ],
        },
    }


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
    strict (p99 TTFT < 250 ms, as the seed states them).
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


def manifests(spec: ServingSpec) -> list[dict]:
    """Every object the serving layer creates for `spec`, in creation order."""
    out = []
    if spec.efa_check:
        out += [efa_check_service(spec), efa_check_job(spec)]
    out += [raycluster(spec), service(spec), pdb(spec)]
    if spec.monitoring == "podmonitor":
        out.append(pod_monitor(spec))
    if spec.benchmark:
        out.append(benchmark_job(spec))
    return out
