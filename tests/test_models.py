"""Model catalog: parameter counts against published figures, layer and cache
shapes, weight formats and the --weight-format override, loading errors.

Every expected figure below is copied from the source it names (a model card,
a vendor announcement), never from this code's output.
"""

from __future__ import annotations

import json
import re
import shutil
from fractions import Fraction

import pytest

from infra.catalog.arch import CacheDtype, Role, Shard
from infra.catalog.formats import FORMATS, get_format
from infra.catalog.models import (
    CATALOG,
    CONFIG_DIR,
    load_model,
    params_active,
    params_total,
    parse_config,
    weight_bytes,
    with_weight_format,
)
from infra.errors import UserError

_UNITS = {"T": 10**12, "B": 10**9, "GiB": 2**30}


def published(text: str) -> tuple[float, float]:
    """A published figure such as '1.6T' or '37B' and the half-unit of its last digit:
    '37B' stands for 36.5B..37.5B, '1.6T' for 1.55T..1.65T."""
    m = re.fullmatch(r"([0-9.]+)(T|B|GiB)", text)
    number, unit = m.group(1), _UNITS[m.group(2)]
    decimals = len(number.split(".")[1]) if "." in number else 0
    return float(number) * unit, 0.5 * 10**-decimals * unit


def assert_published(count: float, text: str, source: str, rel: float = 0.01) -> None:
    """Within 1% (or `rel`) of the figure, or within the rounding the figure itself carries."""
    value, half_unit = published(text)
    tolerance = max(rel * value, half_unit)
    assert abs(count - value) <= tolerance, (
        f"{count / 1e9:.2f}B vs published {text} ({source}); off by {100 * (count - value) / value:+.2f}%"
    )


# --- Parameter counts against the model cards ------------------------------------------


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-r1"])
def test_deepseek_v3_r1_671b_37b(name):
    # Model cards (huggingface.co/deepseek-ai/DeepSeek-V3, -R1): "671B total parameters with 37B
    # activated"; the repo's 685B "includes 671B of the Main Model weights and 14B of the
    # Multi-Token Prediction (MTP) Module weights". The MTP module's own embedding and LM head
    # copies (~1.9B) are left out of the count (vLLM shares the main model's), so 685B is met
    # within 1% rather than exactly. DeepSeek's activated figure leaves out the input embedding
    # table (with it the count would round to 38B).
    arch = load_model(name)
    assert_published(params_total(arch), "671B", "DeepSeek-V3 model card, MTP excluded")
    assert_published(params_total(arch, include_mtp=True), "685B", "DeepSeek-V3 model card, with MTP")
    assert_published(params_active(arch, include_embedding=False), "37B", "DeepSeek-V3 model card")
    assert len(arch.layers) == 61 and len(arch.mtp_layers) == 1


def test_deepseek_v4_flash_284b_13b():
    # Model card huggingface.co/deepseek-ai/DeepSeek-V4-Flash: 284B total, 13B activated.
    # The 3-digit 284B settles the MTP question for the V4 family: the main model alone is
    # within 0.2%; with the MTP layer the count is ~2.3% higher. So the published V4 totals,
    # like V3's 671B, exclude the MTP module.
    arch = load_model("deepseek-v4-flash")
    assert_published(params_total(arch), "284B", "DeepSeek-V4-Flash model card")
    value, _ = published("284B")
    assert params_total(arch, include_mtp=True) > 1.02 * value  # MTP is not in the figure
    assert_published(params_active(arch, include_embedding=False), "13B", "DeepSeek-V4-Flash model card")


def test_deepseek_v4_pro_1_6t_49b():
    # Model card huggingface.co/deepseek-ai/DeepSeek-V4-Pro: 1.6T total, 49B activated. The
    # figure has two significant digits (1.55T..1.65T); counted like Flash (MTP excluded, see
    # above) the main model is ~1.57T. Activated parameters without the input embedding, as
    # DeepSeek counts them (49B; with it the count rounds to 50B).
    arch = load_model("deepseek-v4-pro")
    assert_published(params_total(arch), "1.6T", "DeepSeek-V4-Pro model card, MTP excluded")
    assert_published(params_active(arch, include_embedding=False), "49B", "DeepSeek-V4-Pro model card")
    assert len(arch.layers) == 61 and len(arch.mtp_layers) == 1


def test_kimi_k2_1_04t_32b():
    # Kimi K2 technical report: 1.04T total, 32B activated (model card moonshotai/Kimi-K2-Instruct:
    # "1T total, 32B activated"). The config counts to ~1.026T, 1.3% under the report's 1.04T
    # (no MTP, no vision; the difference is unexplained), hence 1.5% here. Activated without the
    # input embedding, as DeepSeek-shaped models are counted.
    arch = load_model("kimi-k2")
    assert_published(params_total(arch), "1.04T", "Kimi K2 technical report", rel=0.015)
    assert_published(params_active(arch, include_embedding=False), "32B", "Kimi-K2-Instruct model card")


def test_llama_405b():
    # Model card meta-llama/Llama-3.1-405B: 405B.
    arch = load_model("llama-3.1-405b")
    assert_published(params_total(arch), "405B", "Llama 3.1 model card")
    assert params_active(arch) == params_total(arch)  # dense


def test_qwen3_235b_a22b():
    # Model card Qwen/Qwen3-235B-A22B: 235B total, 22B activated.
    arch = load_model("qwen3-235b-a22b")
    assert_published(params_total(arch), "235B", "Qwen3-235B-A22B model card")
    assert_published(params_active(arch), "22B", "Qwen3-235B-A22B model card")


def test_qwen3_30b_a3b():
    # Model card Qwen/Qwen3-30B-A3B: 30.5B total, 3.3B activated, 29.9B non-embedding. Counted
    # with embedding and LM head the activated parameters are ~3.35B, which the card appears to
    # truncate to 3.3B (1.6% apart; without the embedding it would be ~3.04B): 2% here.
    arch = load_model("qwen3-30b-a3b")
    assert_published(params_total(arch), "30.5B", "Qwen3-30B-A3B model card")
    assert_published(params_total(arch) - arch.embedding.count - arch.lm_head.count, "29.9B", "Qwen3-30B-A3B model card")
    value, _ = published("3.3B")
    assert abs(params_active(arch) - value) <= 0.02 * value


def test_mixtral_8x7b():
    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7B total parameters, 12.9B used per
    # token (Mistral counts the embedding: without it the count is 12.75B).
    arch = load_model("mixtral-8x7b")
    assert_published(params_total(arch), "46.7B", "Mistral AI announcement")
    assert_published(params_active(arch), "12.9B", "Mistral AI announcement")


def test_gpt_oss_120b():
    # OpenAI gpt-oss-120b model card: 116.83B total, 5.13B active per token (the card's active
    # count includes the unembedding but not the embedding); checkpoint 60.8 GiB (MXFP4 experts).
    arch = load_model("gpt-oss-120b")
    assert_published(params_total(arch), "116.83B", "gpt-oss model card")
    assert_published(params_active(arch, include_embedding=False), "5.13B", "gpt-oss model card")
    assert_published(weight_bytes(arch), "60.8GiB", "gpt-oss model card checkpoint size")
    assert arch.weight_format == "bf16+mxfp4 experts"


def test_qwen3_0_6b():
    # Model card Qwen/Qwen3-0.6B: 0.6B parameters, 0.44B non-embedding; tied embeddings.
    arch = load_model("qwen3-0.6b")
    assert arch.lm_head.count == 0
    assert_published(params_total(arch), "0.6B", "Qwen3-0.6B model card")
    assert_published(params_total(arch) - arch.embedding.count, "0.44B", "Qwen3-0.6B model card")


def test_kimi_k3_total():
    # Hugging Face model page moonshotai/Kimi-K3 and Moonshot's announcement: 2.8T parameters
    # (the vision tower, left out here, is well under 1B).
    assert_published(params_total(load_model("kimi-k3")), "2.8T", "moonshotai/Kimi-K3 model page")


# --- Weight bytes ------------------------------------------------------------------------


def test_kimi_k3_fp8_about_2_8_tb_and_mxfp4_much_less():
    arch = load_model("kimi-k3")
    fp8 = weight_bytes(with_weight_format(arch, "fp8"))
    own = weight_bytes(arch)
    assert 2.6e12 < fp8 < 3.0e12  # ~2.8T parameters at one byte (+ block scales)
    assert own < 1.7e12  # MXFP4 routed experts, bf16 rest
    assert own < 0.6 * fp8
    assert arch.weight_format == "bf16+mxfp4 experts"


def test_deepseek_v4_pro_fp4_experts_fp8_rest():
    # Checkpoint: routed experts FP4 (MXFP4, E8M0 scale per 32), everything else FP8 / bf16
    # (vLLM recipe for DeepSeek-V4-Pro: "MoE expert weights are stored in FP4 while the
    # remaining params stay in FP8"). Expected bytes worked out by hand from the config:
    # 61 layers x 384 experts x 3 x 7168 x 3072 routed parameters at 17/32 byte, plus the
    # remaining ~26B parameters (1.6T published minus the experts) at 1 to 2 bytes.
    arch = load_model("deepseek-v4-pro")
    routed = 61 * 384 * 3 * 7168 * 3072
    expert_bytes = routed * 17 / 32
    total = weight_bytes(arch)
    assert expert_bytes < total < expert_bytes + 2 * 2 * 26e9
    routed_bytes = sum(
        g.count * Fraction(get_format(g.fmt).bytes_per_param)
        for layer in arch.layers
        for g in layer.params
        if g.role == Role.ROUTED_EXPERT
    )
    assert routed_bytes == pytest.approx(expert_bytes)
    assert routed_bytes / total > 0.95
    assert "fp8" in arch.weight_format and "mxfp4" in arch.weight_format
    groups = [g for layer in arch.layers for g in layer.params]
    assert {g.fmt for g in groups if g.role == Role.ROUTED_EXPERT} == {"mxfp4"}
    assert {g.fmt for g in groups if g.role == Role.SHARED_EXPERT} == {"fp8"}
    assert arch.embedding.fmt == "bf16" and arch.lm_head.fmt == "bf16"


def test_formats_true_cost():
    assert FORMATS["bf16"].bytes_per_param == 2
    assert FORMATS["fp8"].bytes_per_param == 1 + Fraction(4, 128 * 128)
    assert FORMATS["mxfp4"].bytes_per_param == Fraction(17, 32)
    assert FORMATS["nvfp4"].bytes_per_param == Fraction(9, 16)
    assert FORMATS["int4"].bytes_per_param == Fraction(1, 2) + Fraction(2, 128)
    assert FORMATS["fp32"].bytes_per_param == 4
    assert all(f.source for f in FORMATS.values())
    with pytest.raises(UserError, match="known weight formats"):
        get_format("fp6")


# --- The --weight-format override ---------------------------------------------------------


def _fmts(arch, role):
    return {g.fmt for layer in arch.layers for g in layer.params if g.role == role}


def test_override_4bit_on_moe_touches_routed_experts_only():
    arch = with_weight_format(load_model("deepseek-v3"), "nvfp4")
    assert _fmts(arch, Role.ROUTED_EXPERT) == {"nvfp4"}
    assert _fmts(arch, Role.ATTENTION) == {"fp8"}
    assert _fmts(arch, Role.SHARED_EXPERT) == {"fp8"}
    assert _fmts(arch, Role.DENSE_MLP) == {"fp8"}
    assert arch.weight_format == "fp8+nvfp4 experts"
    assert {g.fmt for g in arch.mtp_layers[0].params if g.role == Role.ROUTED_EXPERT} == {"nvfp4"}


def test_override_4bit_on_dense_touches_all_linear_layers():
    arch = with_weight_format(load_model("llama-3.1-70b"), "int4")
    assert _fmts(arch, Role.ATTENTION) == {"int4"}
    assert _fmts(arch, Role.DENSE_MLP) == {"int4"}
    assert _fmts(arch, Role.OTHER) == {"bf16"}  # norms stay
    assert arch.embedding.fmt == "bf16" and arch.lm_head.fmt == "bf16"


def test_override_bf16_or_fp8_touches_every_linear_layer_not_embeddings_or_routers():
    base = load_model("kimi-k3")
    arch = with_weight_format(base, "fp8")
    for role in (Role.ATTENTION, Role.DENSE_MLP, Role.SHARED_EXPERT, Role.ROUTED_EXPERT):
        assert _fmts(arch, role) == {"fp8"}
    assert _fmts(arch, Role.OTHER) == _fmts(base, Role.OTHER)  # norms, routers, conv, fp32 params
    assert arch.embedding == base.embedding and arch.lm_head == base.lm_head
    assert params_total(arch) == params_total(base)
    assert arch.weight_format == "fp8"


def test_override_unknown_format_is_a_user_error():
    with pytest.raises(UserError, match="unknown weight format 'fp6'.*mxfp4"):
        with_weight_format(load_model("qwen3-0.6b"), "fp6")


# --- Layer kinds and caches -----------------------------------------------------------------


def test_kimi_k3_layer_kinds_cover_every_layer_once():
    arch = load_model("kimi-k3")
    assert arch.model_type == "kimi_linear"
    assert [layer.index for layer in arch.layers] == list(range(93))
    kinds = [layer.attention for layer in arch.layers]
    assert kinds.count("kda") == 69 and kinds.count("mla") == 24
    # 1-based lists: full attention at layer numbers 4, 8, ..., 92 and 93
    mla = [layer.index + 1 for layer in arch.layers if layer.attention == "mla"]
    assert mla == list(range(4, 93, 4)) + [93]
    assert not arch.layers[0].moe and all(layer.moe for layer in arch.layers[1:])
    assert arch.tp_divides == (96,)
    assert any("vision" in note for note in arch.notes)


def test_kimi_k3_kda_state_is_per_sequence_and_mla_caches_576():
    arch = load_model("kimi-k3")
    for layer in arch.layers:
        if layer.attention == "kda":
            assert layer.caches and all(spec.per_sequence for spec in layer.caches)
            recurrent = [s for s in layer.caches if s.dtype == CacheDtype.FP32]
            assert len(recurrent) == 1
            assert recurrent[0].elements_per_entry == 128 * 128 and recurrent[0].sharded_heads == 96
        else:
            (spec,) = layer.caches
            assert spec.kind == "mla" and not spec.per_sequence
            assert spec.elements_per_entry == 512 + 64 and spec.sharded_heads == 0


def test_kimi_k3_latent_moe_counts_the_projections():
    arch = load_model("kimi-k3")
    layer = arch.layers[1]
    routed = sum(g.count for g in layer.params if g.role == Role.ROUTED_EXPERT)
    assert routed == 896 * 3 * 3584 * 3072  # experts work at routed_expert_hidden_size
    dense = [g for g in layer.params if g.role == Role.DENSE_MLP]
    assert sum(g.count for g in dense) == 2 * 7168 * 3584
    assert all(g.shard == Shard.REPLICATED and g.fmt == "bf16" for g in dense)
    shared = sum(g.count for g in layer.params if g.role == Role.SHARED_EXPERT)
    assert shared == 3 * 7168 * 3072 * 2


def test_deepseek_v4_layers_and_caches():
    arch = load_model("deepseek-v4-pro")
    ratios = json.loads((CONFIG_DIR / "deepseek-v4-pro.json").read_text())["compress_ratios"]
    assert len(ratios) == len(arch.layers) + len(arch.mtp_layers)
    for layer, ratio in zip(arch.layers, ratios):
        kinds = [spec.kind for spec in layer.caches]
        sliding = [s for s in layer.caches if s.kind == "sliding"]
        assert len(sliding) == 1 and sliding[0].window == 128
        if ratio == 4:
            assert "indexer" in kinds
            (indexer,) = [s for s in layer.caches if s.kind == "indexer"]
            assert indexer.compress_ratio == 4 and indexer.dtype == CacheDtype.FP8
        else:
            assert "indexer" not in kinds
        compressed = [s for s in layer.caches if s.kind == "compressed"]
        if ratio > 1:
            assert [s.compress_ratio for s in compressed] == [ratio]
        else:
            assert compressed == []
    assert arch.tp_divides == (128, 16)
    assert arch.num_kv_heads is None
    # the MTP layer (last compress_ratios entry, 0) keeps only the sliding window
    assert [s.kind for s in arch.mtp_layers[0].caches] == ["sliding"]
    # hash-routed first layers (num_hash_layers 3) carry a vocab x k token->expert table instead
    # of the routing correction bias
    table = 129280 * 6
    assert any(g.count == table for g in arch.layers[2].params)
    assert not any(g.count == table for g in arch.layers[3].params)


def test_deepseek_v4_flash_first_layers_window_only():
    arch = load_model("deepseek-v4-flash")
    assert [s.kind for s in arch.layers[0].caches] == ["sliding"]
    assert arch.layers[2].attention == "csa-4" and arch.layers[3].attention == "hca-128"


def test_deepseek_v3_mla_and_replicated_a_projections():
    arch = load_model("deepseek-v3")
    first, moe = arch.layers[0], arch.layers[3]
    assert not first.moe and moe.moe and all(layer.moe for layer in arch.layers[3:])
    (spec,) = moe.caches
    assert spec.kind == "mla" and spec.elements_per_entry == 576 and spec.sharded_heads == 0
    replicated = [g for g in moe.params if g.role == Role.ATTENTION and g.shard == Shard.REPLICATED]
    assert sum(g.count for g in replicated) == 7168 * 1536 + 7168 * (512 + 64)  # q_a + kv_a
    assert arch.weight_format == "fp8"
    router = [g for g in moe.params if g.role == Role.OTHER and g.count == 7168 * 256]
    assert [g.fmt for g in router] == ["bf16"]


def test_deepseek_v32_indexer_cache():
    arch = load_model("deepseek-v3.2")
    kinds = [s.kind for s in arch.layers[10].caches]
    assert kinds == ["mla", "indexer"]
    indexer = arch.layers[10].caches[1]
    assert indexer.elements_per_entry == 128 and indexer.extra_bytes_per_entry == 4
    assert params_total(arch) > params_total(load_model("deepseek-v3"))


def test_gpt_oss_alternates_sliding_and_full():
    arch = load_model("gpt-oss-120b")
    for layer in arch.layers:
        (spec,) = layer.caches
        if layer.index % 2 == 0:
            assert layer.attention == "sliding" and spec.window == 128
        else:
            assert layer.attention == "gqa" and spec.window is None
        assert spec.elements_per_entry == 2 * 64 and spec.sharded_heads == 8


def test_gqa_cache_is_k_and_v_per_kv_head():
    arch = load_model("llama-3.1-405b")
    (spec,) = arch.layers[0].caches
    assert spec.kind == "gqa" and spec.elements_per_entry == 2 * 128 and spec.sharded_heads == 8
    assert arch.tp_divides == (128,) and arch.num_kv_heads == 8


# --- Loading ----------------------------------------------------------------------------------


def test_bundled_configs_equal_reference_files(fixture_file):
    """Each bundled config is the published one (tests/fixtures/models/<org>--<repo>/config.json)."""
    for name, entry in CATALOG.items():
        reference = fixture_file("models", entry.hf_repo.replace("/", "--"), "config.json")
        assert json.loads((CONFIG_DIR / entry.file).read_text()) == json.loads(reference.read_text()), name


def test_bundled_quant_configs_equal_reference_files(fixture_file):
    """ModelOpt checkpoints' hf_quant_config.json, bundled next to their config.json."""
    entries = {name: e for name, e in CATALOG.items() if e.quant_file}
    assert entries
    for name, entry in entries.items():
        reference = fixture_file("models", entry.hf_repo.replace("/", "--"), "hf_quant_config.json")
        assert json.loads((CONFIG_DIR / entry.quant_file).read_text()) == json.loads(reference.read_text()), name


def test_quantised_checkpoints_have_their_own_entries():
    # The published FP8 checkpoint named by qwen3-235b-a22b's fp8 variant is a catalog model of
    # its own, read from its config.json (quantization_config: fp8, 128 x 128 blocks).
    assert CATALOG["qwen3-235b-a22b"].variants["fp8"] == CATALOG["qwen3-235b-a22b-fp8"].hf_repo
    assert CATALOG["qwen3-235b-a22b"].variants["nvfp4"] == CATALOG["qwen3-235b-a22b-nvfp4"].hf_repo
    arch = load_model("qwen3-235b-a22b-fp8")
    assert params_total(arch) == params_total(load_model("qwen3-235b-a22b"))
    assert_published(params_total(arch), "235B", "Qwen3-235B-A22B-FP8 model card")


def test_every_catalog_model_loads():
    for name in CATALOG:
        arch = load_model(name)
        assert arch.name == name and arch.layers and params_total(arch) > 0
        assert weight_bytes(arch) > 0


def test_load_by_file_and_directory(tmp_path):
    shutil.copy(CONFIG_DIR / "qwen3-0.6b.json", tmp_path / "config.json")
    by_dir = load_model(str(tmp_path))
    by_file = load_model(str(tmp_path / "config.json"))
    assert by_dir.layers == by_file.layers == load_model("qwen3-0.6b").layers
    assert by_file.source == str(tmp_path / "config.json")


def test_load_by_hf_repo_id():
    assert load_model("deepseek-ai/DeepSeek-V3").name == "deepseek-v3"


def test_unknown_name_lists_catalog():
    with pytest.raises(UserError, match="unknown model 'deepseek-v9'.*deepseek-v4-pro.*kimi-k3"):
        load_model("deepseek-v9")


def test_missing_file_and_empty_directory(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_model(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(UserError, match="has no config.json"):
        load_model(str(tmp_path))


def test_unsupported_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(UserError, match="unsupported model_type 'bert'.*deepseek_v4.*kimi_linear"):
        load_model(str(tmp_path))


def test_malformed_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", ')
    with pytest.raises(UserError, match="not valid JSON"):
        load_model(str(path))


def test_missing_key_is_a_user_error():
    cfg = json.loads((CONFIG_DIR / "llama-3.1-70b.json").read_text())
    del cfg["num_key_value_heads"]
    with pytest.raises(UserError, match="lacks 'num_key_value_heads'"):
        parse_config(cfg, "broken", "test")


def test_kda_lists_that_do_not_cover_the_layers_are_refused():
    cfg = json.loads((CONFIG_DIR / "kimi-k3.json").read_text())
    cfg["text_config"]["linear_attn_config"]["full_attn_layers"] = [4, 8]
    with pytest.raises(UserError, match="cover"):
        parse_config(cfg, "broken", "test")


# --- Pinned hub revisions (issue 19 item 6) ----------------------------------------------

# Catalog models with no commit found in an offline source yet. The list may only shrink: pin
# one (CatalogEntry.revision, with revision_source) and take it off here.
UNPINNED = {"llama-3.1-405b"}


def test_unpinned_catalog_models_are_exactly_the_listed_ones():
    from infra.catalog.models import CATALOG

    assert {name for name, e in CATALOG.items() if e.revision is None} == UNPINNED


def test_pinned_revisions_are_commits_with_their_source():
    from infra.catalog.models import CATALOG, pinned_revision

    for name, entry in CATALOG.items():
        if entry.revision is not None:
            assert re.fullmatch(r"[0-9a-f]{40}", entry.revision), name
            assert entry.revision in entry.revision_source and entry.hf_repo in entry.revision_source, name
            assert pinned_revision(entry.hf_repo.upper()) == entry.revision


def test_every_catalog_model_served_with_remote_code_has_a_pinned_revision():
    """The tokenizer or model code --trust-remote-code runs is the staged checkpoint's: pinned, never `main`."""
    from infra.catalog.models import CATALOG
    from infra.planning.model_serving import model_args

    remote = {name for name in CATALOG if "--trust-remote-code" in model_args(load_model(name))}
    assert remote == {"kimi-k3"}  # model_serving.py: Kimi K3's tiktoken tokenizer
    assert all(CATALOG[name].revision for name in remote)
