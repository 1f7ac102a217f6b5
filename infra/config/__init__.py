"""The stack config: one pydantic model per area, loaded from Pulumi or a stack file.

A stack file `Pulumi.<stack>.yaml` holds one object per area under the project's
namespace, plus the AWS region:

    config:
      aws:region: us-east-1
      gpu-serving:model:   {name: deepseek-v4-pro}
      gpu-serving:gpu:     {instanceType: p5.48xlarge, nodes: 4}
      gpu-serving:serving: {maxModelLen: 131072, gpuMemoryUtilization: 0.90}
      gpu-serving:cost:    {apiPriceUsdPerMillionTokens: 2.50}

Keys are camelCase in YAML and snake_case in Python. Every key has a default and
an allowed range; an unknown key, a value out of range or a missing required key
is a `UserError` that names the stack file, the full key path (for example
`gpu-serving:serving.gpuMemoryUtilization`) and what is allowed.

The Pulumi program reads the config through the engine (`from_pulumi_config`);
offline tools read the stack file directly (`load_stack_file`). This module
imports Pulumi only inside `from_pulumi_config`, so it works without the engine.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import annotated_types
import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from infra.errors import UserError
from infra.planning.request import KV_CACHE_DTYPES, WEIGHT_FORMAT_CHOICES, PlanRequest, TcoInputs

PROJECT = "gpu-serving"
DEFAULT_REGION = "us-east-1"
REPO_ROOT = Path(__file__).resolve().parents[2]

WeightFormat = Literal[WEIGHT_FORMAT_CHOICES]  # type: ignore[valid-type]
KvCacheDtype = Literal[KV_CACHE_DTYPES]  # type: ignore[valid-type]
Objective = Literal["max-kv", "min-cost"]


class _Area(BaseModel):
    """Common settings: camelCase keys, no unknown keys, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


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
    ami_type: Literal["AL2023_x86_64_NVIDIA", "BOTTLEROCKET_x86_64_NVIDIA"] = Field(
        default="AL2023_x86_64_NVIDIA",
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


class CapacityConfig(_Area):
    """`gpu-serving:gpu.capacity`: how the GPU instances are bought."""

    type: Literal["on-demand", "capacity-reservation", "capacity-block"] = Field(
        default="on-demand",
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
        if self.type != "on-demand" and not self.reservation_id:
            raise PydanticCustomError(
                "required_for_capacity",
                "required when type is '{kind}' (the reservation or Capacity Block to launch into)",
                {"key": "reservationId", "kind": self.type},
            )
        if self.type == "on-demand" and self.reservation_id:
            raise PydanticCustomError(
                "reservation_without_type",
                "a reservationId is given but type is 'on-demand'; set type to 'capacity-reservation' or 'capacity-block'",
                {"key": "reservationId"},
            )
        return self


Cidr = Annotated[str, Field(pattern=r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$")]


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
        description="Launch GPU nodes in a `cluster` placement group; null = yes on demand, no with a reservation "
        "or Capacity Block (their placement is fixed already, and forcing a group breaks launches).",
    )
    nat_gateway_per_az: StrictBool = Field(
        default=False, description="One NAT gateway per zone (survives a zone outage) instead of one."
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
    """`gpu-serving:cluster`: the EKS control plane and its system nodes."""

    kubernetes_version: str = Field(
        default="1.33",
        pattern=r"^1\.[0-9]{2}$",
        description="EKS Kubernetes version.",
        json_schema_extra={"allowed": "a version such as 1.33"},
    )
    public_access_cidrs: list[Cidr] = Field(
        default_factory=list,
        description="CIDRs allowed to reach the API endpoint from the internet; empty = private endpoint only.",
        json_schema_extra={"allowed": "a list of IPv4 CIDRs such as 203.0.113.0/24"},
    )
    admin_principal_arns: list[str] = Field(
        default_factory=list,
        description="IAM roles or users given cluster admin through EKS access entries.",
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


class ServingConfig(_Area):
    """`gpu-serving:serving`: vLLM's knobs; null lets the planner decide."""

    tensor_parallel: Optional[int] = Field(
        default=None, ge=1, le=512, description="`--tensor-parallel-size`; null = planner decides."
    )
    pipeline_parallel: Optional[int] = Field(
        default=None, ge=1, le=128, description="`--pipeline-parallel-size`; null = planner decides."
    )
    data_parallel: Optional[int] = Field(
        default=None, ge=1, le=512, description="`--data-parallel-size`: model replicas on the GPUs left after TP (never with PP > 1); null = planner decides."
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
        ge=0.5,
        le=0.98,
        description="`--gpu-memory-utilization`: share of each GPU's memory vLLM may use.",
    )
    max_num_batched_tokens: Optional[int] = Field(
        default=None,
        ge=64,
        le=1_048_576,
        description="`--max-num-batched-tokens`; null = vLLM's default for the GPU.",
    )
    max_num_seqs: Optional[int] = Field(
        default=None, ge=1, le=65_536, description="`--max-num-seqs`; null = derived from KV capacity."
    )
    kv_cache_dtype: Optional[KvCacheDtype] = Field(
        default=None,
        description="`--kv-cache-dtype`; null = the model's own (`auto`), FP8 only if that does not fit.",
    )
    objective: Objective = Field(
        default="max-kv",
        description="Layout search goal: `max-kv` (most KV cache on the given nodes) "
        "or `min-cost` (fewest GPUs that reach `targetConcurrency`).",
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
        description="vLLM release of the serving image (`images/vllm/Dockerfile` builds on `vllm/vllm-openai:v<version>`).",
        json_schema_extra={"allowed": "a release such as 0.34.0"},
    )
    ray_version: str = Field(
        default="2.60.0",
        pattern=r"^\d+\.\d+\.\d+$",
        description="Ray release installed in the serving image and set as the RayCluster's `rayVersion`.",
        json_schema_extra={"allowed": "a release such as 2.60.0"},
    )
    image: Optional[str] = Field(
        default=None,
        min_length=1,
        description="Serving image (vLLM with Ray); null = the stack's ECR repository at tag `<vllmVersion>-ray<rayVersion>`, "
        "built and pushed with `bin/build-image`.",
        json_schema_extra={"allowed": "an image reference with a tag or digest, or null"},
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
    monitoring: Literal["podmonitor", "annotations"] = Field(
        default="annotations",
        description="How Prometheus finds the vLLM and DCGM metrics: a PodMonitor (needs the Prometheus operator's CRDs) or scrape annotations.",
    )

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
        description="EFA check: the EFA provider is visible and an NCCL all-reduce across nodes reaches the floor "
        "(needs free GPU nodes: run it at bring-up or in a maintenance window).",
    )
    nccl_bus_bandwidth_floor_gbps: float = Field(
        default=100.0, gt=0, le=10_000, description="Lowest acceptable NCCL all-reduce bus bandwidth across nodes, GB/s."
    )
    benchmark: StrictBool = Field(
        default=False, description="Serving benchmark (`vllm bench serve` against the Service) after deploy."
    )
    ttft_p99_ms: float = Field(default=250.0, gt=0, le=600_000, description="Benchmark threshold: p99 time to first token, ms.")
    tpot_p99_ms: float = Field(default=40.0, gt=0, le=60_000, description="Benchmark threshold: p99 time per output token, ms.")


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
        description="Measured cluster output tokens/s, for the cost per token; null = not known yet.",
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
}

# Secrets live in their own keys, set with `pulumi config set --secret`; the
# program reads them with Config.require_secret / get_secret so they stay
# secret end to end, and the offline tools never decrypt them.
SECRET_KEYS = {"hfToken": "Hugging Face token for the weight-staging Job (gated or private models)"}


class StackConfig(BaseModel):
    """The whole config of one stack."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str = Field(min_length=1, description="Stack name (e.g. `prod`).")
    region: str = Field(
        default=DEFAULT_REGION,
        pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]+$",
        description="`aws:region`: the AWS region to deploy into.",
        json_schema_extra={"allowed": "an AWS region name such as us-east-1"},
    )
    model: ModelConfig
    gpu: GpuConfig
    serving: ServingConfig = Field(default_factory=ServingConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    lifecycle: LifecycleConfig
    storage: StorageConfig = Field(default_factory=StorageConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)

    @model_validator(mode="before")
    @classmethod
    def _lifecycle_defaults(cls, data: Any) -> Any:
        # No lifecycle area: a non-production stack, so the message points at expiresAt.
        if isinstance(data, dict) and "lifecycle" not in data:
            data = {**data, "lifecycle": {}}
        return data

    @model_validator(mode="after")
    def _across_areas(self) -> "StackConfig":
        from infra.catalog.instances import INSTANCE_TYPES

        if self.gpu.instance_type not in INSTANCE_TYPES:
            raise PydanticCustomError(
                "unknown_instance_type",
                "unknown instance type '{name}'; known instance types: {known}",
                {"loc": ("gpu", "instanceType"), "name": self.gpu.instance_type, "known": ", ".join(sorted(INSTANCE_TYPES))},
            )
        if self.gpu.capacity.type != "on-demand" and self.network.placement_group:
            raise PydanticCustomError(
                "placement_with_reservation",
                "placementGroup is true but capacity type is '{kind}': a reservation or Capacity Block already "
                "fixes placement, and launching it into a placement group fails; set placementGroup to false or null",
                {"loc": ("network", "placementGroup"), "kind": self.gpu.capacity.type},
            )
        if self.storage.type == "fsx" and not self.cluster.fsx_csi:
            raise PydanticCustomError(
                "fsx_needs_driver",
                "storage type is 'fsx' but the FSx for Lustre CSI driver is off; set gpu-serving:cluster.fsxCsi to true",
                {"loc": ("storage", "type")},
            )
        pp = self.serving.pipeline_parallel
        if pp and self.gpu.nodes < pp:
            raise PydanticCustomError(
                "nodes_below_pipeline",
                "nodes = {nodes} is below pipelineParallel = {pp}: each pipeline stage runs on its own node; "
                "give at least {pp} nodes or a smaller pipelineParallel",
                {"loc": ("gpu", "nodes"), "nodes": self.gpu.nodes, "pp": pp},
            )
        return self

    @property
    def placement_group(self) -> bool:
        """Whether GPU nodes go in a cluster placement group (see NetworkConfig.placement_group)."""
        if self.network.placement_group is None:
            return self.gpu.capacity.type == "on-demand"
        return self.network.placement_group

    def plan_request(self) -> PlanRequest:
        """The planner's input for this stack."""
        s, c = self.serving, self.cost
        return PlanRequest(
            model=self.model.name,
            instance_type=self.gpu.instance_type,
            # min-cost: the planner finds the fewest nodes that hold the target, up to `nodes`.
            nodes=None if s.objective == "min-cost" else self.gpu.nodes,
            max_nodes=self.gpu.nodes if s.objective == "min-cost" else None,
            tp=s.tensor_parallel,
            pp=s.pipeline_parallel,
            expert_parallel=s.expert_parallel,
            dp=s.data_parallel,
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
            kv_cache_dtype=s.kv_cache_dtype,
            weight_format=self.model.weight_format,
            objective=s.objective,
            target_concurrency=s.target_concurrency,
            cold_start_target_s=s.cold_start_target_seconds,
            tco=TcoInputs(categories=dict(c.tco)) if c.tco is not None else None,
            api_price_usd_per_mtok=c.api_price_usd_per_million_tokens,
            throughput_tokens_per_s=c.throughput_tokens_per_second,
        )


# --------------------------------------------------------------------------- loading


def stack_file_name(stack: str) -> str:
    """`Pulumi.<stack>.yaml`; a fully qualified `org/project/stack` uses its last part."""
    return f"Pulumi.{stack.rsplit('/', 1)[-1]}.yaml"


def read_stack_file(stack: str, root: Path | None = None) -> dict[str, Any]:
    """The raw `config:` mapping of `Pulumi.<stack>.yaml` (keys like `gpu-serving:gpu`)."""
    root = Path(root) if root is not None else REPO_ROOT
    name = stack_file_name(stack)
    path = root / name
    if not path.is_file():
        present = sorted(p.name for p in root.glob("Pulumi.*.yaml"))
        stacks = ", ".join(p[len("Pulumi.") : -len(".yaml")] for p in present) or "none"
        raise UserError(
            f"no stack file {name} for stack {stack!r} in {root}; "
            f"stack files present: {', '.join(present) or 'none'} (stacks: {stacks})"
        )
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{name} is not valid YAML{where}: {problem}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise UserError(f"{name} must be a mapping with a 'config:' key, not {type(doc).__name__}")
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise UserError(f"{name}: 'config:' must be a mapping of key -> value")
    return config


def engine_config(stack: str, root: Path | None = None) -> dict[str, str]:
    """The config map the Pulumi CLI hands the program for `Pulumi.<stack>.yaml`.

    Strings pass as they are; objects, numbers and booleans are JSON-encoded (as
    the CLI does), which is what `pulumi.Config.get_object` decodes. Used to run
    the program under mocks with a stack's real config.
    """
    out: dict[str, str] = {}
    for key, value in read_stack_file(stack, root).items():
        out[str(key)] = value if isinstance(value, str) else json.dumps(value)
    return out


def load_stack_file(stack: str, root: Path | None = None) -> StackConfig:
    """Load and validate `Pulumi.<stack>.yaml` from `root` (default: the repository)."""
    config = read_stack_file(stack, root)
    source = stack_file_name(stack)
    areas: dict[str, Any] = {}
    region: Any = None
    for key, value in config.items():
        key = str(key)
        if ":" not in key:
            raise UserError(
                f"{source}: config key {key!r} has no namespace; write it as {PROJECT}:{key}"
            )
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            region = value
        elif namespace == PROJECT and name in SECRET_KEYS:
            if not (isinstance(value, dict) and set(value) == {"secure"}):
                raise UserError(f"{source}: {key} must be a secret: set it with `pulumi config set --secret {key}`")
            # Never decrypted offline; the program reads it as a secret Output.
        elif namespace == PROJECT:
            if isinstance(value, dict) and set(value) == {"secure"}:
                raise UserError(f"{source}: {key} is a secret; whole-area secrets are not supported")
            areas[name] = value
        # Keys of other namespaces (aws:profile, kubernetes:..., etc.) belong to providers.
    return from_mapping(stack, areas, region=region, source=source)


def from_pulumi_config() -> StackConfig:
    """Load and validate the config of the running Pulumi stack."""
    import pulumi

    stack = pulumi.get_stack()
    source = stack_file_name(stack)
    cfg = pulumi.Config(PROJECT)
    areas: dict[str, Any] = {}
    for name in [*AREAS, *(n for n in _project_config_areas() if n not in AREAS and n not in SECRET_KEYS)]:
        try:
            value = cfg.get_object(name)
        except pulumi.ConfigTypeError:
            if name in AREAS:
                raise UserError(f"{source}: {PROJECT}:{name} must be an object of keys") from None
            value = cfg.get(name)  # a plain value under an unknown name: reported below
        if value is not None:
            areas[name] = value
    region = pulumi.Config("aws").get("region")
    return from_mapping(stack, areas, region=region, source=source)


def secret(name: str):
    """A secret config value as a secret `pulumi.Output[str]`, or None when unset.

    Refuses a value that was set in plain text (it would sit unencrypted in the
    stack file and in the state).
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    if name not in SECRET_KEYS:
        raise KeyError(name)
    key = f"{PROJECT}:{name}"
    value = pulumi.Config(PROJECT).get_secret(name)
    if value is not None and not runtime_config.is_config_secret(key):
        raise UserError(f"{key} is set in plain text; set it with `pulumi config set --secret {key}`")
    return value


def _project_config_areas() -> list[str]:
    """Names of all `gpu-serving:*` keys the engine passed in (to catch misspelt areas)."""
    try:
        from pulumi.runtime import config as runtime_config

        keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    except Exception:  # noqa: BLE001 - best effort: older/newer SDKs may differ
        return []
    prefix = PROJECT + ":"
    return sorted(k[len(prefix) :] for k in keys if k.startswith(prefix))


def from_mapping(
    stack: str,
    areas: dict[str, Any],
    region: Any = None,
    source: str | None = None,
) -> StackConfig:
    """Validate a mapping of area name -> object (the values of `gpu-serving:<area>`)."""
    source = source or stack_file_name(stack)
    unknown = [name for name in areas if name not in AREAS]
    if unknown:
        msgs = [_unknown_key_message((name,), list(AREAS), area_level=True) for name in unknown]
        raise _user_error(source, msgs)
    data: dict[str, Any] = {"stack": stack, **{k: v for k, v in areas.items() if v is not None}}
    if region is not None:
        data["region"] = region
    try:
        return StackConfig.model_validate(data)
    except ValidationError as exc:
        raise _user_error(source, [_error_message(e, data) for e in exc.errors()]) from None


# --------------------------------------------------------------------------- messages


def key_path(loc: tuple) -> str:
    """`('serving', 'gpuMemoryUtilization')` -> `gpu-serving:serving.gpuMemoryUtilization`."""
    if not loc:
        return f"{PROJECT} config"
    head, rest = str(loc[0]), [str(p) for p in loc[1:]]
    if head == "region":
        return "aws:region"
    if head == "stack":
        return "stack name"
    return ".".join([f"{PROJECT}:{head}", *rest])


def _user_error(source: str, messages: list[str]) -> UserError:
    if len(messages) == 1:
        return UserError(f"{source}: {messages[0]}")
    lines = "\n".join(f"  - {m}" for m in messages)
    return UserError(f"{source} has {len(messages)} config errors:\n{lines}")


def _unknown_key_message(loc: tuple, known: list[str], area_level: bool = False) -> str:
    bad = str(loc[-1])
    close = difflib.get_close_matches(bad, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    where = "areas" if area_level else f"keys of {key_path(loc[:-1])}"
    path = f"{PROJECT}:{bad}" if area_level else key_path(loc)
    return f"unknown key {path}{hint} (known {where}: {', '.join(known)})"


def _error_message(err: dict, data: dict) -> str:
    loc = tuple(err["loc"])
    typ = err["type"]
    owner, field = _resolve(loc)
    if typ == "extra_forbidden":
        known = [_alias(owner, n) for n in owner.model_fields] if owner is not None else []
        return _unknown_key_message(loc, known)
    if typ == "required_for_objective":
        key = err.get("ctx", {}).get("key", "")
        area = AREAS.get(str(loc[0])) if loc else None
        name = _field_name(area, key)
        fi = area.model_fields[name] if area is not None and name is not None else None
        allowed = f" ({describe_allowed(fi, nullable=False)})" if fi is not None else ""
        return f"{key_path(loc + (key,))} is {err['msg']}{allowed}"
    ctx = err.get("ctx") or {}
    if typ in _CROSS_CHECKS:
        # Our own checks: the key they are about is in the context.
        where = tuple(ctx["loc"]) if "loc" in ctx else loc + ((ctx["key"],) if "key" in ctx else ())
        if where and where[-1] in ("gpuAvailabilityZone", "gpu_availability_zone", "existingGpuSubnetId", "existing_gpu_subnet_id") and loc and loc[-1] == where[-1]:
            where = loc
        return f"{key_path(where)}: {err['msg']}"
    path = key_path(loc)
    if typ == "missing":
        allowed = f" ({describe_allowed(field)})" if field is not None else ""
        return f"{path} is required{allowed}"
    got = _value_at(data, loc)
    if field is not None and _nested_model(field) is not None and typ in _NOT_AN_OBJECT:
        return f"{path} must be an object of keys, got {got!r}"
    allowed = f"; allowed: {describe_allowed(field)}" if field is not None else ""
    if typ in _OUT_OF_RANGE:
        return f"{path} = {got!r} is out of range{allowed}"
    if typ in _NOT_ALLOWED:
        return f"{path} = {got!r} is not allowed{allowed}"
    msg = err["msg"]
    msg = msg[0].lower() + msg[1:] if msg else msg
    return f"{path} = {got!r}: {msg}{allowed}"


_OUT_OF_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_CROSS_CHECKS = {
    "required_for_capacity", "reservation_without_type", "one_gpu_zone", "existing_vpc_needs_subnets",
    "gpu_zone_not_listed", "unknown_instance_type", "placement_with_reservation", "nodes_below_pipeline",
    "fsx_needs_driver",
}  # fmt: skip
_NOT_ALLOWED = {"literal_error", "string_pattern_mismatch", "string_too_short", "enum"}
_NOT_AN_OBJECT = {"model_type", "model_attributes_type", "dict_type"}


def _resolve(loc: tuple) -> tuple[type[BaseModel] | None, Any]:
    """The model owning the last key of `loc` and that key's FieldInfo (or None).

    Inside a mapping value (e.g. `cost.tco.<category>`) the field holding the
    mapping is returned.
    """
    model: type[BaseModel] | None = StackConfig
    owner: type[BaseModel] | None = None
    field = None
    for part in loc:
        if model is None:
            break
        owner = model
        name = _field_name(model, str(part))
        if name is None:
            return owner, None
        field = model.model_fields[name]
        model = _nested_model(field)
    return owner, field


def _nested_model(field: Any) -> type[BaseModel] | None:
    for a in _flatten(field.annotation):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _field_name(model: type[BaseModel] | None, key: str) -> str | None:
    if model is None:
        return None
    for name, fi in model.model_fields.items():
        if key == name or key == fi.alias:
            return name
    return None


def _alias(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].alias or name


def _value_at(data: Any, loc: tuple) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def _flatten(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _flatten(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(_flatten(arg))
        return out
    return [annotation]


def _number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _bounds_text(kind: str, metadata: list[Any]) -> str:
    lo = hi = None
    lo_strict = hi_strict = False
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo, lo_strict = m.gt, True
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi, hi_strict = m.lt, True
    if lo is not None and hi is not None and not lo_strict and not hi_strict:
        return f"{kind} from {_number(lo)} to {_number(hi)}"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_strict else '>='} {_number(lo)}")
    if hi is not None:
        parts.append(f"{'<' if hi_strict else '<='} {_number(hi)}")
    return f"{kind} {' and '.join(parts)}" if parts else kind


def describe_type(field: Any) -> str:
    """Short type name for the reference table: `int`, `float | null`, `bool | null`, ..."""
    names = []
    for a in _flatten(field.annotation):
        if a is type(None):
            continue
        origin = typing.get_origin(a)
        if origin is Literal:
            names.append("string")
        elif origin is dict:
            names.append("map of string -> float")
        elif origin is list:
            names.append("list of string")
        elif a is bool:
            names.append("bool")
        elif a is int:
            names.append("int")
        elif a is float:
            names.append("float")
        elif a is str:
            names.append("string")
        else:
            names.append(getattr(a, "__name__", str(a)))
    if type(None) in _flatten(field.annotation):
        names.append("null")
    return " \\| ".join(names)


def describe_allowed(field: Any, nullable: bool = True) -> str:
    """What values a field takes, in words (used in error messages and the README)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "allowed" in extra:
        return str(extra["allowed"])
    nested = _nested_model(field)
    if nested is not None:
        required = [f.alias or n for n, f in nested.model_fields.items() if f.is_required()]
        if not required:
            return "an object of keys"
        return f"an object with at least the keys {', '.join(required)}"
    options = _flatten(field.annotation)
    nullable = nullable and type(None) in options
    options = [o for o in options if o is not type(None)]
    text = ""
    for o in options:
        if typing.get_origin(o) is Literal:
            text = "one of " + ", ".join(repr(v) for v in typing.get_args(o))
        elif o is bool:
            text = "true or false"
        elif o is int:
            text = _bounds_text("an integer", field.metadata)
        elif o is float:
            text = _bounds_text("a number", field.metadata)
        elif o is str:
            text = "a non-empty string"
    if nullable:
        text += ", or null"
    return text


def describe_default(field: Any) -> str:
    if field.is_required():
        return "required"
    d = field.get_default(call_default_factory=True)
    if d is None:
        return "null"
    if isinstance(d, str):
        return f"`{d}`"
    return f"`{d:g}`" if isinstance(d, float) else f"`{d}`"


def reference_markdown() -> str:
    """The config reference as Markdown tables, one per area (the README carries this)."""
    out: list[str] = []
    for area, model in AREAS.items():
        out.append(f"#### `{PROJECT}:{area}`\n")
        out.append("| key | type | default | range | meaning |")
        out.append("|---|---|---|---|---|")
        for name, fi in model.model_fields.items():
            nested = _nested_model(fi)
            rows = [(f"{fi.alias}.{sub.alias}", sub) for sub in nested.model_fields.values()] if nested else [(fi.alias, fi)]
            for key, f in rows:
                out.append(
                    f"| `{key}` | {describe_type(f)} | {describe_default(f)} | "
                    f"{describe_allowed(f)} | {f.description} |"
                )
        out.append("")
    out.append("#### Secrets (`pulumi config set --secret <key> <value>`)\n")
    out.append("| key | meaning |")
    out.append("|---|---|")
    for name, meaning in SECRET_KEYS.items():
        out.append(f"| `{PROJECT}:{name}` | {meaning} |")
    out.append("")
    region = StackConfig.model_fields["region"]
    out.append("#### `aws:region`\n")
    out.append("| key | type | default | range | meaning |")
    out.append("|---|---|---|---|---|")
    out.append(
        f"| `aws:region` | string | {describe_default(region)} | {describe_allowed(region)} | "
        f"{region.description} |"
    )
    return "\n".join(out) + "\n"
