"""infra/planning/model_serving.py: each model's chat, reasoning and tool-call flags, checked against the pinned release.

The names come from reading the release's source; here they are checked
against what the release registers (the flag reference generated from its
wheel), the catalog's published configs decide where remote code is needed,
and the plan's argv carries them for DeepSeek-V4 and Kimi K3.
"""

from __future__ import annotations

import json

import pytest

from infra.catalog import vllm as reference
from infra.catalog.models import CATALOG, load_model
from infra.config import load_stack_file
from infra.planning import model_serving
from infra.planning.plan import make_plan
from infra.planning.request import PlanRequest

REF = reference.load_reference(model_serving.VERIFIED_RELEASE)
REG = REF["registries"]
ENTRIES = sorted(model_serving.BY_ARCHITECTURE.items())


def test_the_table_was_verified_against_the_release_the_stacks_pin():
    for stack in ("prod", "test"):
        assert load_stack_file(stack).serving.vllm_version == model_serving.VERIFIED_RELEASE, (
            "a new vLLM release: check each model's entry in its source, then bump VERIFIED_RELEASE"
        )


@pytest.mark.parametrize("architecture, entry", ENTRIES, ids=[a for a, _ in ENTRIES])
def test_every_name_is_registered_in_the_release(architecture, entry):
    assert architecture in REG["architectures"], "the model class is in the release's registry (no remote model code)"
    assert entry.reasoning_parser in REG["reasoning_parsers"]
    assert entry.tool_call_parser in REG["tool_parsers"]
    assert entry.tokenizer_mode in REF["flags"]["--tokenizer-mode"]["values"]
    # The explicit mode is the one the release picks for the architecture itself.
    assert REG["auto_tokenizer_modes"][architecture] == entry.tokenizer_mode


def _catalog_configs(architecture: str) -> list[tuple[str, dict]]:
    from infra.catalog.models import CONFIG_DIR

    out = []
    for name, cat in CATALOG.items():
        if architecture in load_model(name).architectures:
            out.append((name, json.loads((CONFIG_DIR / cat.file).read_text())))
    return out


@pytest.mark.parametrize("architecture, entry", ENTRIES, ids=[a for a, _ in ENTRIES])
def test_remote_code_only_where_the_release_still_runs_the_checkpoints_code(architecture, entry):
    configs = _catalog_configs(architecture)
    assert configs, f"no catalog model has architecture {architecture}"
    for name, cfg in configs:
        if entry.trust_remote_code:
            # The config's auto_map class must never run: vLLM registers its own and loads it with remote code off.
            assert cfg["model_type"] in REG["config_model_types"], name
        else:
            # Without the flag nothing remote can be needed: no auto_map, a config transformers knows natively.
            assert "auto_map" not in cfg, name
            assert cfg["model_type"] not in REG["config_model_types"], name


def _plan(model: str, instance: str, nodes: int = 4):
    return make_plan(PlanRequest(model=model, instance_type=instance, nodes=nodes))


@pytest.mark.parametrize(
    "model, instance, parser, remote_code, text_only",
    [
        ("deepseek-v4-pro", "p5.48xlarge", "deepseek_v4", False, False),
        ("deepseek-v4-flash", "p5.48xlarge", "deepseek_v4", False, False),
        ("kimi-k3", "p5e.48xlarge", "kimi_k3", True, True),
    ],
)
def test_chat_with_reasoning_and_tools_is_configured(model, instance, parser, remote_code, text_only):
    plan = _plan(model, instance)
    assert plan.feasible, plan.errors
    args = plan.serving_args
    flags = dict(zip(args, args[1:]))
    assert flags["--reasoning-parser"] == flags["--tool-call-parser"] == flags["--tokenizer-mode"] == parser
    assert "--enable-auto-tool-choice" in args
    assert ("--trust-remote-code" in args) is remote_code
    assert ("--language-model-only" in args) is text_only
    assert reference.check_serve_argv(args, model_serving.VERIFIED_RELEASE) == []


def test_language_model_only_follows_what_the_plan_counts():
    k3 = load_model("kimi-k3")
    assert k3.multimodal_parts_left_out and any("vision tower" in n for n in k3.notes)
    assert "--language-model-only" not in model_serving.model_args(k3.with_(multimodal_parts_left_out=False))
    # Any model whose plan leaves its multimodal parts out gets it, with or without an entry of its own.
    other = load_model("qwen3-0.6b")
    assert model_serving.model_args(other) == []
    assert model_serving.model_args(other.with_(multimodal_parts_left_out=True)) == ["--language-model-only"]
