"""How long the performance model takes (pytest-benchmark; not part of the unit tests).

    venv/bin/python -m pytest benchmarks/test_perf_speed.py --benchmark-only

Targets (issue: the planner searches thousands of layouts, so the model must answer
in microseconds per step): one step-time evaluation of prod's layout (DeepSeek-V4-Pro,
4 x p5.48xlarge, TP 8 x PP 4, all four stages) under 50 us, and prod's curve at 8
concurrencies under 2 s, on 2 cores.
"""

from __future__ import annotations

from infra.catalog.instances import get_instance_type
from infra.catalog.models import load_model
from infra.planning.perf import predict
from infra.planning.perf.hardware import for_instance
from infra.planning.perf.workload import Workload

STEP_BUDGET_S = 50e-6
CURVE_BUDGET_S = 2.0
CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128)


def _prod() -> predict.Setup:
    hw = for_instance(get_instance_type("p5.48xlarge"))
    return predict.setup(load_model("deepseek-v4-pro"), hw, predict.Serving(tp=8, pp=4, max_model_len=131072,
                                                                             gpu_memory_utilization=0.90))


def test_one_step_of_prods_layout(benchmark):
    step = _prod().step
    contexts = [1200 + 37 * i for i in range(64)]
    times = benchmark(step.stage_seconds, contexts, [(512, 0)], 1)
    assert len(times) == 4
    assert benchmark.stats.stats.mean < STEP_BUDGET_S


def _curve(s: predict.Setup) -> list:
    load = Workload.fixed(1024, 256)
    return [predict.run(s, load, concurrency=c, request_rate=None, num_prompts=max(100, 10 * c)) for c in CONCURRENCIES]


def test_prods_curve_at_eight_concurrencies(benchmark):
    s = _prod()
    results = benchmark.pedantic(_curve, args=(s,), rounds=3, iterations=1)
    assert len(results) == len(CONCURRENCIES)
    assert benchmark.stats.stats.mean < CURVE_BUDGET_S
