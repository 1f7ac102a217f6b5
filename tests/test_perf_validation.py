"""The performance model against the published measurements (tests/fixtures/perf/).

The fit rows set the fitted fractions; the validation rows only judge them. The
issue's targets on the validation rows (median |error| <= 15% for TPOT and output
throughput, <= 30% for TTFT, none off by more than 2x): the medians, which the model
meets, by `test_validation_medians_meet_the_targets`; the worst ratio by
`test_no_validation_row_is_off_by_more_than_2x`, a strict xfail while the model misses
it: it starts failing the day it is met, so the marker comes off then.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.catalog.models import load_model
from infra.planning.perf import published_error, validate

ROOT = Path(__file__).resolve().parent / "fixtures" / "perf"
ROWS = validate.load_rows(ROOT / "measurements.jsonl")


def test_every_row_names_its_source_role_model_and_what_it_measured() -> None:
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    for r in ROWS:
        assert r["role"] in ("fit", "validate"), r["id"]
        assert r["source"] and ("@" in r["source"] or r["source"].startswith("http")), r["id"]
        assert r["model"] in validate.MODELS, r["id"]
        assert any(r["measured"].get(k) for k in validate.METRICS), r["id"]
    fit = [r for r in ROWS if r["role"] == "fit"]
    assert 0 < len(fit) < len(ROWS) / 3  # most rows are held out


def test_model_configs_kept_beside_the_measurements_load() -> None:
    for source in validate.MODELS.values():
        if source.startswith("models/"):
            cfg = json.loads((ROOT / source).read_text())
            assert cfg["model_type"].startswith("qwen3") or cfg["model_type"] == "gpt_oss"
            assert load_model(str(ROOT / source)).model_type == cfg["model_type"]


@pytest.fixture(scope="module")
def points() -> list[validate.Point]:
    return validate.predict_rows(ROWS, ROOT)


def test_every_row_is_predicted_or_refused_with_the_reason(points) -> None:
    assert len(points) == len(ROWS)
    for p in points:
        if p.refused:
            assert "memory plan refuses" in p.refused, p.id
        else:
            assert p.predicted["tpot_ms"] > 0 and p.predicted["output_tokens_per_s"] > 0, p.id
    assert sum(1 for p in points if p.refused) <= 3  # the planner's margin refuses at most a few served runs


def test_the_fit_rows_are_not_the_validation_rows(points) -> None:
    s = validate.summary(points)
    assert s["fit"]["points"] + s["validate"]["points"] == len(ROWS)
    assert set(validate.DEFAULT.fitted_on) <= {r["id"] for r in ROWS if r["role"] == "fit"}


def test_the_errors_the_plan_quotes_are_what_the_validation_computes(points) -> None:
    """The plan's `model error` line reads infra/planning/perf/data/validation_summary.json:
    after a refit or a new row, `python -m infra perf --validate --write-summary` rewrites it."""
    computed = published_error.record(validate.summary(points, ROWS))
    assert published_error.load() == computed
    validation = [p for p in points if p.role == "validate" and not p.refused]
    assert computed["validate"]["points"] == len(validation)
    deepseek = [p for p in validation if p.id.startswith(("gps-dsr1", "gps-dsv32"))]
    assert computed["family:deepseek"]["points"] == len(deepseek) > 0
    assert computed["family:deepseek"]["median_error"]["tpot_ms"] == round(validate.median_error(deepseek, "tpot_ms"), 4)


def test_a_written_summary_reads_back_as_the_record_of_it(points, tmp_path) -> None:
    path = tmp_path / "summary.json"
    summary = validate.summary(points, ROWS)
    published_error.write(summary, path)
    assert published_error.load(path) == published_error.record(summary)
    # Written again (a refit): read back anew, not the figures read before.
    fewer = validate.summary([p for p in points if not p.id.startswith("gps-dsv32")], ROWS)
    published_error.write(fewer, path)
    assert published_error.load(path) == published_error.record(fewer) != published_error.record(summary)


def _group(rows: int, tpot: float, ttft: float, out: float, bias: float) -> dict:
    return {"rows": rows, "median_abs_error": {"tpot_ms": tpot, "ttft_ms": ttft, "output_tokens_per_s": out},
            "median_error": {"tpot_ms": bias, "ttft_ms": 0.0, "output_tokens_per_s": 0.0},
            "worst_ratio": {"tpot_ms": 4.36, "ttft_ms": 2.5, "output_tokens_per_s": 2.2}}  # fmt: skip


def test_the_model_error_line_puts_each_figure_in_its_place() -> None:
    e = {"all": _group(111, 0.19, 0.23, 0.18, 0.02), "bounded": _group(6, 0.10, 0.17, 0.06, 0.11),
         "family": {"name": "deepseek", **_group(14, 0.31, 0.12, 0.04, -0.27)}}  # fmt: skip
    line = published_error.describe(e)
    assert "on 111 published runs it was not fitted on: TPOT 19% (a median 2% high), TTFT 23%, output tokens/s 18%, worst x4.4" in line
    assert "on the 6 at a bounded load, as here, TPOT 10% (a median 11% high), TTFT 17%, output tokens/s 6%" in line
    assert "on the 14 of its model family (deepseek) TPOT 31% (a median 27% low), TTFT 12%, output tokens/s 4%" in line


def test_the_plans_model_error_line_names_its_own_family_or_says_it_has_none() -> None:
    stored = published_error.load()
    line = published_error.describe(published_error.model_error("deepseek_v4"))
    tpot = stored["family:deepseek"]["median_abs_error"]["tpot_ms"]
    assert f"on the {stored['family:deepseek']['points']} of its model family (deepseek) TPOT {100 * tpot:.0f}%" in line
    assert f"on {stored['validate']['points']} published runs" in line
    bias = stored["validate_bounded"]["median_error"]["tpot_ms"]
    assert f"a median {100 * abs(bias):.0f}% {'low' if bias < 0 else 'high'}" in line
    assert "none of the published runs is of this model's family" in published_error.describe(published_error.model_error("kimi_linear"))


def test_validation_medians_meet_the_targets(points) -> None:
    s = validate.summary(points)["validate"]
    for metric, bound in validate.TARGETS.items():
        assert s["median_abs_error"][metric] <= bound, metric


@pytest.mark.xfail(strict=True, reason="four validation rows (128-token bursts) are off by more than 2x (see docs/planning.md, Performance)")
def test_no_validation_row_is_off_by_more_than_2x(points) -> None:
    s = validate.summary(points)["validate"]
    for metric in validate.TARGETS:
        assert s["worst_ratio"][metric] <= validate.WORST_RATIO, metric


# Burst rows measured with and without --async-scheduling, the rest of the command alike.
ASYNC_PAIRS = [("gps-gptoss120b-h100-tp1-sharegpt-burst", "gps-gptoss120b-h100-tp1-async-sharegpt-burst"),
               ("gps-gptoss120b-a100-tp1-sharegpt-burst", "gps-gptoss120b-a100-tp1-async-sharegpt-burst")]


@pytest.mark.parametrize("sync_id,async_id", ASYNC_PAIRS)
def test_async_scheduling_changes_a_bursts_tpot_as_measured(points, sync_id, async_id) -> None:
    """Async scheduling changed TPOT under a burst by 3-5% on the measured pairs: the time each
    sampled sequence costs a step is not hidden behind the GPU by it (hiding it predicted about
    half the TPOT). The predicted ratio is within 10 points of the measured one."""
    by_id = {p.id: p for p in points}
    rows = {r["id"]: r for r in ROWS}
    assert "--async-scheduling" in rows[async_id]["serve_command"] and "--async-scheduling" not in rows[sync_id]["serve_command"]
    assert rows[async_id]["serve_command"].replace(" --async-scheduling", "") == rows[sync_id]["serve_command"]
    sync, async_ = by_id[sync_id], by_id[async_id]
    measured = async_.measured["tpot_ms"] / sync.measured["tpot_ms"]
    predicted = async_.predicted["tpot_ms"] / sync.predicted["tpot_ms"]
    assert predicted == pytest.approx(measured, abs=0.10)


def test_the_one_data_parallel_moe_run_is_predicted_too_fast_as_the_warning_says(points) -> None:
    """plan.dp_moe_warnings tells a user of a MoE layout with replicas that the model predicts its
    one published such run (DeepSeek-V3.2, TP 1 x DP 8 with expert parallel, H200, vLLM 0.13.0) too
    fast: TPOT about two thirds of the measured (1.4x to 1.75x short), throughput about 1.6x (1.4x to
    1.75x). Its TTFT is mostly the burst's wait for the one API server 0.13 starts for all eight replicas
    (Release.api_servers), each request on the encoded chat path's intake (predict.chat_path), within
    60%. Should the model come closer, the warning must say so."""
    [p] = [p for p in points if p.id == "gps-dsv32-h200-dp8ep-sharegpt-burst"]
    assert not p.refused
    tpot = p.measured["tpot_ms"] / p.predicted["tpot_ms"]
    throughput = p.predicted["output_tokens_per_s"] / p.measured["output_tokens_per_s"]
    assert 1.4 <= tpot <= 1.75 and 1.4 <= throughput <= 1.75, (tpot, throughput)
    assert abs(p.error("ttft_ms")) <= 0.6


def _doc_ratio(text: str) -> float:
    return float(text.strip().lstrip("x"))


@pytest.mark.parametrize("page,printed", [("docs/planning.md", {"fit", "validate, bounded load", "validate, burst", "validate, all"}),
                                         ("README.md", {"validate, all"})])  # fmt: skip
def test_the_medians_the_docs_print_are_the_models(points, page: str, printed: set) -> None:
    """docs/planning.md's table of median errors, and the README's row of it (typed prose, not a
    generated region), are what `python -m infra perf --validate` computes today: each median to
    the printed percent, each worst ratio to its printed digits, and each group's row count."""
    import re

    text = (Path(__file__).resolve().parent.parent / page).read_text()
    s = validate.summary(points, ROWS)
    groups = {"fit": "fit", "validate, bounded load": "validate_bounded", "validate, burst": "validate_burst", "validate, all": "validate"}
    seen = set()
    for line in text.splitlines():
        m = re.match(r"\| (fit|validate, [a-z ]+) \((\d+)[;:)]", line)
        if not m:
            continue
        group = s[groups[m.group(1)]]
        seen.add(m.group(1))
        assert int(m.group(2)) == group["points"], line
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        for metric, cell in zip(validate.METRICS, cells):
            median, worst = re.fullmatch(r"(\d+)% \((x[\d.]+)\)", cell).groups()
            assert int(median) == round(group["median_abs_error"][metric] * 100), (line, metric)
            digits = len(worst.split(".")[1]) if "." in worst else 0
            assert _doc_ratio(worst) == round(group["worst_ratio"][metric], digits), (line, metric)
    assert seen == printed


def test_a_burst_reaches_the_engine_together_as_the_measured_ttfts_say() -> None:
    """Where the engine's own queue is short (1,000 prompts of 128 tokens, 4 out) a burst's
    measured TTFTs sit tight around their mean (p99 within 1.6x of it on 10 of the 14 rows):
    the API server, sharing its loop among the requests it takes in, hands them to the engine
    together. One at a time they would spread evenly from 0 (p99 about twice the mean). The
    predicted p99 / mean is within 0.35 of the measured on at least three rows in four."""
    from infra.planning.perf import predict

    rows = [r for r in ROWS if r["id"].endswith("-rand128")]
    assert len(rows) >= 10 and all(validate.is_burst(r) and round(r["osl"]) == 4 for r in rows)
    close = []
    for r in rows:
        res = predict.run(validate.row_setup(r, ROOT), validate.row_workload(r), concurrency=r["num_prompts"],
                          request_rate=None, num_prompts=r["num_prompts"])  # fmt: skip
        measured = r["measured"]["ttft_ms"]["p99"] / r["measured"]["ttft_ms"]["mean"]
        close.append(abs(res.ttft_ms.p99 / res.ttft_ms.mean - measured) <= 0.35)
    assert sum(close) >= 0.75 * len(rows), close


def test_a_sliding_window_models_preempted_prompts_are_found_in_the_prefix_cache(points) -> None:
    """gpt-oss-120b (half its layers sliding-window) on one H100 with 32k-token prompts: under
    3 prompts fit its KV cache, so the engine preempts. vLLM finds a preempted prompt's blocks
    again in both kinds of group (v1/core/single_type_kv_cache_manager.py
    SlidingWindowManager.find_longest_cache_hit); computed again from the start instead, the
    predicted TPOT was 5.2x the measured and TTFT 3.2x. Both within 2x of the measured."""
    from infra.planning.perf import predict

    row_id = "gps-gptoss120b-h100-tp1-rand32k"
    s = validate.row_setup({r["id"]: r for r in ROWS}[row_id], ROOT)
    assert {g.first.spec for g in s.evaluation.kv.groups} == {"full", "sliding"}
    assert s.evaluation.max_concurrency < 3 and predict.prefix_cache_reuse(s.evaluation)
    point = {p.id: p for p in points}[row_id]
    for metric in ("ttft_ms", "tpot_ms", "output_tokens_per_s"):
        assert 0.5 <= point.predicted[metric] / point.measured[metric] <= 2.0, metric


def test_every_serving_fitted_figure_has_the_bounds_the_fit_keeps_it_in() -> None:
    """What `python -m infra perf --fit` may move: the serving-fitted figures (never a kernel-fitted
    one), each with bounds, the value it holds now within them, and each fitted in one stage."""
    from dataclasses import fields

    from infra.planning.perf.fitted import BURST_FITTED_FIELDS, DEFAULT, FIT_BOUNDS, FITTED_FIELDS, KERNEL_FITTED

    names = {f.name for f in fields(DEFAULT)}
    fitted = set(FITTED_FIELDS) | set(BURST_FITTED_FIELDS)
    assert len(fitted) == len(FITTED_FIELDS) + len(BURST_FITTED_FIELDS)
    assert fitted <= names and not fitted & set(KERNEL_FITTED) and set(FIT_BOUNDS) == fitted
    for name in fitted:
        low, high = FIT_BOUNDS[name]
        assert 0 <= low < getattr(DEFAULT, name) < high, name
    # The assumed FP4 GEMM fraction is FP8's (no FP4 kernel in the tables).
    assert DEFAULT.gemm_fp4 == DEFAULT.gemm_fp8


def test_every_model_config_beside_the_measurements_is_the_copy_its_sources_name() -> None:
    """tests/fixtures/perf/models/SOURCES.md names each config.json copy's origin and sha256:
    every copy is listed, byte for byte, and every model a row names has a config to load."""
    import hashlib

    folder = Path(__file__).resolve().parent / "fixtures" / "perf" / "models"
    sources = (folder / "SOURCES.md").read_text()
    for path in sorted(folder.glob("*.json")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"`{path.name}`" in sources and digest in sources, path.name
    rows = validate.load_rows(folder.parent / "measurements.jsonl")
    for model in {r["model"] for r in rows}:
        source = validate.MODELS[model]
        assert not source.startswith("models/") or (folder.parent / source).is_file(), model
