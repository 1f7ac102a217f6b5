"""The prod plan's KV cache, derived by hand from the model config and vLLM 0.34's formulas.

Nothing here calls the planner's KV code: the groups, pages, reservations and
concurrency are worked out from DeepSeek-V4-Pro's config.json and the 0.34
wheel's rules, quoted next to each step, and compared with the plan.

- Pages (v1/kv_cache_interface.py AttentionSpec.page_size_bytes and
  _apply_alignment_padding): (block / tokens per state) x bytes per state,
  rounded up to 576 B (fp8_ds_mla). SWA cache: block 64, 584 B a token
  (models/deepseek_v4 sparse_swa.py DeepseekV4SWACache); compressed KV: block 256
  (the DSv4 backends take only 256), one 584 B state per 4 or 128 tokens;
  indexer keys: 132 B per 4 tokens; compressor states (compressor.py
  CompressorStateCache): 2 x coff x head_dim fp32 values a token, block 4 (ratio 4)
  or 8 (ratio 128), window coff x ratio.
- Groups (v1/core/kv_cache_planning.py _get_packed_kv_cache_groups): buckets by
  type and block size, SWA 61 layers, MLA 91 (31 C128 + 30 C4 + 30 indexer),
  C128 states 31, C4 states 30 + 30; repeats per group = _approximate_gcd([61, 31,
  30], lower bound 30) = 31, so the SWA bucket splits into layers[0::2] and
  layers[1::2].
- Per stage (_project_kv_cache_groups_to_worker, _get_kv_cache_bytes_per_block):
  a block costs the widest group's pages on that stage's rank.
- Per request (SlidingWindowSpec.max_admission_blocks_per_request,
  FullAttentionSpec.max_memory_usage_bytes, config/vllm.py max_in_flight_tokens):
  sliding windows cdiv(min(window - 1 + in_flight, L), block) + 1 with in_flight =
  (PP + 1 with async scheduling, else PP) x max-num-batched-tokens; compressed
  cdiv(L, 256).
- Concurrency (v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config):
  num_blocks / sum over groups, num_blocks the minimum over stages of KV bytes //
  bytes per block (get_kv_cache_configs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.planning import PlanRequest, make_plan

CONFIG = json.loads((Path(__file__).parent.parent / "infra/catalog/model_configs/deepseek-v4-pro.json").read_text())
L = 131072


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad(x: int) -> int:
    return cdiv(x, 576) * 576


SWA = pad(64 * 584)  # 37,440
C4 = pad(256 // 4 * 584)  # 37,440
C128 = pad(256 // 128 * 584)  # 1,728
INDEXER = pad(256 // 4 * (128 + 128 // 128 * 4))  # 8,640
C4_STATE = pad(4 * 2 * 2 * 512 * 4)  # 32,832
C4_INDEXER_STATE = pad(4 * 2 * 2 * 128 * 4)  # 8,640
C128_STATE = pad(8 * 2 * 1 * 512 * 4)  # 32,832


def _stages() -> list[range]:
    # vllm/distributed/utils.py get_pp_indices: 61 layers over 4 stages -> 15, 15, 16, 15.
    counts, out, start = [15, 15, 16, 15], [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def _bytes_per_block(layers: range) -> int:
    ratios = CONFIG["compress_ratios"]
    even = sum(SWA for i in layers if i % 2 == 0)  # SWA group 0: layers 0, 2, ..., 60
    odd = sum(SWA for i in layers if i % 2 == 1)  # SWA group 1: layers 1, 3, ..., 59
    mla = sum(C4 + INDEXER if ratios[i] == 4 else C128 for i in layers)
    c128 = sum(C128_STATE for i in layers if ratios[i] == 128)
    c4 = sum(C4_STATE + C4_INDEXER_STATE for i in layers if ratios[i] == 4)
    return max(even, odd, mla, c128, c4)


def _per_request(in_flight: int) -> list[int]:
    window = CONFIG["sliding_window"]
    swa = cdiv(min(window - 1 + in_flight, L), 64) + 1
    compressed = cdiv(L, 256)
    c128_state = cdiv(min(1 * 128 - 1 + in_flight, L), 8) + 1
    c4_state = cdiv(min(2 * 4 - 1 + in_flight, L), 4) + 1
    return [swa, swa, compressed, c128_state, c4_state]


def _prod(**kw) -> PlanRequest:
    # Prod's layout, TP 8 x PP 4 (what its SLA objective picks; without a workload the planner
    # would hold more sequences with replicas sharing the experts).
    return PlanRequest(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4, max_model_len=L, **{"pp": 4, **kw})


def test_layer_counts_from_the_config():
    ratios = CONFIG["compress_ratios"][: CONFIG["num_hidden_layers"]]
    assert (ratios.count(4), ratios.count(128)) == (30, 31)
    assert [_bytes_per_block(s) for s in _stages()] == [336_384, 336_384, 382_464, 380_736]


@pytest.mark.parametrize("knobs", [dict(), dict(max_num_batched_tokens=8192, async_scheduling=True)], ids=["searched", "vllm-defaults"])
def test_prod_groups_and_concurrency_by_hand(knobs):
    plan = make_plan(_prod(**knobs))
    data = plan.to_json_dict()
    assert plan.feasible and (plan.layout.tp, plan.layout.pp) == (8, 4)
    v = data["vllm"]
    in_flight = (4 + (1 if v["async_scheduling"] else 0)) * v["max_num_batched_tokens"]
    per_request = _per_request(in_flight)

    groups = data["kv_cache"]["groups"]
    assert [(g["kind"], g["layers"], g["block_size"]) for g in groups] == [
        ("sliding_window", 31, 64),
        ("sliding_window", 30, 64),
        ("compressed+indexer", 91, 256),
        ("compressor_state", 31, 8),
        ("compressor_state", 60, 4),
    ]
    assert [g["layer_page_bytes"] for g in groups] == [[SWA], [SWA], [C128, INDEXER, C4], [C128_STATE], [C4_INDEXER_STATE, C4_STATE]]
    assert [g["blocks_per_request"] for g in groups] == per_request

    blocks = min(stage.kv_cache_bytes // _bytes_per_block(layers) for stage, layers in zip(plan.stages, _stages()))
    assert data["kv_cache"]["num_blocks"] == blocks
    assert data["kv_cache"]["blocks_per_request"] == sum(per_request)
    assert data["kv_cache"]["max_concurrency"] == pytest.approx(blocks / sum(per_request), rel=1e-12)
    # stage 2 (16 layers) binds, as vLLM's minimum over workers
    assert data["per_rank"]["stage"] == 2 and data["kv_cache"]["bytes_per_block"] == 382_464


def test_the_issue_figures_at_vllm_defaults():
    # TP8 x PP4, 8,192 batched tokens, async scheduling (the Ray executor's default in 0.34):
    # each request keeps window - 1 + 5 x 8,192 = 41,087 tokens of sliding window, 643 blocks of
    # 64; on stage 2 (16 layers) that is 643 x 37,440 B x 16 = 385 MB per request.
    plan = make_plan(_prod(max_num_batched_tokens=8192, async_scheduling=True))
    swa = plan.to_json_dict()["kv_cache"]["groups"][0]
    assert swa["blocks_per_request"] == 643 == cdiv(127 + 5 * 8192, 64) + 1
    assert 643 * SWA * 16 == pytest.approx(385e6, rel=0.001)
    # the old plan's 215 sequences at 131,072 ignored these reservations
    assert plan.evaluation.max_concurrency < 110


def test_the_search_picks_the_batch_knobs_and_says_why():
    plan = make_plan(_prod())
    data = plan.to_json_dict()
    defaults = make_plan(_prod(max_num_batched_tokens=8192, async_scheduling=True))
    assert plan.evaluation.max_concurrency > 1.1 * defaults.evaluation.max_concurrency
    (note,) = data["vllm"]["notes"]
    assert "--max-num-batched-tokens" in note and "in-flight tokens" in note
    args = data["vllm_args"]
    assert args[args.index("--max-num-batched-tokens") + 1] == str(data["vllm"]["max_num_batched_tokens"])
    if not data["vllm"]["async_scheduling"]:
        assert "--no-async-scheduling" in args
    # vLLM refuses max-num-seqs above max-num-batched-tokens
    assert plan.max_num_seqs <= data["vllm"]["max_num_batched_tokens"]


def test_speculative_mtp_joins_the_sliding_window_group_and_counts_its_weights():
    base = make_plan(_prod(max_num_batched_tokens=2048, async_scheduling=False))
    mtp = make_plan(_prod(max_num_batched_tokens=2048, async_scheduling=False, speculative_method="mtp", num_speculative_tokens=2))
    data = mtp.to_json_dict()
    # The MTP layer (compress ratio 0: sliding window only) is is_draft, which does not count for
    # equality: it joins the odd-layer SWA group on the last stage (62 SWA layers -> 31 + 31).
    assert [g["layers"] for g in data["kv_cache"]["groups"]] == [31, 31, 91, 31, 60]
    # its weights, caches and graphs are on the last stage only
    assert mtp.stages[3].weights_bytes > base.stages[3].weights_bytes
    assert mtp.stages[3].cudagraph_bytes > base.stages[3].cudagraph_bytes
    assert [s.weights_bytes for s in mtp.stages[:3]] == [s.weights_bytes for s in base.stages[:3]]
    args = data["vllm_args"]
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 2}
    assert data["vllm"]["speculative"] == spec
    assert mtp.deployment().serve.vllm_args == tuple(args)


def test_speculative_needs_mtp_layers():
    from infra.errors import UserError

    with pytest.raises(UserError, match="multi-token-prediction"):
        make_plan(PlanRequest(model="llama-3.1-70b", instance_type="p5.48xlarge", nodes=1, speculative_method="mtp"))
    with pytest.raises(UserError, match="speculative method"):
        make_plan(_prod(speculative_method="eagle"))
    with pytest.raises(UserError, match="needs a speculative method"):
        make_plan(_prod(num_speculative_tokens=2))
