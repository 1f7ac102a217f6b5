"""Pure planning: memory per rank, layout search, serving parameters, cost.

Imports nothing from Pulumi: usable from a notebook or a CLI with no cloud.
"""

from infra.planning.plan import Plan, make_plan
from infra.planning.request import PlanRequest, TcoInputs

__all__ = ["Plan", "PlanRequest", "TcoInputs", "make_plan"]
