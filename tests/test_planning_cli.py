"""The `plan` command's knobs that a stack can set: release, parallelism, batch, speculative decoding."""

from __future__ import annotations

import json

from test_cli import plan_json, run

V3 = ["--model", "deepseek-v3", "--instance-type", "p5.48xlarge", "--nodes", "4"]


def test_vllm_version_selects_the_release_and_an_unknown_one_is_refused():
    old = plan_json(*V3, "--vllm-version", "0.19.0")
    new = plan_json(*V3, "--vllm-version", "0.34.0")
    assert old["vllm"]["version"] == "0.19.0" and new["vllm"]["version"] == "0.34.0"
    # MLA blocks: 16 from FlashAttention-MLA in 0.19, the 0.34 default 64
    assert (old["kv_cache"]["block_size"], new["kv_cache"]["block_size"]) == (16, 64)
    assert old["per_rank"]["cudagraph_estimate_bytes"] == 0
    err = run("plan", *V3, "--vllm-version", "0.9.2", expect=2).stderr
    assert "0.10.0 to 0.34.0" in err


def test_parallel_and_batch_flags_reach_the_plan():
    data = plan_json("--model", "qwen3-30b-a3b", "--instance-type", "p5.48xlarge", "--nodes", "1",
                     "--tp", "2", "--dp", "4", "--no-expert-parallel", "--max-num-seqs", "64",
                     "--max-num-batched-tokens", "4096")  # fmt: skip
    assert (data["layout"]["tp"], data["layout"]["dp"], data["layout"]["expert_parallel"]) == (2, 4, False)
    args = data["vllm_args"]
    assert args[args.index("--max-num-seqs") + 1] == "64"
    assert args[args.index("--max-num-batched-tokens") + 1] == "4096"
    assert "--enable-expert-parallel" not in args
    on = plan_json("--model", "qwen3-30b-a3b", "--instance-type", "p5.48xlarge", "--nodes", "1", "--tp", "2", "--expert-parallel")
    assert on["layout"]["expert_parallel"] is True and "--enable-expert-parallel" in on["vllm_args"]


def test_speculative_flags_reach_vllm_serve():
    data = plan_json(*V3, "--speculative-method", "mtp", "--num-speculative-tokens", "3")
    args = data["vllm_args"]
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 3}
    # the MTP layer's MLA cache joins the model's single group (is_draft does not count)
    assert [g["layers"] for g in data["kv_cache"]["groups"]] == [62]
    err = run("plan", "--model", "llama-3.1-70b", "--instance-type", "p5.48xlarge", "--nodes", "2",
              "--speculative-method", "mtp", expect=2).stderr  # fmt: skip
    assert "multi-token-prediction" in err


def test_plan_tables_show_groups_and_graphs():
    out = run("plan", "--stack", "prod").stdout
    assert "KV cache groups" in out and "compressor_state" in out
    assert "of which CUDA graphs" in out
    assert "chosen:" in out and "in-flight tokens" in out


def test_an_sla_capacity_no_poisson_rate_meets_is_said_in_words(monkeypatch):
    """A closed loop that meets the SLA where no Poisson rate from 60% of that loop's request rate
    up does (performance.rate_capacity 0: an open loop's bursts at a small capacity, as Kimi K3's on
    prod's nodes once had): the table says so, not "0.00 requests/s"."""
    from infra.planning import capacity_cache, performance, sla_search

    monkeypatch.delenv(capacity_cache.ENV, raising=False)  # searched here, not read from the run's cache
    monkeypatch.setattr(sla_search, "_CAPACITIES", {})
    monkeypatch.setattr(sla_search, "_RATES", {})
    monkeypatch.setattr(performance, "rate_capacity", lambda *args, **kwargs: 0.0)
    data = plan_json("--stack", "prod", "--model", "kimi-k3")
    cap = data["performance"]["sla_capacity"]
    assert cap["concurrency"] > 0 and cap["requests_per_s"] == 0.0
    text = " ".join(run("plan", "--stack", "prod", "--model", "kimi-k3").stdout.split())
    assert f"{cap['concurrency']:,} concurrent requests, but no Poisson rate at 60% of their request rate or above meets it" in text.replace("│ ", "")
    assert "0.00 requests/s (Poisson)" not in text
