"""The serving layer's settings: `ServingSpec`, its names and ports, and the start-up budgets.

The serving layer's Kubernetes objects are plain manifests built from the plan
by pure functions (no Pulumi, no cluster calls): `components/serving.py` hands
their dicts to pulumi-kubernetes, and the tests validate them against the
KubeRay 1.7.0 CRD and the Kubernetes OpenAPI schemas. Every figure comes from
the plan (`Plan.to_json_dict()`); the constants here and in the builders are
the serving layer's own settings (ports, probe periods, margins), each with its
reason.

What is built, and where
------------------------
- `infra/k8s/raycluster.py`: the `ray.io/v1` RayCluster (pods, environment,
  probes, the head's command) and the ConfigMap of the pod scripts;
- `infra/k8s/exposure.py`: the Service on port 8000, the PodDisruptionBudget,
  the PodMonitor;
- `infra/k8s/checks.py`: the EFA check (headless Service + Indexed Job) and the
  serving benchmark Job;
- `infra/k8s/network_policies.py`: the NetworkPolicies of the namespace and of
  each of those pods;
- `infra/k8s/pod_security.py`: every pod's security context and the
  namespace's Pod Security labels.

The programs those pods run are files in `infra/k8s/scripts/`, in one ConfigMap
(`<name>-scripts`) mounted read-only; each pod template carries the hash of the
scripts it runs (`infra/k8s/script_files.py`), so changing one replaces exactly
the pods that run it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional

from infra.catalog import vllm as vllm_release
from infra.errors import UserError
from infra.k8s.scripts import stage_weights
from infra.planning.contract import Deployment

GiB = 2**30
MiB = 2**20

# --- Ports ---------------------------------------------------------------------
# KubeRay's figures below: ray-operator/controllers/ray/utils/constant.go at KubeRay 1.7.0;
# what it does with them: ray-operator/controllers/ray/common/pod.go.
# vLLM's default `--port` (vLLM 0.34.0 vllm/entrypoints/common/cli_args.py, FrontendArgs.port);
# the command leaves it at that.
API_PORT = 8000
API_PORT_NAME = "http"
# KubeRay DefaultMetricsPort: the `--metrics-export-port` setMissingRayStartParams sets.
RAY_METRICS_PORT = 8080
# KubeRay MetricsPortName; DefaultHeadPodTemplate/DefaultWorkerPodTemplate add the port when it is missing.
RAY_METRICS_PORT_NAME = "metrics"
GCS_PORT = 6379  # KubeRay DefaultGcsServerPort (GetHeadPort's default: the GCS)
DASHBOARD_PORT = 8265  # KubeRay DefaultDashboardPort
CLIENT_PORT = 10001  # KubeRay DefaultClientPort (Ray client)
# The head container's port names: KubeRay GcsServerPortName, DashboardPortName, ClientPortName.
GCS_PORT_NAME = "gcs-server"
DASHBOARD_PORT_NAME = "dashboard"
CLIENT_PORT_NAME = "client"
RDZV_PORT = 29500  # torchrun's default `--master-port` (torch/distributed/run.py); the EFA check passes it explicitly
# KubeRay DefaultDashboardAgentListenPort, which setMissingRayStartParams passes as `--dashboard-agent-listen-port`:
# the workers' injected probes ask it (initLivenessAndReadinessProbe; the kubelet, from the node).
DASHBOARD_AGENT_PORT = 52365
DNS_PORT = 53

# Ray's token authentication (KubeRay `authOptions.mode: token`): KubeRay 1.7.0
# refuses it below this Ray release (ray-operator/controllers/ray/utils/validation.go).
RAY_TOKEN_AUTH_MIN_VERSION = (2, 52, 0)
# Where the head's dashboard and job API listen (`ray start --dashboard-host`, which
# KubeRay's setMissingRayStartParams sets to 0.0.0.0 only when it is absent): the pod's
# loopback only, unless clients are configured (`ServingSpec.dashboard_clients`).
DASHBOARD_LOOPBACK = "127.0.0.1"
DASHBOARD_ALL_ADDRESSES = "0.0.0.0"

# --- KubeRay 1.7.0 names (ray-operator/controllers/ray/utils/constant.go) ------
RAY_CLUSTER_LABEL = "ray.io/cluster"  # RayClusterLabelKey
RAY_NODE_TYPE_LABEL = "ray.io/node-type"  # RayNodeTypeLabelKey
# RayOverwriteContainerCmdAnnotationKey; BuildPod (common/pod.go) reads it from the pod template.
OVERWRITE_CMD_ANNOTATION = "ray.io/overwrite-container-cmd"
# The stack's own names. KubeRay takes the Ray container to be the first one
# (utils.RayContainerIndex = 0), whatever its name.
WORKER_GROUP = "gpu"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"

# --- Probes and waits ---------------------------------------------------------
# The figures (startup probe period and budget, the head's Ray wait, Pulumi's
# wait, vLLM's timeouts) come from the plan's one calculation,
# `Deployment.startup` (infra/planning/startup.py).
# vLLM's OpenAI server: 200 once the engine is up, 503 when it is dead (vLLM 0.34.0
# vllm/entrypoints/serve/instrumentator/health.py).
PROBE_PATH = "/health"
# vLLM's Prometheus endpoint on the API port (vllm/entrypoints/serve/instrumentator/metrics.py), and
# Ray's on its metrics export port.
METRICS_PATH = "/metrics"

# --- Labels -------------------------------------------------------------------
PART_OF = {"app.kubernetes.io/part-of": "gpu-serving"}
CHECK_LABEL = "gpu-serving/check"
SPEC_HASH_ANNOTATION = "gpu-serving/serving-spec-hash"

# The EFA check runs an all-reduce across this many GPU nodes (infra/k8s/checks.py).
EFA_CHECK_NODES = 2

# --- Pod scripts (infra/k8s/scripts/): the ones each pod runs (their hash is on its template) ---
WAIT_SCRIPT = "wait_for_weights.sh"  # every serving pod's init container
MEMLOCK_SCRIPT = "memlock_check.py"  # run first by every Ray container and the EFA check
HEAD_SCRIPT = "ray_head.sh"
WORKER_SCRIPT = "ray_worker.sh"
EFA_CHECK_SCRIPT = "efa_check.sh"
BENCHMARK_SCRIPT = "benchmark.py"
# The API key guard, loaded into the API server with `--middleware` (scripts/api_guard.py).
API_GUARD_SCRIPT = "api_guard.py"
API_GUARD_MIDDLEWARE = "api_guard.ApiKeyGuard"
# The variable vLLM 0.34.0 reads the API key from (vllm/envs.py VLLM_API_KEY; used by
# entrypoints/serve/middleware/register.py when --api-key is not given), and the one `vllm bench serve`
# sends as `Authorization: Bearer` (vllm/benchmarks/lib/endpoint_request_func.py, _get_headers).
API_KEY_ENV = "VLLM_API_KEY"
BENCHMARK_API_KEY_ENV = "OPENAI_API_KEY"
API_KEY_SECRET_KEY = "api-key"  # the key's entry in the Secret
# The Secret reaches the pods as a read-only file, not as an environment variable of the pod spec (checkov
# CKV_K8S_35); ray_head.sh and benchmark.py read it into the variable of the process that needs it.
API_KEY_DIR = "/var/run/gpu-serving/api-key"
API_KEY_FILE_ENV = "GPU_SERVING_API_KEY_FILE"
HEAD_SCRIPTS = (HEAD_SCRIPT, "ray_wait.py", MEMLOCK_SCRIPT, WAIT_SCRIPT, API_GUARD_SCRIPT)
WORKER_SCRIPTS = (WORKER_SCRIPT, MEMLOCK_SCRIPT, WAIT_SCRIPT)
EFA_CHECK_SCRIPTS = (EFA_CHECK_SCRIPT, "efa_allreduce.py", MEMLOCK_SCRIPT)
BENCHMARK_SCRIPTS = (BENCHMARK_SCRIPT,)
SERVING_SCRIPTS = tuple(sorted({*HEAD_SCRIPTS, *WORKER_SCRIPTS, *EFA_CHECK_SCRIPTS, *BENCHMARK_SCRIPTS}))

SERVICE_TYPES = ("cluster-ip", "internal-lb")
MONITORING_KINDS = ("podmonitor", "annotations")

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 40  # leaves room for the suffixes below within 63 characters


@dataclass(frozen=True)
class Clients:
    """Who may open connections to a port of the serving pods: pods of these namespaces, and these source CIDRs.

    Turned into NetworkPolicy peers (infra/k8s/network_policies.py); empty: nobody
    beyond what the stack itself admits.
    """

    namespaces: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", tuple(self.namespaces))
        object.__setattr__(self, "cidrs", tuple(self.cidrs))
        for ns in self.namespaces:
            if not _DNS1123.match(ns) or len(ns) > 63:
                raise UserError(f"client namespace {ns!r} is not a DNS-1123 label")
        for cidr in self.cidrs:
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise UserError(f"client CIDR {cidr!r} is not an IPv4 network such as 10.20.0.0/16") from None
            if net.version != 4:
                raise UserError(f"client CIDR {cidr!r}: the cluster is IPv4, and IPv4 network policies ignore IPv6 rules")

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.cidrs)


@dataclass(frozen=True)
class ServingSpec:
    """Everything the serving objects need: the plan's figures plus the stack's settings.

    `deployment` is `Plan.deployment()` (infra/planning/contract.py): only a plan
    that fits and names a checkpoint has one. `image` is the pinned serving image
    (vLLM with Ray, and the EFA userspace); None when only the Serving component
    knows it (an Output: the stack's ECR repository), which fills it in before
    any pod spec is built. `ray_version` is the Ray inside it (KubeRay picks its
    probes by it). `pvc_name` is the weights claim
    (components/storage.py), mounted read-only at `mount_path`. The checks'
    thresholds have no default here: the stack config (`gpu-serving:checks`)
    owns them.
    """

    deployment: Deployment
    namespace: str
    image: Optional[str]
    ray_version: str
    pvc_name: str
    ttft_p99_ms: float  # p99 time to first token must stay below this, ms
    tpot_p99_ms: float  # p99 time per output token must stay below this, ms
    nccl_busbw_floor_gbps: float  # EFA check: GB/s (gigabytes per second, the unit nccl-tests prints busbw in)
    vllm_version: str  # the release in the image: the serving command is checked against its flag reference
    production: bool  # NCCL logs warnings only (INFO lines cost log volume on every communicator)
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
    benchmark: bool = False
    suspended: bool = False  # RayCluster spec.suspend: KubeRay deletes the pods (before a GPU node roll)
    benchmark_prompts: int = 200
    benchmark_input_len: int = 1024
    benchmark_output_len: int = 256
    benchmark_concurrency: int = 16
    benchmark_range_ratio: float = 0.0  # --random-range-ratio: lengths uniform within mean x (1 +- R)
    benchmark_prefix_len: int = 0  # --random-prefix-len: tokens every prompt shares (prefix-cache hits)
    # What the plan predicts `vllm bench serve` reports for that load: (result key, value) pairs,
    # printed beside the measurement (the verdict stays on the measurement and the SLA).
    benchmark_predicted: tuple[tuple[str, float], ...] = ()
    image_pull_policy: str = "IfNotPresent"
    load_balancer_tags: Mapping[str, str] = field(default_factory=dict)  # the stack's tags, for an internal NLB
    # Network policies (infra/k8s/network_policies.py): who may call the API port besides
    # the benchmark, who may scrape the metrics ports, who may reach the Ray dashboard
    # (nobody: it listens on the head pod's loopback), and the VPC's CIDR, whence an
    # internal load balancer's connections come.
    api_clients: Clients = field(default_factory=Clients)
    metrics_clients: Clients = field(default_factory=Clients)
    dashboard_clients: Clients = field(default_factory=Clients)
    vpc_cidr: Optional[str] = None

    def __post_init__(self) -> None:
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
        if not 0 <= self.benchmark_range_ratio < 1 or self.benchmark_prefix_len < 0:
            raise UserError(f"benchmark range ratio must be in [0, 1) and prefix length >= 0, got "
                            f"{self.benchmark_range_ratio} and {self.benchmark_prefix_len}")  # fmt: skip
        self._check_serve_command()
        self._check_network()
        if _version_tuple(self.ray_version) < RAY_TOKEN_AUTH_MIN_VERSION:
            minimum = ".".join(map(str, RAY_TOKEN_AUTH_MIN_VERSION))
            raise UserError(
                f"Ray {self.ray_version} has no token authentication; the serving RayCluster turns it on "
                f"(KubeRay authOptions), which needs Ray {minimum} or later: set gpu-serving:serving.rayVersion"
            )
        if self.efa_check:
            if self.nodes < EFA_CHECK_NODES:
                raise UserError(
                    f"the EFA check runs an all-reduce across {EFA_CHECK_NODES} GPU nodes; this stack has {self.nodes}"
                )
            if self.efa_interfaces < 1:
                raise UserError(f"the EFA check needs EFA; {self.instance_type} has no EFA interface")

    def _check_network(self) -> None:
        if self.vpc_cidr is not None:
            Clients(cidrs=(self.vpc_cidr,))  # validates it
        if self.service_type == "internal-lb" and not self.api_clients.cidrs:
            raise UserError(
                "serviceType internal-lb: name who may call the API through the load balancer in "
                "gpu-serving:serving.apiClients.cidrs (their addresses reach the pod as they are; the VPC as a whole, "
                "every node and pod in it, is not admitted)"
            )

    def _check_serve_command(self) -> None:
        """The plan's `vllm serve` arguments must be ones the image's release accepts (infra/catalog/vllm/)."""
        try:
            problems = vllm_release.check_serve_argv(self.serve_argv, self.vllm_version)
        except vllm_release.UnknownRelease as exc:
            raise UserError(str(exc)) from None
        if problems:
            raise UserError(f"vLLM {self.vllm_version} would refuse the serving command: " + "; ".join(problems))

    # --- Figures from the plan ----------------------------------------------------
    @property
    def nodes(self) -> int:
        return self.deployment.nodes.count

    @property
    def gpus_per_node(self) -> int:
        return self.deployment.nodes.gpus_per_node

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def efa_interfaces(self) -> int:
        return self.deployment.pod.efa_interfaces

    @property
    def instance_type(self) -> str:
        return self.deployment.nodes.instance_type

    @property
    def served_model_name(self) -> str:
        return self.deployment.serve.checkpoint

    @property
    def model_dir(self) -> str:
        return self.model_path or f"{self.mount_path.rstrip('/')}/{self.served_model_name}"

    @property
    def marker(self) -> str:
        return self.marker_path or f"{self.model_dir}/{stage_weights.MARKER_NAME}"  # the staging program writes it

    @property
    def vllm_args(self) -> list[str]:
        return list(self.deployment.serve.vllm_args)

    @property
    def serve_argv(self) -> list[str]:
        """`vllm serve <model path> --served-model-name <checkpoint> <the plan's arguments>`: what the head runs,
        with the API key guard (`--middleware`: every path but the probes needs the key; scripts/api_guard.py)."""
        return ["vllm", "serve", self.model_dir, "--served-model-name", self.served_model_name, *self.vllm_args,
                "--middleware", API_GUARD_MIDDLEWARE]  # fmt: skip

    @property
    def api_key_secret_name(self) -> str:
        """The Secret holding the API key (components/serving.py creates it; the head and the benchmark read it)."""
        return f"{self.name}-api-key"

    @property
    def ray_start_params(self) -> dict[str, str]:
        return dict(self.deployment.ray_start_params)

    @property
    def dashboard_host(self) -> str:
        """Where the Ray dashboard and job API listen: loopback unless clients are configured."""
        return DASHBOARD_ALL_ADDRESSES if self.dashboard_clients else DASHBOARD_LOOPBACK

    @property
    def service_name(self) -> str:
        return f"{self.name}-api"

    @property
    def scripts_config_map_name(self) -> str:
        return f"{self.name}-scripts"

    @property
    def api_url(self) -> str:
        """The API Service's in-cluster base URL (no path)."""
        return f"http://{self.service_name}.{self.namespace}.svc.cluster.local:{API_PORT}"

    @property
    def endpoint(self) -> str:
        """The OpenAI-compatible API's base URL inside the cluster."""
        return f"{self.api_url}/v1"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version)[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


# --- Budgets (the plan's start-up calculation) -----------------------------------------


def startup_budget_s(spec: ServingSpec) -> int:
    """Seconds the head may take from container start to a healthy engine."""
    return spec.deployment.startup.startup_budget_s


def startup_failure_threshold(spec: ServingSpec) -> int:
    return spec.deployment.startup.startup_probe_failure_threshold


def ready_timeout_s(spec: ServingSpec) -> int:
    """How long Pulumi waits for the head to be Ready (image pull + startup budget)."""
    return spec.deployment.startup.ready_wait_s
