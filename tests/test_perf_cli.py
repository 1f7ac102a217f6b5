"""`python -m infra perf` as a user runs it: the acceptance commands of the performance
model, the curve's shape, and one clear line for every bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infra.cli.app import app

runner = CliRunner()

FIELDS = ("concurrency", "request_rate", "ttft_ms", "tpot_ms", "itl_ms", "requests_per_s", "output_tokens_per_s",
          "total_tokens_per_s", "output_tokens_per_s_per_gpu", "preemptions", "bound")  # fmt: skip
LATENCY = ("mean", "p50", "p90", "p99")


def _perf(*args: str) -> dict:
    result = runner.invoke(app, ["perf", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_llama_70b_on_8_h100_sweeps_four_concurrencies_with_every_field(tmp_path) -> None:
    chart = tmp_path / "curve.png"
    out = _perf("--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "1024", "--osl", "1024",
                "--concurrency", "1,4,16,64", "--chart", str(chart))  # fmt: skip
    points = out["points"]
    assert [p["concurrency"] for p in points] == [1, 4, 16, 64]
    for p in points:
        assert all(f in p for f in FIELDS)
        for lat in ("ttft_ms", "tpot_ms", "itl_ms"):
            assert all(p[lat][s] > 0 for s in LATENCY)
            assert p[lat]["p50"] <= p[lat]["p99"]
        assert p["bound"] in ("compute", "memory", "communication", "overhead", "kv-admission", "max-num-seqs", "token-budget")
    tpot = [p["tpot_ms"]["mean"] for p in points]
    per_gpu = [p["output_tokens_per_s_per_gpu"] for p in points]
    assert tpot == sorted(tpot) and tpot[-1] > tpot[0]
    assert per_gpu == sorted(per_gpu) and per_gpu[-1] > 10 * per_gpu[0]
    assert out["setup"]["gpus"] == 8
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prods_model_and_layout_with_concurrency_and_with_request_rate() -> None:
    base = ("--model", "deepseek-v4-pro", "--instance-type", "p5.48xlarge", "--nodes", "4", "--tp", "8", "--pp", "4",
            "--isl", "1024", "--osl", "256", "--max-model-len", "8192")  # fmt: skip
    closed = _perf(*base, "--concurrency", "4,32")
    assert closed["setup"]["layout"] == {"tp": 8, "pp": 4, "dp": 1, "expert_parallel": False}
    assert closed["setup"]["gpus"] == 32
    assert closed["points"][1]["output_tokens_per_s"] > closed["points"][0]["output_tokens_per_s"]
    opened = _perf(*base, "--request-rate", "0.5,2", "--num-prompts", "60")
    assert [p["request_rate"] for p in opened["points"]] == [0.5, 2.0]
    assert all(p["concurrency"] is None for p in opened["points"])
    # Below capacity the server keeps up: requests per second follow the offered rate.
    assert opened["points"][0]["requests_per_s"] == pytest.approx(0.5, rel=0.5)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "llama-3.1-70b", "--gpu", "H900", "--isl", "10", "--osl", "10", "--concurrency", "1"], "GPU"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "1", "--isl", "10", "--osl", "10", "--concurrency", "1"], "memory plan refuses"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--max-model-len", "2048", "--isl", "2000", "--osl", "100", "--concurrency", "1"], "max-model-len"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "0"], "above 0"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--request-rate", "2"], "one of --concurrency"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10"], "one of --concurrency"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--instance-type", "p5.48xlarge", "--isl", "10", "--osl", "10", "--concurrency", "1"], "one of --gpu"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--concurrency", "1"], "--isl"),
        # A NaN rate compares false with everything: it once ran without end.
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--request-rate", "nan"], "above 0"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1,,4"], "comma-separated"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--num-prompts", "0"], "--num-prompts must be at least 1"),
        (["--model", "llama-3.1-70b", "--instance-type", "p5.48xlarge", "--nodes", "0", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1"], "--nodes must be at least 1"),
        # A parallel size of 0 divided by zero (a traceback); -1 reached the memory plan.
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "0", "--isl", "10", "--osl", "10", "--concurrency", "1"], "--tp must be at least 1"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--pp", "-1", "--isl", "10", "--osl", "10", "--concurrency", "1"], "--pp must be at least 1"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--dp", "0", "--isl", "10", "--osl", "10", "--concurrency", "1"], "--dp must be at least 1"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--max-num-seqs", "0"], "--max-num-seqs must be at least 1"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1",
          "--max-num-batched-tokens", "512", "--max-num-seqs", "600"], "below --max-num-seqs 600"),
        # A spread of NaN or inf drew NaN or inf tokens and ended in a traceback.
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--length-spread", "nan"], "finite number >= 0"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--length-spread", "inf"], "finite number >= 0"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--sla-ttft-ms", "-1"], "--sla-ttft-ms must be"),
        (["--model", "llama-3.1-70b", "--gpu", "H100-SXM-80GB", "--tp", "8", "--isl", "10", "--osl", "10", "--concurrency", "1", "--sla-tpot-ms", "nan"], "--sla-tpot-ms must be"),
        (["--fit", "--write-summary"], "--validate alone"),
        (["--write-summary"], "--validate alone"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_status_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["perf", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output
    assert "Traceback" not in result.output


def test_a_workload_file_gives_the_lengths(tmp_path) -> None:
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps({"input_tokens": i, "output_tokens": o}) + "\n" for i, o in [(100, 50), (900, 300)] * 10))
    out = _perf("--model", "qwen3-30b-a3b", "--gpu", "H100-SXM-80GB", "--workload", str(path), "--concurrency", "2",
                "--num-prompts", "20")  # fmt: skip
    p = out["points"][0]
    # 20 requests of those lengths: 10 x (50 + 300) output tokens over the run.
    assert p["output_tokens_per_s"] * p["duration_s"] == pytest.approx(10 * 350, rel=0.01)


def test_lengths_drawn_from_a_distribution_keep_their_means_and_vary() -> None:
    """--random-range-ratio draws lengths uniformly around ISL / OSL, as vllm bench serve's
    random dataset; --length-spread lognormally. Either way the mean output stays near
    OSL, and with a spread the requests' TPOTs differ (p99 above p50 once lengths vary)."""
    base = ("--model", "qwen3-30b-a3b", "--gpu", "H100-SXM-80GB", "--isl", "400", "--osl", "200", "--concurrency", "8",
            "--num-prompts", "200")  # fmt: skip
    fixed = _perf(*base)["points"][0]
    for flag in (("--random-range-ratio", "0.5"), ("--length-spread", "0.8")):
        p = _perf(*base, *flag)["points"][0]
        mean_out = p["output_tokens_per_s"] * p["duration_s"] / 200
        assert mean_out == pytest.approx(200, rel=0.15), flag
        assert p["ttft_ms"]["p99"] > p["ttft_ms"]["p50"] and p != fixed, flag
    result = runner.invoke(app, ["perf", *base, "--random-range-ratio", "0.5", "--length-spread", "0.8"])
    assert result.exit_code == 2 and "not both" in result.output
    result = runner.invoke(app, ["perf", *base, "--random-range-ratio", "1.5"])
    assert result.exit_code == 2 and "range ratio" in result.output


def test_the_tokenizer_mode_sets_the_api_servers_chat_path() -> None:
    """--tokenizer-mode is vllm serve's: DeepSeek-V3.2 on 0.13.0 with deepseek_v32 takes the path
    whose tokenizer encodes the conversation itself, and a burst reaches the engine sooner than
    through the chat template; without the flag 0.13.0 renders the template. The output says which
    mode and path it modelled; a mode the release does not take is one line and exit 2."""
    base = ("--model", "deepseek-v3.2", "--gpu", "H200-141GB", "--tp", "8", "--isl", "128", "--osl", "4",
            "--concurrency", "200", "--num-prompts", "200", "--vllm-version", "0.13.0")  # fmt: skip
    encoded = _perf(*base, "--tokenizer-mode", "deepseek_v32")
    template = _perf(*base)
    assert (encoded["setup"]["vllm"]["tokenizer_mode"], encoded["setup"]["vllm"]["chat_path"]) == ("deepseek_v32", "encoded")
    assert (template["setup"]["vllm"]["tokenizer_mode"], template["setup"]["vllm"]["chat_path"]) == ("auto", "template")
    assert encoded["points"][0]["ttft_ms"]["mean"] < template["points"][0]["ttft_ms"]["mean"]
    result = runner.invoke(app, ["perf", *base, "--tokenizer-mode", "deepseek-v32"])
    assert result.exit_code == 2 and "tokenizer mode 'deepseek-v32' is not one vLLM 0.13.0 takes" in result.output


def test_the_sharegpt_dataset_sends_sharegpts_own_lengths() -> None:
    """--dataset sharegpt: the dataset's pairs (infra/planning/perf/sharegpt.py), at their own
    means or scaled to --isl/--osl; their spread makes TPOTs differ (short replies see the
    prefill-heavy steps); anything else beside it is one line and exit 2."""
    from infra.planning.perf import sharegpt

    base = ("--model", "qwen3-30b-a3b", "--gpu", "H100-SXM-80GB", "--concurrency", "8", "--num-prompts", "200")
    for means, flags in ((sharegpt.means(), ()), ((400, 100), ("--isl", "400", "--osl", "100"))):
        p = _perf(*base, "--dataset", "sharegpt", *flags)["points"][0]
        mean_out = p["output_tokens_per_s"] * p["duration_s"] / 200
        assert mean_out == pytest.approx(means[1], rel=0.02), flags
        assert p["tpot_ms"]["p99"] > p["tpot_ms"]["p50"] and p["ttft_ms"]["p99"] > p["ttft_ms"]["p50"], flags
    for extra, words in ((("--dataset", "random"), "not one of: sharegpt"), (("--dataset", "ShareGPT"), "not one of: sharegpt"), (("--dataset", "sharegpt", "--isl", "400"), "both --isl and --osl"),
                         (("--dataset", "sharegpt", "--length-spread", "0.8"), "draws its own lengths")):  # fmt: skip
        result = runner.invoke(app, ["perf", *base, *extra])
        assert result.exit_code == 2 and words in result.output, extra


@pytest.mark.parametrize("page", ["docs/planning.md", "README.md"])
def test_the_aiconfigurator_tables_hold_the_models_figures(page: str) -> None:
    """docs/planning.md and the README set prod's layout beside AIConfigurator at concurrency 4, 16, 64 and 128
    (typed prose): this model's column is what `python -m infra perf` prints for it today (mean TTFT and TPOT,
    output tokens/s per GPU)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / page).read_text()
    rows = re.findall(r"^\| (\d+) \| ([\d,]+) / ([\d.]+), ([\d.]+) \| not covered \|", text, flags=re.M)
    assert [int(r[0]) for r in rows] == [4, 16, 64, 128]
    out = _perf("--model", "deepseek-v4-pro", "--instance-type", "p5.48xlarge", "--nodes", "4", "--tp", "8", "--pp", "4",
                "--isl", "1024", "--osl", "1024", "--concurrency", "4,16,64,128")  # fmt: skip
    for (c, ttft, tpot, per_gpu), p in zip(rows, out["points"]):
        assert p["concurrency"] == int(c)
        assert round(p["ttft_ms"]["mean"]) == int(ttft.replace(",", "")), c
        assert round(p["tpot_ms"]["mean"], 1) == float(tpot), c
        assert round(p["output_tokens_per_s_per_gpu"], 1) == float(per_gpu), c


def test_a_moe_model_under_data_parallel_carries_the_plans_warning() -> None:
    """vLLM shards a MoE model's experts over TP x DP and steps the replicas together, which the
    model counts with the replicas evenly loaded and has one published run to check: the output
    says so, a dense model's does not."""
    base = ("--gpu", "H100-SXM-80GB", "--tp", "1", "--dp", "8", "--isl", "500", "--osl", "100", "--concurrency", "8",
            "--num-prompts", "40")  # fmt: skip
    [w] = _perf("--model", "qwen3-30b-a3b", *base)["setup"]["warnings"]
    assert w.startswith("data parallel 8 with a MoE model") and "over all 8 GPUs" in w and w.endswith("--dp 1 avoids the shared layers")
    assert _perf("--model", "qwen3-0.6b", *base)["setup"]["warnings"] == []
    assert _perf("--model", "qwen3-30b-a3b", *base[:4], "--dp", "1", *base[6:])["setup"]["warnings"] == []


def test_validate_prints_each_model_familys_medians(monkeypatch) -> None:
    """`perf --validate` closes with a line per role and per model family of the validation rows
    (the plan quotes its own family's): rows of two families, each line with its own figures."""
    from infra.planning.perf import validate

    def point(id_: str, role: str, family: str, ratio: float) -> validate.Point:
        measured = {"ttft_ms": 100.0, "tpot_ms": 10.0, "output_tokens_per_s": 1000.0}
        return validate.Point(id_, role, {k: v * ratio for k, v in measured.items()}, measured, family=family)

    points = [point("a", "validate", "deepseek", 1.5), point("b", "validate", "qwen3", 1.05), point("c", "fit", "qwen3", 1.0)]
    monkeypatch.setattr(validate, "load_rows", lambda path: [{"id": p.id, "concurrency": 4} for p in points])
    monkeypatch.setattr(validate, "predict_rows", lambda rows, root, eff=None: points)
    out = " ".join(runner.invoke(app, ["perf", "--validate"]).output.split())
    assert "family:deepseek (1 rows): median |error| ttft_ms 50% (worst x1.50)" in out
    assert "family:qwen3 (1 rows): median |error| ttft_ms 5% (worst x1.05)" in out
    # Each target says whether the rows meet it: medians of 27.5% (1.5x and 1.05x), none off by 2x.
    assert "targets met on the validation rows: ttft_ms median 27.5% <= 30%, none off by more than x2 (worst x1.50)" in out
    assert "targets missed on the validation rows: tpot_ms median 27.5% <= 15%, output_tokens_per_s median 27.5% <= 15%" in out
