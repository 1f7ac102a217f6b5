"""How long the planner's searches take (pytest-benchmark; not part of the unit tests).

    venv/bin/python -m pytest benchmarks/ --benchmark-only

Target: the full search over the instance catalog for one model, i.e. every
instance type x node count x layout (and, for models with sliding-window or
state groups, the batch knobs the search tunes), in under a second.
"""

from __future__ import annotations

from infra.catalog.instances import INSTANCE_TYPES
from infra.catalog.models import load_model
from infra.planning import PlanRequest, make_plan
from infra.planning.plan import MAX_SEARCH_NODES, _knobs, search


def _full_catalog_search(model: str) -> int:
    """Every instance type in the catalog, every node count up to the search limit."""
    arch = load_model(model)
    req = PlanRequest(model=model, instance_type=None, nodes=None, max_model_len=131072)
    tried = 0
    for itype in INSTANCE_TYPES.values():
        knobs = _knobs(req, arch, itype)
        for nodes in range(1, MAX_SEARCH_NODES + 1):
            tried += len(search(req, arch, itype, nodes, knobs))
    return tried


SEARCH_BUDGET_S = 1.0


def test_full_catalog_search_deepseek_v4_pro(benchmark):
    tried = benchmark(_full_catalog_search, "deepseek-v4-pro")
    assert tried > 100
    assert benchmark.stats.stats.mean < SEARCH_BUDGET_S


def test_full_catalog_search_kimi_k3(benchmark):
    tried = benchmark(_full_catalog_search, "kimi-k3")
    assert tried > 100
    assert benchmark.stats.stats.mean < SEARCH_BUDGET_S


def test_prod_plan(benchmark):
    req = PlanRequest(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4, max_model_len=131072)
    plan = benchmark(make_plan, req)
    assert plan.feasible


# Issue target: the SLA search for prod (every layout and batch knob it simulates, the
# capacity and request rate of the winner, the benchmark Job's prediction) under 3 s on
# 2 cores. Each round starts with the capacity memo empty, as a fresh `bin/plan` does.
SLA_SEARCH_BUDGET_S = 3.0


def _prod_sla_plan():
    from pathlib import Path

    from infra.config import load_stack_file
    from infra.planning import sla_search

    sla_search._CAPACITIES.clear()
    sla_search._RATES.clear()
    return make_plan(load_stack_file("prod", Path(__file__).resolve().parents[1]).plan_request())


def test_prod_sla_search(benchmark):
    plan = benchmark.pedantic(_prod_sla_plan, rounds=2, iterations=1)
    assert plan.performance.concurrency > 0
    assert benchmark.stats.stats.mean < SLA_SEARCH_BUDGET_S
