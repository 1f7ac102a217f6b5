"""`python -m infra perf --fit` (validate.fit): the serving-fitted figures it returns are the
ones the data came from.

The rows are real fixture rows (their models, layouts, loads and lengths) whose measurements
are replaced by what the model predicts at known figures, all away from the committed ones.
Starting from the committed figures, the fit has to find the known ones again: each stage on
the rows that show its figures (bounded loads: the CPU time per step and the two chat paths'
request overheads; bursts: the time per token, the serving share of the kernels' compute (of
H100's tables and of A100's) and the two paths' intakes). A fit that searched the wrong rows, skipped a stage, or stopped its
search short would land elsewhere. About 15 s: one fit over nine rows.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from infra.planning.perf import validate
from infra.planning.perf.fitted import BURST_FITTED_FIELDS, DEFAULT, FITTED_FIELDS

ROOT = Path(__file__).resolve().parent / "fixtures" / "perf"

# Bounded loads on both chat paths (Qwen3-8B at 1 and 8, gpt-oss-120b at 4), and bursts that
# show each burst figure: 32k-token prompts (compute), 1,000 128-token prompts on each path
# (intake), 500 2k-token prompts, 100 requests decoding 2,000 tokens (the time per token), and
# 500 2k-token prompts on one A100 (the share of its own tables).
ROWS = ("gps-q8b-h100-tp1-sharegpt-c1", "gps-q8b-h100-tp1-sharegpt-c8", "gps-gptoss120b-h100-tp1-sharegpt-c4",
        "gps-q235b-h100-tp8-bf16-rand32k", "gps-q235b-h100-tp8-bf16-rand128", "gps-gptoss120b-h100-tp1-rand128",
        "gps-gptoss120b-h100-tp2-rand2k", "gps-dsv32-h200-tp8-rand1k-2k", "gps-q14b-a100-tp1-bf16-rand2k")  # fmt: skip

# Each at least 1.5x away from the committed figure, some above it and some below.
TRUTH = DEFAULT.replace(step_overhead_s=0.6e-3, request_overhead_s=80e-3, request_overhead_harmony_s=5e-3,
                        seq_overhead_s=200e-6, serving_compute=0.4, serving_compute_ampere=0.42, frontend_intake_s=13e-3,
                        frontend_intake_harmony_s=3.5e-3)  # fmt: skip
# The coordinate search's last step is 2 ** (1 / 8) (9%); the time per token and the compute
# share trade against each other a little on these rows.
TOLERANCE = 0.20


def _synthetic_rows() -> list[dict]:
    by_id = {r["id"]: r for r in validate.load_rows(ROOT / "measurements.jsonl")}
    rows = []
    for rid in ROWS:
        row = copy.deepcopy(by_id[rid])
        row["role"] = "fit"
        predicted = validate._simulate(row, validate.row_setup(row, ROOT, TRUTH))
        row["measured"] = {"ttft_ms": {"mean": predicted["ttft_ms"]}, "tpot_ms": {"mean": predicted["tpot_ms"]},
                           "output_tokens_per_s": predicted["output_tokens_per_s"]}  # fmt: skip
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def fit_on_known_figures() -> tuple[list[dict], object]:
    rows = _synthetic_rows()
    return rows, validate.fit(rows, ROOT, DEFAULT, log=lambda _: None)


def test_the_truth_is_away_from_where_the_fit_starts() -> None:
    for name in FITTED_FIELDS + BURST_FITTED_FIELDS:
        ratio = getattr(TRUTH, name) / getattr(DEFAULT, name)
        assert ratio >= 1.5 or ratio <= 1 / 1.5, name


@pytest.mark.parametrize("name", FITTED_FIELDS + BURST_FITTED_FIELDS)
def test_the_fit_finds_each_figure_the_data_came_from(fit_on_known_figures, name) -> None:
    _, got = fit_on_known_figures
    assert getattr(got, name) == pytest.approx(getattr(TRUTH, name), rel=TOLERANCE)


def test_the_fit_leaves_the_kernel_figures_and_names_its_rows(fit_on_known_figures) -> None:
    rows, got = fit_on_known_figures
    moved = {f for f in vars(DEFAULT) if getattr(got, f) != getattr(DEFAULT, f)}
    assert moved <= set(FITTED_FIELDS + BURST_FITTED_FIELDS) | {"fitted_on"}
    assert got.fitted_on == ROWS


def test_the_fit_reproduces_the_data(fit_on_known_figures) -> None:
    """Near zero loss where the start is far off: the rows are the model's own at TRUTH."""
    rows, got = fit_on_known_figures

    def loss(eff) -> float:
        return validate._loss([(r, validate.row_setup(r, ROOT, eff)) for r in rows], eff)

    assert loss(TRUTH) == pytest.approx(0.0, abs=1e-12)
    start = loss(DEFAULT)
    assert start > 0.05
    assert loss(got) < start / 50
