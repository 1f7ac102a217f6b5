"""What the components receive from the plan: small frozen dataclasses, no JSON.

The plan crosses into the Pulumi components as these types (JSON appears only
at the edges: stack exports and the command line), so a renamed field fails at
import or in a type check, not at deploy time. `Plan.deployment()` builds one
for a plan that fits and names a checkpoint, and refuses any other plan with
the reason: a component is never handed a plan it cannot serve.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.planning.serving import PodResources, Storage
from infra.planning.startup import Startup


@dataclass(frozen=True)
class GpuNodes:
    """The GPU node group the plan needs."""

    instance_type: str
    count: int
    gpus_per_node: int
    efa_interfaces: int  # per node: the launch template declares every one
    root_volume_gib: int


@dataclass(frozen=True)
class ServeCommand:
    """What `vllm serve` runs: the checkpoint and the plan's arguments."""

    checkpoint: str  # Hugging Face repository of the weights; also the served model name
    vllm_args: tuple[str, ...]


@dataclass(frozen=True)
class Deployment:
    """Every figure the cloud and serving layers take from the plan."""

    nodes: GpuNodes
    pod: PodResources  # one Ray pod per GPU node, owning it
    ray_start_params: tuple[tuple[str, str], ...]  # `ray start` parameters, in order
    storage: Storage
    startup: Startup  # the head's start: cold-start estimate, probe budget, Pulumi's wait, vLLM's timeouts
    serve: ServeCommand

    @property
    def total_gpus(self) -> int:
        return self.nodes.count * self.nodes.gpus_per_node
