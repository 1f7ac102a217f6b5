"""The performance model against published measurements.

Rows come from `tests/fixtures/perf/measurements.jsonl` (each with its source and
its role: "fit" rows set the fitted fractions of `fitted.py`, "validate" rows only
judge them). Every row is re-run as the source ran it: the same model, GPU,
layout, server flags, lengths and load, through the same `predict.setup` and
scheduler simulation the `perf` command uses. Errors are (predicted - measured) /
measured on the means `vllm bench serve` prints.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from itertools import product
from dataclasses import dataclass, fields, replace
from pathlib import Path

from infra.catalog.models import load_model
from infra.errors import UserError
from infra.planning.perf import predict, published_error
from infra.planning.perf.fitted import BURST_FITTED_FIELDS, DEFAULT, FIT_BOUNDS, FITTED_FIELDS, Efficiency
from infra.planning.perf.hardware import for_gpu
from infra.planning.perf.workload import Workload
from infra.planning.vllm_release import FIRST_SUPPORTED, PINNED, _minor

# The models the rows name, by Hugging Face id: a catalog name, or a config.json kept
# beside the measurements (tests/fixtures/perf/models/, sources in its SOURCES.md).
# The -2507 Instruct releases share the architecture of the catalog's Qwen3-235B-A22B.
MODELS = {
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-r1",
    "deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "openai/gpt-oss-20b": "models/openai--gpt-oss-20b.json",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "qwen3-235b-a22b-fp8",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-32B-AWQ": "qwen3-32b-awq",
    "Qwen/Qwen3-32B": "models/Qwen--Qwen3-32B.json",
    "Qwen/Qwen3-32B-FP8": "models/Qwen--Qwen3-32B-FP8.json",
    "Qwen/Qwen3-8B": "models/Qwen--Qwen3-8B.json",
    "Qwen/Qwen3-14B": "models/Qwen--Qwen3-14B.json",
}

METRICS = ("ttft_ms", "tpot_ms", "output_tokens_per_s")
# The targets on the validation rows: median |error| and the worst ratio.
TARGETS = {"ttft_ms": 0.30, "tpot_ms": 0.15, "output_tokens_per_s": 0.15}
WORST_RATIO = 2.0


@dataclass(frozen=True)
class Point:
    id: str
    role: str
    predicted: dict
    measured: dict
    refused: str = ""  # why the model could not be set up as the source ran it (the memory plan's refusal)
    family: str = ""  # published_error.family of the model's model_type (of predicted rows)

    def error(self, metric: str) -> float | None:
        p, m = self.predicted.get(metric), self.measured.get(metric)
        return None if p is None or not m else (p - m) / m


def load_rows(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise UserError(f"cannot read the measurements {path}: {err.strerror or err}") from None
    return [json.loads(line) for line in lines if line.strip()]


def _flag(flags: str, name: str) -> int | None:
    m = re.search(rf"{re.escape(name)}[ =](\d+)", flags or "")
    return int(m.group(1)) if m else None


def _word_flag(flags: str, name: str) -> str | None:
    m = re.search(rf"{re.escape(name)}[ =]([\w.-]+)", flags or "")
    return m.group(1) if m else None


def _version(v: str | None) -> str:
    """The row's vLLM release when the planner follows it, else the pinned one."""
    if v and _minor(FIRST_SUPPORTED) <= _minor(v) <= _minor(PINNED):
        return v
    return PINNED


def row_setup(row: dict, root: Path, eff: Efficiency = DEFAULT) -> predict.Setup:
    source = MODELS.get(row["model"])
    if source is None:
        raise UserError(f"measurement {row['id']}: no model source for {row['model']}")
    arch = load_model(str(root / source) if source.startswith("models/") else source)
    flags = " ".join(filter(None, [row.get("other_flags"), row.get("serve_command")]))
    spec = row.get("speculative") or ""
    srv = predict.Serving(
        tp=row["tp"], pp=row["pp"], dp=row.get("dp") or 1, expert_parallel=bool(row["expert_parallel"]),
        kv_cache_dtype=row.get("kv_cache_dtype") or "auto",
        max_model_len=_flag(flags, "--max-model-len") or arch.max_position_embeddings or None,
        max_num_seqs=row.get("max_num_seqs"), max_num_batched_tokens=row.get("max_num_batched_tokens"),
        async_scheduling=True if "--async-scheduling" in flags else None,
        num_speculative_tokens=int(spec.split(":")[1]) if spec.startswith("mtp:") else 0,
        vllm_version=_version(row.get("vllm_version")),
        tokenizer_mode=_word_flag(flags, "--tokenizer-mode") or "auto",
    )  # fmt: skip
    try:
        return predict.setup(arch, for_gpu(row["gpu"]), srv, eff)
    except UserError as err:
        # The source served it, so the memory plan's refusal of vLLM's default length is
        # the planner's margin: the row is re-run at the longest length its prompts need.
        if "no room for one sequence" not in str(err) or _flag(flags, "--max-model-len"):
            raise
        need = 2 ** math.ceil(math.log2(row["isl"] + row["osl"] + 1))
        return predict.setup(arch, for_gpu(row["gpu"]), replace(srv, max_model_len=max(need, 8192)), eff)


def row_workload(row: dict) -> Workload:
    isl, osl = max(1, round(row["isl"])), max(1, round(row["osl"]))
    if row["lengths"] == "sharegpt":
        return Workload.sharegpt(isl, osl)  # ShareGPT's own pairs at the row's printed means
    return Workload.fixed(isl, osl)


def is_burst(row: dict) -> bool:
    """No --max-concurrency and request rate inf: every prompt is sent at once."""
    return not row.get("concurrency") and not row.get("request_rate")


def _simulate(row: dict, s: predict.Setup, seed: int = 0) -> dict:
    """The row's load on the setup: its --max-concurrency and request rate; with neither
    (rate inf, a "burst") every prompt is sent at once. Predicted means, as printed."""
    n = row.get("num_prompts") or 100
    concurrency = n if is_burst(row) else row.get("concurrency")
    res = predict.run(s, row_workload(row), concurrency=concurrency, request_rate=row.get("request_rate"),
                      num_prompts=n, seed=seed)  # fmt: skip
    return {"ttft_ms": res.ttft_ms.mean, "tpot_ms": res.tpot_ms.mean, "output_tokens_per_s": res.output_tokens_per_s}


def measured(row: dict) -> dict:
    m = row["measured"]
    return {"ttft_ms": (m.get("ttft_ms") or {}).get("mean"), "tpot_ms": (m.get("tpot_ms") or {}).get("mean"),
            "output_tokens_per_s": m.get("output_tokens_per_s")}  # fmt: skip


def predict_row(row: dict, root: Path, eff: Efficiency = DEFAULT, seed: int = 0) -> Point:
    """A row the memory plan refuses is kept, with the refusal, and predicts nothing."""
    role = row.get("role", "validate")
    try:
        s = row_setup(row, root, eff)
    except UserError as err:
        return Point(row["id"], role, {}, measured(row), refused=str(err))
    return Point(row["id"], role, _simulate(row, s, seed), measured(row), family=published_error.family(s.arch.model_type))


def predict_rows(rows: list[dict], root: Path, eff: Efficiency = DEFAULT) -> list[Point]:
    return [predict_row(r, root, eff) for r in rows]


def _errors(points: list[Point], metric: str) -> list[float]:
    return [e for p in points if (e := p.error(metric)) is not None]


def median_abs_error(points: list[Point], metric: str) -> float | None:
    errors = [abs(e) for e in _errors(points, metric)]
    return statistics.median(errors) if errors else None


def median_error(points: list[Point], metric: str) -> float | None:
    """The signed median error: below 0 the model predicts less than was measured."""
    errors = _errors(points, metric)
    return statistics.median(errors) if errors else None


def worst_ratio(points: list[Point], metric: str) -> float:
    """The largest factor between predicted and measured (2.0: off by 2x)."""
    ratios = [max(p.predicted[metric] / p.measured[metric], p.measured[metric] / p.predicted[metric])
              for p in points if p.measured.get(metric) and p.predicted.get(metric)]  # fmt: skip
    return max(ratios, default=1.0)


def fit_loss(points: list[Point]) -> float:
    """Mean squared log error over the metrics of the points."""
    logs = [math.log(p.predicted[k] / p.measured[k]) ** 2 for p in points for k in METRICS
            if p.measured.get(k) and p.predicted.get(k)]  # fmt: skip
    return sum(logs) / len(logs) if logs else 0.0


def fit(rows: list[dict], root: Path, start: Efficiency = DEFAULT, rounds: int = 4, log=print) -> Efficiency:
    """The SERVING-FITTED fields, on the fit rows only, in two stages of coordinate search
    (each field tried at x / f and x * f, the best kept, f halving in log each round):
    1. the engine's CPU time per step and the request's own latency (one for each of the API
       server's chat paths), on the fit rows with a bounded load (a --max-concurrency or a rate);
    2. with those held, the engine's CPU time per running sequence, the share of the kernels'
       compute rates a serving step reaches (one against each GPU generation's tables), and the
       API server's intake (shared among the requests it holds), on the burst fit rows (every
       prompt at once): only a large batch shows the first, only long prefill chunks and large
       batches the second, only a queue the third.
    Fitting the per-step CPU time to the bursts too would charge every small-batch step
    with what only a burst shows."""
    fit_rows = [r for r in rows if r.get("role") == "fit"]
    setups = []
    for r in fit_rows:
        try:
            setups.append((r, row_setup(r, root, start)))
        except UserError as err:
            log(f"fit row {r['id']} left out: {err}")
    bounded = [(r, s) for r, s in setups if not is_burst(r)]
    burst = [(r, s) for r, s in setups if is_burst(r)]
    # gpt-oss's request overhead moves its one bounded row only: a grid first, as its intake's.
    best = _search(bounded, _grid(bounded, start, ("request_overhead_harmony_s",), log), FITTED_FIELDS, rounds, log)
    # The grid over the two engine figures every burst row shares (they trade against each
    # other), then over the intake, then over gpt-oss's intake alone (it moves its rows only),
    # then the coordinate search over all of them (the A100 share too: it moves the A100 rows
    # only, and starts near enough).
    engine = _grid(burst, best, ("seq_overhead_s", "serving_compute"), log)
    shared = _grid(burst, engine, ("frontend_intake_s",), log)
    best = _search(burst, _grid(burst, shared, ("frontend_intake_harmony_s",), log), BURST_FITTED_FIELDS, rounds, log)
    best = _search(bounded, best, FITTED_FIELDS, rounds, log)  # once more, the burst figures now held
    return best.replace(fitted_on=tuple(r["id"] for r, _ in setups))


GRID_POINTS = 6  # per field, spaced evenly in log between its bounds (zero for a zero lower bound)


def _loss(setups: list, eff: Efficiency) -> float:
    return fit_loss([Point(r["id"], "fit", _simulate(r, predict.with_efficiency(s, eff)), measured(r)) for r, s in setups])


def _grid(setups: list, start: Efficiency, names: tuple[str, ...], log) -> Efficiency:
    """The best point of a coarse grid over the fields' bounds: a start the coordinate
    search cannot reach from far away in a few halving steps."""
    axes = []
    for name in names:
        low, high = FIT_BOUNDS[name]
        floor = low if low > 0 else high * 1e-3
        values = [floor * (high / floor) ** (i / (GRID_POINTS - 1)) for i in range(GRID_POINTS)]
        axes.append(([0.0] if low == 0 else []) + values)
    best, best_loss = start, _loss(setups, start)
    for combo in product(*axes):
        trial = start.replace(**dict(zip(names, combo)))
        trial_loss = _loss(setups, trial)
        if trial_loss < best_loss:
            best, best_loss = trial, trial_loss
    log(f"grid: loss {best_loss:.4f}; {efficiency_source(best)}")
    return best


def _search(setups: list, start: Efficiency, names: tuple[str, ...], rounds: int, log) -> Efficiency:
    def loss(eff: Efficiency) -> float:
        return _loss(setups, eff)

    best, best_loss, factor = start, loss(start), 2.0
    for rnd in range(rounds):
        for name in names:
            for f in (1 / factor, factor):
                low, high = FIT_BOUNDS.get(name, (0.0, math.inf))
                value = min(max(getattr(best, name) * f, low), high)
                trial = best.replace(**{name: value})
                trial_loss = loss(trial)
                if trial_loss < best_loss:
                    best, best_loss = trial, trial_loss
            log(f"round {rnd + 1}, {name}: loss {best_loss:.4f}; {efficiency_source(best)}")
        factor = math.sqrt(factor)
    return best


def efficiency_source(eff: Efficiency) -> str:
    """The fitted values as Python, to paste into fitted.py."""
    return ", ".join(f"{f.name}={getattr(eff, f.name)!r}" for f in fields(eff) if f.name in FITTED_FIELDS + BURST_FITTED_FIELDS)


def target_verdicts(summary: dict) -> list[tuple[str, bool]]:
    """Each of the issue's targets on the validation rows, as a phrase with its figure, and
    whether the rows meet it: the median |error| of each metric, then the worst ratio."""
    v = summary["validate"]
    out = [(f"{k} median {100 * v['median_abs_error'][k]:.1f}% <= {100 * TARGETS[k]:.0f}%", v["median_abs_error"][k] <= TARGETS[k])
           for k in METRICS]  # fmt: skip
    worst = max(v["worst_ratio"].values(), default=1.0)
    out.append((f"none off by more than x{WORST_RATIO:g} (worst x{worst:.2f})", v["points"] > 0 and worst <= WORST_RATIO))
    return out


def summary(points: list[Point], rows: list[dict] | None = None) -> dict:
    """Per role: the median |error| and the worst ratio per metric; and whether the
    validation rows meet the targets. With the rows, also per load: bounded and burst."""
    out = {}
    groups = {"fit": [p for p in points if p.role == "fit"], "validate": [p for p in points if p.role == "validate"]}
    if rows is not None:
        burst = {r["id"] for r in rows if is_burst(r)}
        groups["validate_bounded"] = [p for p in groups["validate"] if p.id not in burst]
        groups["validate_burst"] = [p for p in groups["validate"] if p.id in burst]
        # Per model family (DeepSeek's, Qwen3's, ...): the plan quotes its own model's.
        for name in sorted({p.family for p in groups["validate"] if p.family}):
            groups[published_error.FAMILY + name] = [p for p in groups["validate"] if p.family == name]
    for role, group in groups.items():
        out[role] = {
            "points": len(group),
            "refused": [p.id for p in group if p.refused],
            "median_abs_error": {k: median_abs_error(group, k) or 0.0 for k in METRICS},
            "median_error": {k: median_error(group, k) or 0.0 for k in METRICS},
            "worst_ratio": {k: worst_ratio(group, k) for k in METRICS},
        }
    v = out["validate"]
    out["targets_met"] = v["points"] > 0 and all(
        v["median_abs_error"][k] <= TARGETS[k] and v["worst_ratio"][k] <= WORST_RATIO for k in METRICS
    )
    return out
