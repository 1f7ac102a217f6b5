"""`StackConfig`: the whole config of one stack, the checks across its areas, the planner's request."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from datetime import date

from infra.catalog.capacity import creates_placement_group
from infra.catalog.eks import AL2023, ami_family
from infra.catalog.eks_versions import al2023_release, default_version as default_kubernetes_version
from infra.config.areas import (
    PRIVATE_VPC,
    PUBLIC_RESTRICTED,
    ChecksConfig,
    ClusterConfig,
    CostConfig,
    GpuConfig,
    LifecycleConfig,
    ModelConfig,
    NetworkConfig,
    ServingConfig,
    StorageConfig,
)
from infra.config.monitoring import MonitoringConfig
from infra.planning.performance import Sla
from infra.planning.request import PlanRequest, TcoInputs
from infra.planning.system_nodes import SystemNodes

DEFAULT_REGION = "us-east-1"


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
    aws_profile: Optional[str] = Field(
        default=None,
        min_length=1,
        description="`aws:profile`: the AWS CLI profile the AWS provider and the kubeconfig's `aws eks get-token` use; "
        "unset: the standard credential chain.",
        json_schema_extra={"allowed": "a profile name of ~/.aws/config"},
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
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)

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
        if self.network.placement_group and not creates_placement_group(self.gpu.capacity.type):
            raise PydanticCustomError(
                "placement_with_reservation",
                "placementGroup is true but capacity type is '{kind}': a reservation or Capacity Block only launches "
                "into the placement group it was made in, never into a new one; set placementGroup to null and, when "
                "the reservation is in a placement group, name it in placementGroupName (pre-flight shows it)",
                {"loc": ("network", "placementGroup"), "kind": self.gpu.capacity.type},
            )
        if self.network.placement_group and self.network.placement_group_name:
            raise PydanticCustomError(
                "placement_with_reservation",
                "placementGroup is true and placementGroupName is set: the nodes go either into a new placement "
                "group or into the named one; set placementGroup to null to use '{name}'",
                {"loc": ("network", "placementGroup"), "name": self.network.placement_group_name},
            )
        self._check_endpoint_access()
        if ami_family(self.gpu.ami_type) != AL2023 and not self.gpu.ami_release_version:
            raise PydanticCustomError(
                "required_for_capacity",
                "required with amiType '{ami}': only AL2023 releases are pinned in infra/catalog/eks_versions.py; "
                "read the current one with `aws ssm get-parameter --name "
                "/aws/service/bottlerocket/aws-k8s-<version>-nvidia/x86_64/latest/image_version`",
                {"loc": ("gpu", "amiReleaseVersion"), "ami": self.gpu.ami_type},
            )
        net = self.network
        for key, zones in (("availabilityZones", net.availability_zones or []), ("gpuAvailabilityZone", [net.gpu_availability_zone] if net.gpu_availability_zone else [])):
            outside = [z for z in zones if not (z.startswith(self.region) and len(z) > len(self.region) and z[len(self.region):].isalpha())]
            if outside and not net.existing_vpc_id:
                raise PydanticCustomError(
                    "zone_outside_region",
                    "{zones} is not a zone of aws:region {region}; zones of {region} look like {region}a",
                    {"loc": ("network", key), "zones": ", ".join(outside), "region": self.region},
                )
        if self.storage.type == "fsx" and not self.cluster.fsx_csi:
            raise PydanticCustomError(
                "fsx_needs_driver",
                "storage type is 'fsx' but the FSx for Lustre CSI driver is off; set gpu-serving:cluster.fsxCsi to true",
                {"loc": ("storage", "type")},
            )
        image = self.serving.image
        if image and self.lifecycle.production and "@sha256:" not in image:
            raise PydanticCustomError(
                "image_by_tag",
                "'{image}' names the serving image by tag alone, which can be re-pushed; a production stack runs "
                "it by digest: give '{image}@sha256:<digest>' (`docker buildx imagetools inspect {image}` prints "
                "it), or null for the image bin/build-image pushes",
                {"loc": ("serving", "image"), "image": image},
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

    def _check_endpoint_access(self) -> None:
        """Every endpoint mode must leave the deployer a way in (see ClusterConfig.endpoint_access)."""
        cl, net = self.cluster, self.network
        mode, cidrs = cl.endpoint_access, list(cl.deployer_cidrs)
        where = {"loc": ("cluster", "endpointAccess"), "mode": mode}
        if mode == PUBLIC_RESTRICTED:
            if not cidrs:
                raise PydanticCustomError(
                    "endpoint_unreachable",
                    "'{mode}' with no deployerCidrs: the public endpoint would admit no one, so `pulumi up` could not "
                    "reach the Kubernetes layer; list the CIDRs `pulumi up` runs from in gpu-serving:cluster.deployerCidrs "
                    "(e.g. your egress IP as a /32), or use endpointAccess: private-ssm",
                    where,
                )
            open_ = [c for c in cidrs if c.endswith("/0")]
            if open_ and self.lifecycle.production:
                raise PydanticCustomError(
                    "endpoint_unreachable",
                    "{cidrs} opens the API endpoint of a production cluster to the whole internet; list the deployer's "
                    "own CIDRs (a VPN or CI egress range), or use endpointAccess: private-ssm",
                    {"loc": ("cluster", "deployerCidrs"), "cidrs": ", ".join(open_)},
                )
        elif mode == PRIVATE_VPC:
            if not net.existing_vpc_id:
                raise PydanticCustomError(
                    "endpoint_unreachable",
                    "'{mode}' makes the API private, but the stack creates its own VPC and nothing that runs `pulumi up` "
                    "is inside it: every Kubernetes resource (Helm releases, the weights volume, the RayCluster) would "
                    "time out, and so would destroy; use endpointAccess: private-ssm (a bastion the stack creates, "
                    "reached through SSM port forwarding), public-restricted with deployerCidrs, or set "
                    "gpu-serving:network.existingVpcId to the VPC your runner or VPN is in",
                    where,
                )
            if not cidrs:
                raise PydanticCustomError(
                    "endpoint_unreachable",
                    "'{mode}' with no deployerCidrs: the cluster security group admits 443 only from itself; list the "
                    "in-VPC CIDRs of the runner or VPN that runs `pulumi up` in gpu-serving:cluster.deployerCidrs",
                    where,
                )
        elif cidrs:  # private-ssm: the deployer comes in through the bastion, from anywhere SSM reaches
            raise PydanticCustomError(
                "endpoint_unreachable",
                "deployerCidrs is set but endpointAccess is '{mode}', which takes no CIDRs (the way in is the SSM "
                "tunnel through the stack's bastion); remove deployerCidrs, or use public-restricted or private-vpc",
                {"loc": ("cluster", "deployerCidrs"), "mode": mode},
            )

    @property
    def placement_group(self) -> bool:
        """Whether the stack creates a cluster placement group for the GPU nodes (see NetworkConfig.placement_group)."""
        if self.network.placement_group_name:
            return False
        if self.network.placement_group is None:
            return creates_placement_group(self.gpu.capacity.type)
        return self.network.placement_group

    def kubernetes_version(self, day: date) -> str:
        """The cluster's Kubernetes version: the config's, else the default on `day` (infra/catalog/eks_versions.py)."""
        return self.cluster.kubernetes_version or default_kubernetes_version(day)

    def ami_release_version(self, day: date) -> str:
        """The GPU nodes' AMI release: the config's, else the AL2023 release pinned for the Kubernetes version."""
        return self.gpu.ami_release_version or al2023_release(self.kubernetes_version(day))

    def system_ami_release_version(self, day: date) -> str:
        """The system nodes' (AL2023) AMI release: the GPU nodes' when they run AL2023 too, else the pinned one."""
        if ami_family(self.gpu.ami_type) == AL2023:
            return self.ami_release_version(day)
        return al2023_release(self.kubernetes_version(day))

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
            async_scheduling=s.async_scheduling,
            vllm_version=s.vllm_version,
            speculative_method=s.speculative.method if s.speculative else None,
            num_speculative_tokens=s.speculative.num_speculative_tokens if s.speculative and s.speculative.method != "off" else None,
            weight_format=self.model.weight_format,
            objective=s.objective,
            target_concurrency=s.target_concurrency,
            cold_start_target_s=s.cold_start_target_seconds,
            storage_kind=self.storage.type,
            tco=TcoInputs(categories=dict(c.tco)) if c.tco is not None else None,
            api_price_usd_per_mtok=c.api_price_usd_per_million_tokens,
            throughput_tokens_per_s=c.throughput_tokens_per_second,
            sla=Sla(s.sla.ttft_p99_ms, s.sla.tpot_p99_ms, s.sla.itl_p99_ms),
            workload=s.workload.spec(),
            duty_cycle=c.duty_cycle,
            predict_benchmark=self.checks.benchmark,
            system=SystemNodes(self.cluster.system_instance_type, self.cluster.system_node_count,
                               self.monitoring.retention_days if self.monitoring.deployed else None, self.monitoring.mode),
        )
