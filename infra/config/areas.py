"""The areas of the stack config: one pydantic model per `gpu-serving:<area>` object.

Keys are camelCase in YAML and snake_case in Python; every key has a default (or
is required), an allowed range and a description, which `reference.py` turns
into the config reference (docs/configuration.md). A check that involves more than one area
lives on `StackConfig` (`stack.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import Field, StrictBool, field_validator, model_validator
from pydantic_core import PydanticCustomError

from infra.catalog.capacity import CAPACITY_KINDS, ON_DEMAND, is_reserved
from infra.catalog.cloudwatch import (
    DEFAULT_FLOW_LOG_TRAFFIC_TYPE,
    DEFAULT_LOG_RETENTION_DAYS,
    FLOW_LOG_TRAFFIC_TYPES,
    LOG_RETENTION_DAYS,
)
from infra.catalog.eks import DEFAULT_GPU_AMI_TYPE, ENDPOINT_ACCESS_MODES, PRIVATE_SSM, PRIVATE_VPC, PUBLIC_RESTRICTED, gpu_ami_types
from infra.catalog.eks_versions import RELEASES as KUBERNETES_RELEASES, supported_versions
from infra.errors import UserError
from infra.planning.performance import PRESETS, WorkloadSpec
from infra.planning.request import GPU_MEMORY_UTILIZATION_RANGE, KV_CACHE_DTYPES, WEIGHT_FORMAT_CHOICES
from infra.planning.vllm_release import release, supported_range
from infra.config.base import _Area
from infra.config.monitoring import MonitoringConfig

PROJECT = "gpu-serving"  # the Pulumi project (Pulumi.yaml) and the namespace of its config keys

WeightFormat = Literal[WEIGHT_FORMAT_CHOICES]  # type: ignore[valid-type]
KvCacheDtype = Literal[KV_CACHE_DTYPES]  # type: ignore[valid-type]
Objective = Literal["sla-throughput-per-dollar", "max-kv", "min-cost"]
# Every GPU instance type in the catalog is x86_64 (the tests check it against EC2's data).
GpuAmiType = Literal[gpu_ami_types("x86_64")]  # type: ignore[valid-type]
CapacityKind = Literal[CAPACITY_KINDS]  # type: ignore[valid-type]

EndpointAccess = Literal[ENDPOINT_ACCESS_MODES]  # type: ignore[valid-type]
FlowLogTrafficType = Literal[FLOW_LOG_TRAFFIC_TYPES]  # type: ignore[valid-type]




class ModelConfig(_Area):
    """`gpu-serving:model`: which model to serve."""

    name: str = Field(
        min_length=1,
        description="Catalog name (e.g. `deepseek-v4-pro`) or path to a `config.json` / model directory.",
    )
    weight_format: Optional[WeightFormat] = Field(
        default=None,
        description="Stored weight format to plan for; null = the checkpoint's own.",
    )
    revision: Optional[str] = Field(
        default=None,
        pattern=r"^[0-9a-f]{40}$",
        description="Hugging Face commit of the checkpoint the staging Job downloads (every file from that one commit); "
        "null = the catalog's pinned commit (`infra/catalog/models.py`), if it has one. A model whose serving runs the "
        "checkpoint's own code (`--trust-remote-code`, e.g. Kimi K3's tokenizer) is refused without a pinned commit, and so is "
        "any checkpoint in production.",
        json_schema_extra={"allowed": "a 40-hex-digit commit, or null"},
    )


class GpuConfig(_Area):
    """`gpu-serving:gpu`: the GPU nodes."""

    instance_type: str = Field(
        pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$",
        description="EC2 instance type of the GPU nodes (e.g. `p5.48xlarge`); must be in the catalog.",
        json_schema_extra={"allowed": "an EC2 instance type such as p5.48xlarge"},
    )
    nodes: int = Field(
        ge=1,
        le=64,
        description="Number of GPU nodes; with objective `min-cost`, the most the planner may use (it picks the fewest that hold `targetConcurrency`).",
    )
    ami_type: GpuAmiType = Field(
        default=DEFAULT_GPU_AMI_TYPE,
        description="EKS AMI type of the GPU nodes (NVIDIA driver, toolkit and EFA software on board; "
        "GPU-EFA topology pairing with the EFA device plugin happens on AL2023 only).",
    )
    capacity: "CapacityConfig" = Field(
        default_factory=lambda: CapacityConfig(),
        description="Where the GPU capacity comes from: on demand, a capacity reservation, or an EC2 Capacity Block for ML.",
    )
    root_volume_gib: Optional[int] = Field(
        default=None,
        ge=50,
        le=16_384,
        description="Encrypted gp3 root volume per GPU node, GiB; null = the plan's size (container images and caches).",
    )
    ami_release_version: Optional[str] = Field(
        default=None,
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+-[0-9a-z]+$",
        description="AMI release of the GPU (and system) nodes, changed on purpose (EKS then replaces the nodes); "
        "null = the release pinned for the Kubernetes version in `infra/catalog/eks_versions.py` (AL2023 only: "
        "a Bottlerocket AMI type needs one here).",
        json_schema_extra={"allowed": "an EKS AMI release version such as 1.35.6-20260714, or null"},
    )


class CapacityConfig(_Area):
    """`gpu-serving:gpu.capacity`: how the GPU instances are bought."""

    type: CapacityKind = Field(
        default=ON_DEMAND,
        description="`on-demand`, `capacity-reservation` (an On-Demand Capacity Reservation) or "
        "`capacity-block` (EC2 Capacity Block for ML; node group capacity type CAPACITY_BLOCK).",
    )
    reservation_id: Optional[str] = Field(
        default=None,
        pattern=r"^cr-[0-9a-f]{8,17}$",
        description="Capacity reservation id (`cr-...`); required for `capacity-reservation` and `capacity-block`.",
        json_schema_extra={"allowed": "a capacity reservation id such as cr-0123456789abcdef0, or null"},
    )

    @model_validator(mode="after")
    def _reservation_needs_id(self) -> "CapacityConfig":
        if is_reserved(self.type) and not self.reservation_id:
            raise PydanticCustomError(
                "required_for_capacity",
                "required when type is '{kind}' (the reservation or Capacity Block to launch into)",
                {"key": "reservationId", "kind": self.type},
            )
        if not is_reserved(self.type) and self.reservation_id:
            raise PydanticCustomError(
                "reservation_without_type",
                "a reservationId is given but type is 'on-demand'; set type to 'capacity-reservation' or 'capacity-block'",
                {"key": "reservationId"},
            )
        return self


Cidr = Annotated[str, Field(pattern=r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$")]
Namespace = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]


def _clients(name: str, what: str, namespaces_note: str, cidrs_note: str) -> type["_Area"]:
    """An object of `namespaces` and `cidrs`: who may open connections to one port of the serving pods."""
    fields: dict[str, Any] = {
        "__annotations__": {"namespaces": list[Namespace], "cidrs": list[Cidr]},
        "__doc__": f"Who may {what}: pods of these namespaces, these source CIDRs (a NetworkPolicy).",
        "namespaces": Field(
            default_factory=list,
            description=f"Namespaces whose pods may {what}{namespaces_note}",
            json_schema_extra={"allowed": "a list of namespace names such as monitoring"},
        ),
        "cidrs": Field(
            default_factory=list,
            description=f"Source CIDRs that may {what}{cidrs_note}",
            json_schema_extra={"allowed": "a list of IPv4 CIDRs such as 10.20.0.0/16"},
        ),
    }
    return type(name, (_Area,), fields)


class NetworkConfig(_Area):
    """`gpu-serving:network`: the VPC, or an existing one."""

    vpc_cidr: str = Field(
        default="10.0.0.0/16",
        pattern=r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|20)$",
        description="CIDR of the VPC the stack creates (/16 to /20).",
        json_schema_extra={"allowed": "an IPv4 CIDR from /16 to /20, such as 10.0.0.0/16"},
    )
    availability_zones: Optional[list[str]] = Field(
        default=None,
        min_length=2,
        max_length=6,
        description="Availability zones for subnets (at least 2, as EKS requires); null = the region's `a` and `b` zones. "
        "Zone names map to different physical zones per account: set them when a reservation fixes the zone.",
        json_schema_extra={"allowed": "a list of 2 to 6 zone names such as us-east-1a, or null"},
    )
    gpu_availability_zone: Optional[str] = Field(
        default=None,
        description="The one zone of all GPU nodes (EFA traffic and cluster placement groups do not cross zones); "
        "null = the first of availabilityZones. With a Capacity Block: the block's zone.",
        json_schema_extra={"allowed": "one zone name from availabilityZones, or null"},
    )
    placement_group: Optional[StrictBool] = Field(
        default=None,
        description="Create a `cluster` placement group for the GPU nodes; null = yes on demand, no with a "
        "reservation or Capacity Block (one made in a placement group names it in `placementGroupName`).",
    )
    placement_group_name: Optional[str] = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$",
        description="An existing cluster placement group to launch the GPU nodes into instead: the one a capacity "
        "reservation or Capacity Block was made in (pre-flight reads it from the reservation).",
        json_schema_extra={"allowed": "a placement group name, or null"},
    )
    nat_gateway_per_az: StrictBool = Field(
        default=False, description="One NAT gateway per zone (survives a zone outage) instead of one."
    )
    flow_log_traffic_type: FlowLogTrafficType = Field(
        default=DEFAULT_FLOW_LOG_TRAFFIC_TYPE,
        description="What the flow log of the VPC the stack creates records, to a CloudWatch log group: `REJECT` "
        "(connections security groups and network ACLs refused) or `ALL` (every connection; more log data).",
    )
    existing_vpc_id: Optional[str] = Field(
        default=None,
        pattern=r"^vpc-[0-9a-f]{8,17}$",
        description="Use this VPC instead of creating one (then the three subnet keys below are required).",
        json_schema_extra={"allowed": "a VPC id such as vpc-0123456789abcdef0, or null"},
    )
    existing_private_subnet_ids: Optional[list[str]] = Field(
        default=None, description="Private subnets of the existing VPC (control plane, system nodes), 2 or more.",
        json_schema_extra={"allowed": "a list of subnet ids, or null"},
    )
    existing_public_subnet_ids: Optional[list[str]] = Field(
        default=None, description="Public subnets of the existing VPC (load balancers).",
        json_schema_extra={"allowed": "a list of subnet ids, or null"},
    )
    existing_gpu_subnet_id: Optional[str] = Field(
        default=None,
        pattern=r"^subnet-[0-9a-f]{8,17}$",
        description="The one private subnet of the GPU nodes in the existing VPC (one zone).",
        json_schema_extra={"allowed": "one subnet id such as subnet-0123456789abcdef0, or null"},
    )

    @model_validator(mode="before")
    @classmethod
    def _one_gpu_zone(cls, data: Any) -> Any:
        for key in ("gpuAvailabilityZone", "gpu_availability_zone", "existingGpuSubnetId", "existing_gpu_subnet_id"):
            value = data.get(key) if isinstance(data, dict) else None
            if isinstance(value, (list, tuple)):
                raise PydanticCustomError(
                    "one_gpu_zone",
                    "GPU nodes must be in one availability zone and one subnet (EFA traffic and cluster "
                    "placement groups do not cross zones); got {count}: {value}",
                    {"key": key, "count": len(value), "value": ", ".join(map(str, value))},
                )
        return data

    @model_validator(mode="after")
    def _zones_agree(self) -> "NetworkConfig":
        if self.existing_vpc_id:
            missing = [k for k, v in (("existingPrivateSubnetIds", self.existing_private_subnet_ids),
                                      ("existingGpuSubnetId", self.existing_gpu_subnet_id)) if not v]  # fmt: skip
            if missing:
                raise PydanticCustomError(
                    "existing_vpc_needs_subnets",
                    "with existingVpcId, also give {keys}",
                    {"keys": " and ".join(missing)},
                )
        elif self.availability_zones and len(set(self.availability_zones)) < len(self.availability_zones):
            twice = sorted({z for z in self.availability_zones if self.availability_zones.count(z) > 1})
            raise PydanticCustomError(
                "zone_listed_twice",
                "availabilityZones lists {zones} more than once; EKS needs two or more distinct zones",
                {"key": "availabilityZones", "zones": ", ".join(twice)},
            )
        elif self.gpu_availability_zone and self.availability_zones and self.gpu_availability_zone not in self.availability_zones:
            raise PydanticCustomError(
                "gpu_zone_not_listed",
                "gpuAvailabilityZone '{zone}' is not one of availabilityZones ({zones})",
                {"zone": self.gpu_availability_zone, "zones": ", ".join(self.availability_zones)},
            )
        return self

    def zones(self, region: str) -> list[str]:
        return list(self.availability_zones or [f"{region}a", f"{region}b"])

    def gpu_zone(self, region: str) -> str:
        return self.gpu_availability_zone or self.zones(region)[0]


class ClusterConfig(_Area):
    """`gpu-serving:cluster`: the EKS control plane, the deployer's way in, and the system nodes."""

    kubernetes_version: Optional[str] = Field(
        default=None,
        pattern=r"^1\.[0-9]{2}$",
        description="EKS Kubernetes version, upgraded on purpose one minor version at a time; null = the newest "
        "version in standard support on the day of `up` whose add-ons are pinned (`infra/catalog/eks_versions.py`).",
        json_schema_extra={"allowed": f"one of {', '.join(supported_versions())}, or null"},
    )
    endpoint_access: EndpointAccess = Field(
        default=PRIVATE_SSM,
        description="How `pulumi up` and kubectl reach the API: `public-restricted` (public endpoint open only to "
        "`deployerCidrs`, private endpoint for the nodes), `private-ssm` (private only; the stack creates an "
        "SSM-managed bastion and the kubeconfig goes through an SSM port-forwarding tunnel) or `private-vpc` "
        "(private only; the deployer runs inside the existing VPC, from `deployerCidrs`).",
    )
    deployer_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="Where the deployer connects from: the public CIDRs allowed to the public endpoint "
        "(`public-restricted`), or the in-VPC CIDRs allowed to the private endpoint (`private-vpc`).",
        json_schema_extra={"allowed": "a list of IPv4 CIDRs such as 203.0.113.0/24"},
    )
    api_tunnel_port: int = Field(
        default=9443,
        ge=1024,
        le=65535,
        description="`private-ssm`: the local port of the SSM tunnel the kubeconfig points at (`https://localhost:<port>`).",
    )
    admin_principal_arns: list[str] = Field(
        default_factory=list,
        description=(
            "IAM roles or users given cluster admin through EKS access entries. Empty: whoever runs the first "
            "`pulumi up` is the one admin. Non-empty: on a new cluster they are the only admins (list the role that "
            "runs `pulumi up` too). A running cluster keeps its creator's admin entry (EKS sets it only at creation; "
            "changing it would replace the cluster): once a listed admin works, remove it with `aws eks "
            "delete-access-entry --cluster-name <cluster> --principal-arn <creator's ARN>` (`aws eks "
            "list-access-entries` shows it); until then do not list the creator there: EKS refuses a second "
            "entry for the same principal."
        ),
        json_schema_extra={"allowed": "a list of IAM ARNs such as arn:aws:iam::123456789012:role/admin"},
    )
    system_instance_type: str = Field(
        default="m7i.xlarge",
        pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$",
        description="Instance type of the small non-GPU node group for operators and add-ons.",
        json_schema_extra={"allowed": "an EC2 instance type such as m7i.xlarge"},
    )
    system_node_count: int = Field(default=2, ge=1, le=10, description="Nodes in the system node group.")
    fsx_csi: StrictBool = Field(default=False, description="Install the FSx for Lustre CSI driver add-on too.")
    support_type: Literal["EXTENDED", "STANDARD"] = Field(
        default="EXTENDED",
        description="The cluster's upgrade policy when its Kubernetes version leaves standard support (EKS "
        "UpgradePolicy.supportType): `EXTENDED` keeps the version and the control plane costs $0.60 an hour instead "
        "of $0.10 (about $365 a month more) until you upgrade; `STANDARD` has EKS upgrade the control plane itself, "
        "ahead of the add-on and AMI pins of `infra/catalog/eks_versions.py`, which the next `up` cannot set back. "
        "`preflight` warns 60 days before standard support ends either way.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("publicAccessCidrs" in data or "public_access_cidrs" in data):
            raise PydanticCustomError(
                "renamed_key",
                "publicAccessCidrs was replaced by endpointAccess and deployerCidrs: for a public endpoint set "
                "endpointAccess: public-restricted and list the CIDRs in deployerCidrs; an empty list (private only) "
                "is endpointAccess: private-ssm",
                {"key": "publicAccessCidrs"},
            )
        return data

    @model_validator(mode="after")
    def _version_pinned(self) -> "ClusterConfig":
        v = self.kubernetes_version
        if v is not None and v not in supported_versions():
            known = "the EKS calendar has no such version" if v not in KUBERNETES_RELEASES else (
                "its add-on versions or AMI release are not pinned in infra/catalog/eks_versions.py yet"
            )
            raise PydanticCustomError(
                "version_not_pinned",
                "'{version}' cannot be deployed: {why}; use one of {supported} (or null for the default)",
                {"key": "kubernetesVersion", "version": v, "why": known, "supported": ", ".join(supported_versions())},
            )
        return self


class LifecycleConfig(_Area):
    """`gpu-serving:lifecycle`: who owns the stack and how long it may live."""

    production: StrictBool = Field(
        default=False,
        description="A production stack: resources that hold data or are costly to replace are protected, and it never expires.",
    )
    owner: str = Field(
        default="unknown",
        min_length=1,
        max_length=128,
        description="Team or person answerable for the stack; tagged on every AWS resource as `owner`.",
    )
    expires_at: Optional[str] = Field(
        default=None,
        pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$",
        description="When a non-production stack may be swept, ISO 8601 UTC (`2026-12-31T18:00:00Z`); "
        "required unless production; tagged as `expires-at`.",
        json_schema_extra={"allowed": "an ISO 8601 UTC time such as 2026-12-31T18:00:00Z, or null"},
    )
    log_retention_days: int = Field(
        default=DEFAULT_LOG_RETENTION_DAYS,
        description="Days CloudWatch Logs keeps the control-plane logs and the VPC flow logs; 0 = never expire. "
        "A year on every stack: an ephemeral stack's log groups are deleted with it, so a shorter one saves nothing.",
        json_schema_extra={"allowed": f"one of {', '.join(map(str, LOG_RETENTION_DAYS))} (the values CloudWatch Logs accepts)"},
    )

    @field_validator("log_retention_days")
    @classmethod
    def _retention_cloudwatch_accepts(cls, v: int) -> int:
        if v not in LOG_RETENTION_DAYS:
            raise PydanticCustomError(
                "retention_not_accepted",
                "not a retention CloudWatch Logs accepts (the nearest: {near})",
                {"near": ", ".join(str(d) for d in sorted(LOG_RETENTION_DAYS, key=lambda d: abs(d - v))[:2])},
            )
        return v

    @model_validator(mode="after")
    def _expiry(self) -> "LifecycleConfig":
        if not self.production and not self.expires_at:
            raise PydanticCustomError(
                "required_for_capacity",
                "required for a non-production stack (the leak sweeper deletes expired stacks)",
                {"key": "expiresAt"},
            )
        if self.production and self.expires_at:
            raise PydanticCustomError(
                "reservation_without_type",
                "a production stack does not expire; remove expiresAt or set production to false",
                {"key": "expiresAt"},
            )
        return self


class SpeculativeConfig(_Area):
    """`gpu-serving:serving.speculative`: speculative decoding (vLLM `--speculative-config`)."""

    method: Literal["mtp", "off"] = Field(
        default="mtp",
        description="Drafter: `mtp`, the model's own multi-token-prediction layers (the model must have them); "
        "`off`: none, whatever the search would choose.",
    )
    num_speculative_tokens: int = Field(
        default=1, ge=1, le=16, description="Tokens drafted per step (`num_speculative_tokens`)."
    )


ApiClientsConfig = _clients(
    "ApiClientsConfig",
    "call the OpenAI-compatible port 8000",
    " (every pod of each); the benchmark Job always may.",
    "; with serviceType internal-lb these are the only sources the load balancer and the NetworkPolicy admit "
        "(required; the clients' addresses are kept: externalTrafficPolicy Local).",
)
MetricsClientsConfig = _clients(
    "MetricsClientsConfig",
    "scrape the serving pods' metrics (vLLM's on 8000, Ray's on 8080)",
    ", e.g. Prometheus's; none by default.",
    "; none by default.",
)
DashboardClientsConfig = _clients(
    "DashboardClientsConfig",
    "reach the Ray dashboard and job API (8265; Ray's token authentication still applies)",
    "; none by default: the dashboard then listens on the head pod's loopback only (`kubectl port-forward` reaches it).",
    "; given any namespace or CIDR, the dashboard listens on the pod's address.",
)


class SlaConfig(_Area):
    """`gpu-serving:serving.sla`: the latency the endpoint promises; the plan's search and the benchmark Job both use it."""

    ttft_p99_ms: float = Field(default=250.0, gt=0, le=600_000, description="p99 time to first token, ms.")
    tpot_p99_ms: float = Field(default=40.0, gt=0, le=60_000, description="p99 time per output token, ms.")
    itl_p99_ms: Optional[float] = Field(
        default=None, gt=0, le=60_000, description="p99 inter-token latency, ms; null = not part of the SLA."
    )


class WorkloadConfig(_Area):
    """`gpu-serving:serving.workload`: the request lengths the plan predicts with (and the benchmark Job sends)."""

    preset: Optional[Literal[tuple(PRESETS)]] = Field(  # type: ignore[valid-type]
        default="sharegpt",
        description="A named length distribution (`sharegpt`: the ShareGPT dataset's own pairs, 219 input / 200 output "
        "tokens on average; infra/planning/perf/sharegpt.py cites where from); null = the lengths below.",
    )
    input_tokens: Optional[int] = Field(
        default=None, ge=1, le=16_777_216, description="Mean input tokens per request (with preset null)."
    )
    output_tokens: Optional[int] = Field(
        default=None, ge=1, le=16_777_216, description="Mean output tokens per request (with preset null)."
    )
    spread: float = Field(
        default=0.0, ge=0, le=4, description="Lognormal spread of both lengths, std / mean; 0 = every request the same (with preset null)."
    )
    prefix_cache_hit_rate: float = Field(
        default=0.0, ge=0, lt=1, description="Share of each prompt already in vLLM's prefix cache (a shared system prompt)."
    )

    @model_validator(mode="after")
    def _lengths_or_preset(self) -> "WorkloadConfig":
        if self.preset is None and (self.input_tokens is None or self.output_tokens is None):
            missing = "inputTokens" if self.input_tokens is None else "outputTokens"
            raise PydanticCustomError("required_for_objective", "required when preset is null", {"key": missing})
        if self.preset is not None and (self.input_tokens is not None or self.output_tokens is not None or self.spread):
            raise PydanticCustomError(
                "renamed_key", "set either preset or inputTokens/outputTokens/spread, not both (preset: null for your own)",
                {"key": "preset"},
            )
        return self

    def spec(self) -> WorkloadSpec:
        if self.preset is not None:
            return WorkloadSpec.from_preset(self.preset, self.prefix_cache_hit_rate)
        return WorkloadSpec(self.input_tokens, self.output_tokens, self.spread, None, self.prefix_cache_hit_rate)


class ServingConfig(_Area):
    """`gpu-serving:serving`: vLLM's knobs; null lets the planner decide."""

    tensor_parallel: Optional[int] = Field(
        default=None, ge=1, le=512, description="`--tensor-parallel-size`; null = planner decides."
    )
    pipeline_parallel: Optional[int] = Field(
        default=None, ge=1, le=128, description="`--pipeline-parallel-size`; null = planner decides."
    )
    data_parallel: Optional[int] = Field(
        default=None, ge=1, le=512, description="`--data-parallel-size`: model replicas on the GPUs left after TP (never with PP > 1); over several nodes with `--data-parallel-backend ray` and the replicas per node as `--data-parallel-size-local`, so the head starts every node's; null = planner decides."
    )
    expert_parallel: Optional[StrictBool] = Field(
        default=None, description="`--enable-expert-parallel` for MoE models; null = planner decides."
    )
    max_model_len: Optional[int] = Field(
        default=None,
        ge=128,
        le=16_777_216,
        description="`--max-model-len` in tokens; null = min(model's maximum, 131072).",
    )
    gpu_memory_utilization: float = Field(
        default=0.90,
        ge=GPU_MEMORY_UTILIZATION_RANGE[0],
        le=GPU_MEMORY_UTILIZATION_RANGE[1],
        description="`--gpu-memory-utilization`: share of each GPU's memory vLLM may use.",
    )
    max_num_batched_tokens: Optional[int] = Field(
        default=None,
        ge=64,
        le=1_048_576,
        description="`--max-num-batched-tokens`; null = searched: vLLM's default for the GPU unless a smaller chunk holds markedly more sequences (models with sliding-window or state caches, and a MoE model's replicas, whose MoE layers run every replica's tokens).",
    )
    max_num_seqs: Optional[int] = Field(
        default=None, ge=1, le=65_536, description="`--max-num-seqs`; null = derived from KV capacity."
    )
    kv_cache_dtype: Optional[KvCacheDtype] = Field(
        default=None,
        description="`--kv-cache-dtype`; null = the model's own (`auto`), FP8 only if that does not fit.",
    )
    async_scheduling: Optional[StrictBool] = Field(
        default=None,
        description="`--async-scheduling`; null = vLLM's default, off only where that admits at least 10% more sequences "
        "(sliding-window and state groups reserve PP + 1 in-flight batches with it; the plan says why).",
    )
    speculative: Optional[SpeculativeConfig] = Field(
        default=None,
        description="Speculative decoding with the model's MTP layers (`--speculative-config`); null = the "
        "`sla-throughput-per-dollar` search tries one draft token against none where the model has MTP layers "
        "(other objectives: none). The draft weights, its KV cache and its CUDA graphs count in the plan.",
    )
    objective: Objective = Field(
        default="sla-throughput-per-dollar",
        description="Layout search goal: `sla-throughput-per-dollar` (most output tokens/s within `sla` at `workload`, "
        "per dollar-hour), `max-kv` (most KV cache on the given nodes) or `min-cost` (fewest GPUs that reach "
        "`targetConcurrency`).",
    )
    sla: SlaConfig = Field(
        default_factory=lambda: SlaConfig(), description="The latency targets (p99 TTFT, TPOT, optional ITL) the plan sizes for."
    )
    workload: WorkloadConfig = Field(
        default_factory=lambda: WorkloadConfig(), description="The request lengths the plan predicts with."
    )
    target_concurrency: Optional[int] = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Sequences at max-model-len to hold at once; required when objective is `min-cost`.",
    )
    cold_start_target_seconds: float = Field(
        default=600.0,
        ge=1,
        le=86_400,
        description="Time allowed to read all weights from storage; sizes storage throughput.",
    )
    vllm_version: str = Field(
        default="0.34.0",
        pattern=r"^\d+\.\d+\.\d+$",
        description="vLLM release of the serving image (`images/vllm/Dockerfile` builds on `vllm/vllm-openai:v<version>`); "
        "the planner follows that release's memory accounting.",
        json_schema_extra={"allowed": f"a release from {supported_range()}, such as 0.34.0"},
    )
    ray_version: str = Field(
        default="2.60.0",
        pattern=r"^\d+\.\d+\.\d+$",
        description="Ray release installed in the serving image and set as the RayCluster's `rayVersion`.",
        json_schema_extra={"allowed": "a release such as 2.60.0"},
    )
    image: Optional[str] = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?$",
        description="Serving image (vLLM with Ray); null = the image `bin/build-image` pushed to the stack's ECR repository "
        "(tag `<vllmVersion>-ray<rayVersion>-<hash of images/vllm>`), run by the digest that tag holds. In production "
        "(`lifecycle.production`) an image given here must carry its digest (`...@sha256:...`): a tag can be re-pushed.",
        json_schema_extra={"allowed": "an image reference with a digest (a tag alone outside production), or null"},
    )
    namespace: str = Field(
        default="gpu-serving",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="Kubernetes namespace of the serving RayCluster, its Service and the weight storage claim.",
        json_schema_extra={"allowed": "a DNS label such as gpu-serving"},
    )
    service_type: Literal["cluster-ip", "internal-lb"] = Field(
        default="cluster-ip",
        description="How the OpenAI-compatible endpoint (port 8000) is exposed: inside the cluster only, or an internal load balancer in the VPC.",
    )
    suspended: StrictBool = Field(
        default=False,
        description="Serving suspended: the RayCluster stays, KubeRay deletes its pods (`spec.suspend`), the GPU nodes "
        "idle. Set it, and `pulumi up`, before a change that rolls the GPU nodes (the serving PodDisruptionBudget "
        "blocks every eviction); clear it after (docs/operating.md, Changing a running stack).",
    )
    monitoring: Literal["podmonitor", "annotations"] = Field(
        default="annotations",
        description="How a Prometheus finds the vLLM and DCGM metrics: a PodMonitor (needs the Prometheus operator's CRDs) or "
        "scrape annotations. With `monitoring.mode` in-cluster the PodMonitor and DCGM's ServiceMonitor are made whatever "
        "this says, and `annotations` keeps the annotations too (removing them would restart the serving pods).",
    )
    api_clients: ApiClientsConfig = Field(  # type: ignore[valid-type]
        default_factory=lambda: ApiClientsConfig(),
        description="Who may call the API port besides the benchmark (NetworkPolicy).",
    )
    metrics_clients: MetricsClientsConfig = Field(  # type: ignore[valid-type]
        default_factory=lambda: MetricsClientsConfig(),
        description="Who may scrape the serving pods' metrics ports (NetworkPolicy); with `monitoring.mode` in-cluster "
        "the `monitoring` namespace is admitted besides these.",
    )
    ray_dashboard_clients: DashboardClientsConfig = Field(  # type: ignore[valid-type]
        default_factory=lambda: DashboardClientsConfig(),
        description="Who may reach the Ray dashboard; none: it is bound to the head pod's loopback.",
    )

    @field_validator("vllm_version")
    @classmethod
    def _supported_release(cls, v: str) -> str:
        try:
            release(v)
        except UserError as err:
            raise PydanticCustomError("unsupported_vllm", "{reason}", {"reason": str(err)}) from None
        return v

    @model_validator(mode="after")
    def _min_cost_needs_target(self) -> "ServingConfig":
        if self.objective == "min-cost" and self.target_concurrency is None:
            raise PydanticCustomError(
                "required_for_objective",
                "required when objective is 'min-cost'",
                {"key": "targetConcurrency"},
            )
        return self


UsdPerMonth = Annotated[float, Field(ge=0)]


class StorageConfig(_Area):
    """`gpu-serving:storage`: where the model weights live and come from."""

    type: Literal["efs", "fsx"] = Field(
        default="efs",
        description="`efs` (Amazon EFS, elastic throughput) or `fsx` (FSx for Lustre, sized for the cold-start target).",
    )
    source: Literal["hf", "s3"] = Field(
        default="hf", description="Where the staging Job copies the weights from: the Hugging Face hub or an S3 prefix."
    )
    s3_uri: Optional[str] = Field(
        default=None,
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
        description="S3 prefix holding the checkpoint's files; required when source is `s3`.",
        json_schema_extra={"allowed": "an S3 URI such as s3://bucket/models/DeepSeek-V4-Pro, or null"},
    )

    staging_image: Optional[str] = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$",
        description="Weight-staging image, pinned by digest: Python 3 with huggingface_hub and boto3 installed, running as a "
        "non-root user (what `images/staging/Dockerfile` builds); null = the stack's ECR repository at the tag "
        "`bin/build-image` pushes it with (`staging-hub<version>-boto3-<version>-<hash>`). Nothing is installed when the Job runs.",
        json_schema_extra={"allowed": "an image reference pinned by digest, such as registry/staging@sha256:<64 hex digits>, or null"},
    )
    staging_run: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Generation of the weight-staging Job: raise it by one to run the Job again after it failed "
        "(its deadline passed); the new Job resumes the partial downloads.",
    )

    @model_validator(mode="after")
    def _s3_needs_uri(self) -> "StorageConfig":
        if self.source == "s3" and not self.s3_uri:
            raise PydanticCustomError(
                "required_for_capacity", "required when source is 's3'", {"key": "s3Uri"}
            )
        return self


class ChecksConfig(_Area):
    """`gpu-serving:checks`: optional post-deploy checks, run as Jobs."""

    efa: StrictBool = Field(
        default=False,
        description="EFA check: an NCCL all-reduce across two nodes goes over EFA (a fallback to TCP fails it) and reaches "
        "the floor; a Job that needs two free GPU nodes (it runs at bring-up, while the weights are staged, or in a "
        "maintenance window), never awaited by `pulumi up` nor a prerequisite of the RayCluster.",
    )
    nccl_bus_bandwidth_floor_gbps: float = Field(
        default=100.0, gt=0, le=10_000, description="Lowest acceptable NCCL all-reduce bus bandwidth across nodes, GB/s."
    )
    benchmark: StrictBool = Field(
        default=False, description="Serving benchmark after deploy: `vllm bench serve` against the Service with the "
        "stack's workload at the plan's SLA capacity; it fails when a p99 misses `serving.sla`, and prints the plan's "
        "prediction for the same load beside the measurement."
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_thresholds(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in (("ttftP99Ms", "ttftP99Ms"), ("tpotP99Ms", "tpotP99Ms"), ("ttft_p99_ms", "ttftP99Ms"),
                             ("tpot_p99_ms", "tpotP99Ms")):  # fmt: skip
                if old in data:
                    raise PydanticCustomError(
                        "renamed_key",
                        f"the benchmark's thresholds moved to gpu-serving:serving.sla.{new}, which the plan sizes for too",
                        {"key": old},
                    )
        return data


class CostConfig(_Area):
    """`gpu-serving:cost`: inputs of the cost model."""

    api_price_usd_per_million_tokens: Optional[float] = Field(
        default=None,
        gt=0,
        le=1000,
        description="Price of the same model from an API provider, USD per million tokens, to compare with.",
    )
    throughput_tokens_per_second: Optional[float] = Field(
        default=None,
        gt=0,
        le=1e9,
        description="Measured cluster output tokens/s within the SLA; when set the cost per token uses it (the plan shows "
        "it beside its prediction); null = the prediction.",
    )
    duty_cycle: float = Field(
        default=1.0, gt=0, le=1, description="Share of the month the cluster serves at its SLA capacity, for tokens per month."
    )
    tco: Optional[dict[str, UsdPerMonth]] = Field(
        default=None,
        description="Total cost of ownership: category name -> USD per month; null = use the cloud price.",
        json_schema_extra={"allowed": "a mapping of category name to USD per month, each >= 0, or null"},
    )


GpuConfig.model_rebuild()

AREAS: dict[str, type[_Area]] = {
    "model": ModelConfig,
    "gpu": GpuConfig,
    "serving": ServingConfig,
    "cost": CostConfig,
    "network": NetworkConfig,
    "cluster": ClusterConfig,
    "lifecycle": LifecycleConfig,
    "storage": StorageConfig,
    "checks": ChecksConfig,
    "monitoring": MonitoringConfig,
}

# Secrets live in their own keys, set with `pulumi config set --secret`; the
# program reads them with Config.require_secret / get_secret so they stay
# secret end to end, and the offline tools never decrypt them.
SECRET_KEYS = {
    "hfToken": "Hugging Face token for the weight-staging Job (gated or private models)",
    "alertWebhookUrl": "URL Alertmanager posts alerts to when `monitoring.alerts.receiver` is `webhook` (a Kubernetes "
    "Secret Alertmanager reads it from; never in plain Helm values)",
}
