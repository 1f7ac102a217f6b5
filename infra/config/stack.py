"""`StackConfig`: the whole config of one stack, the checks across its areas, the planner's request."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from infra.catalog.capacity import takes_placement_group
from infra.config.areas import (
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
from infra.planning.request import PlanRequest, TcoInputs

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
        if self.network.placement_group and not takes_placement_group(self.gpu.capacity.type):
            raise PydanticCustomError(
                "placement_with_reservation",
                "placementGroup is true but capacity type is '{kind}': a reservation or Capacity Block already "
                "fixes placement, and launching it into a placement group fails; set placementGroup to false or null",
                {"loc": ("network", "placementGroup"), "kind": self.gpu.capacity.type},
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
            return takes_placement_group(self.gpu.capacity.type)
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
            async_scheduling=s.async_scheduling,
            vllm_version=s.vllm_version,
            speculative_method=s.speculative.method if s.speculative else None,
            num_speculative_tokens=s.speculative.num_speculative_tokens if s.speculative else None,
            weight_format=self.model.weight_format,
            objective=s.objective,
            target_concurrency=s.target_concurrency,
            cold_start_target_s=s.cold_start_target_seconds,
            tco=TcoInputs(categories=dict(c.tco)) if c.tco is not None else None,
            api_price_usd_per_mtok=c.api_price_usd_per_million_tokens,
            throughput_tokens_per_s=c.throughput_tokens_per_second,
        )
