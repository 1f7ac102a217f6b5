"""How far the performance model's figures are from published measurements, for the plan.

The plan's predictions come with the model's error on the published `vllm bench serve` runs
of tests/fixtures/perf/ (validate.py): a reader of "SLA capacity 111" needs to know how
near the model has come to runs it was not fitted on. Computing that takes seconds, so the
figures are kept in data/validation_summary.json, written by
`python -m infra perf --validate --write-summary`; tests/test_perf_validation.py fails when
they are not what the validation computes, so a refit cannot leave them stale.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

SUMMARY = Path(__file__).resolve().parent / "data" / "validation_summary.json"
# The roles kept (validate.summary): the fit rows, every validation row, and the validation rows
# at a bounded load (a --max-concurrency or a finite rate, as the plan's closed loop at its SLA
# capacity) and in bursts; and the validation rows of each model family, under FAMILY + its name.
ROLES = ("validate", "validate_bounded", "validate_burst", "fit")
FAMILY = "family:"
FIGURES = ("median_abs_error", "median_error", "worst_ratio")


def family(model_type: str) -> str:
    """A model's family by its config's model_type: deepseek_v3, deepseek_v32 and deepseek_v4
    are DeepSeek's; qwen3 and qwen3_moe Qwen3's; kimi_linear Kimi's."""
    return model_type.split("_")[0]


def record(summary: dict) -> dict:
    """What is kept of validate.summary(points, rows): per role and per model family of the
    validation rows, its rows and figures, rounded (to 0.01% and 0.0001x: what the plan
    prints, with room to spare)."""
    return {
        role: {"points": summary[role]["points"] - len(summary[role]["refused"]),
               **{f: {k: round(v, 4) for k, v in summary[role][f].items()} for f in FIGURES}}
        for role in summary if role in ROLES or role.startswith(FAMILY)
    }  # fmt: skip


def write(summary: dict, path: Path = SUMMARY) -> None:
    path.write_text(json.dumps(record(summary), indent=2, sort_keys=True) + "\n")
    load.cache_clear()


@cache
def load(path: Path = SUMMARY) -> dict:
    return json.loads(path.read_text())


def model_error(model_type: str) -> dict:
    """The plan's `performance.model_error` (names in docs/planning.md, "Performance"): over
    all validation rows, those at a bounded load, and those of the plan's model family (None
    when no published run is of it)."""
    s = load()
    own = s.get(FAMILY + family(model_type))
    return {
        "source": "python -m infra perf --validate (tests/fixtures/perf/measurements.jsonl)",
        "all": {"rows": s["validate"]["points"], **{f: s["validate"][f] for f in FIGURES}},
        "bounded": {"rows": s["validate_bounded"]["points"], **{f: s["validate_bounded"][f] for f in FIGURES}},
        "family": {"name": family(model_type), "rows": own["points"], **{f: own[f] for f in FIGURES}} if own else None,
    }


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def _bias(v: float) -> str:
    return f"{_pct(abs(v))} {'low' if v < 0 else 'high'}"


def _errors(g: dict) -> str:
    m = g["median_abs_error"]
    return f"TPOT {_pct(m['tpot_ms'])} (a median {_bias(g['median_error']['tpot_ms'])}), TTFT {_pct(m['ttft_ms'])}, " \
           f"output tokens/s {_pct(m['output_tokens_per_s'])}"


def describe(e: dict) -> str:
    """One line for the plan's table."""
    a, b, f = e["all"], e["bounded"], e["family"]
    own = (f"; on the {f['rows']} of its model family ({f['name']}) {_errors(f)}" if f
           else "; none of the published runs is of this model's family")
    return (
        f"median |error| on {a['rows']} published runs it was not fitted on: {_errors(a)}, worst x{max(a['worst_ratio'].values()):.1f}; "
        f"on the {b['rows']} at a bounded load, as here, {_errors(b)}{own} (python -m infra perf --validate; docs/planning.md, Performance)"
    )
