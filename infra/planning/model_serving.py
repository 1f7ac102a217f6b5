"""Per-model `vllm serve` flags: chat rendering, reasoning, tool calls, remote code, text only.

`model_args(arch)` is what a model needs beyond the layout's arguments
(`serving.vllm_args`) so that an OpenAI client gets chat with the reasoning
split out (`message.reasoning`) and tool calls (`tools`, `tool_choice: auto`).
Each entry was read in the pinned release's source (`VERIFIED_RELEASE`; paths
below are inside its wheel's `vllm/` package) and in the model's page of
vllm-project/recipes (`models/<org>/<model>.yaml`), and every name is checked
against the release's registries by tests/test_model_serving.py (the flag
reference, infra/catalog/vllm/).

- Tokenizer mode: 0.34's `config/model.py::ModelConfig.__post_init__` already
  turns `auto` into the model's own mode by architecture; it is passed anyway
  so the chat rendering stays the one verified here if that default moves.
  Neither model ships a Jinja chat template: `tokenizers/deepseek_v4.py`
  renders DeepSeek-V4 with the in-tree encoder, `renderers/kimi_k3.py` renders
  Kimi K3 through the tokenizer's own `encoding_k3`.
- Reasoning and tool-call parsers: the names registered in
  `reasoning/__init__.py::_REASONING_PARSERS_TO_REGISTER` and
  `tool_parsers/__init__.py::_TOOL_PARSERS_TO_REGISTER`. Without
  `--enable-auto-tool-choice` the server refuses `tool_choice: auto`; it
  requires `--tool-call-parser` (`entrypoints/common/cli_args.py`,
  `validate_parsed_serve_args`, `validate_api_server_args`).
- `--trust-remote-code` only where the release still runs the checkpoint's
  code. DeepSeek-V4: the config is native in transformers (>= 5.16.1, which
  0.34 requires), the model is in-tree, the tokenizer is `TokenizersBackend`
  plus the in-tree encoder, and the published config.json has no `auto_map`:
  nothing remote runs, so the flag is left out (the recipe's base_args still
  carry it). Kimi K3: the config is in vLLM's `_CONFIG_REGISTRY`
  (`transformers_utils/config.py`, which then loads it with remote code off
  whatever the flag says, so the checkpoint's `auto_map` config class never
  runs), the model is in-tree, but the tokenizer is the repository's custom
  tiktoken `TikTokenTokenizer` loaded through `AutoTokenizer`
  (`tokenizers/registry.py`: kimi_k3 -> `CachedHfTokenizer`, `tokenizers/hf.py`
  refuses it without remote code). The files it runs are the staged checkpoint's,
  pinned by its revision.
- `--language-model-only` when the plan counts only the text model of a
  multimodal checkpoint (`ModelArch.multimodal_parts_left_out`, Kimi K3's vision
  tower and projector): `config/multimodal.py` sets every modality limit to 0
  and `model_executor/models/interfaces.py::_mark_tower_model` then allocates no
  tower weights and profiles no encoder, so the memory the plan computed is the
  memory vLLM uses. Image inputs are refused.

Left to the release's defaults on purpose: `--kv-cache-dtype auto` on
DeepSeek-V4 resolves to `fp8_ds_mla` on the FlashMLA path (H100;
`models/deepseek_v4/attention.py::_resolve_dsv4_kv_cache_dtype`), which is what
the recipe's `--kv-cache-dtype fp8` ends in too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from infra.catalog.arch import ModelArch

VERIFIED_RELEASE = "0.34.0"


@dataclass(frozen=True)
class ModelServing:
    tokenizer_mode: str
    reasoning_parser: str
    tool_call_parser: str
    trust_remote_code: bool
    recipe: str  # the vllm-project/recipes page read with the source


_DEEPSEEK_V4 = ModelServing("deepseek_v4", "deepseek_v4", "deepseek_v4", False, "models/deepseek-ai/DeepSeek-V4-Pro.yaml")
_KIMI_K3 = ModelServing("kimi_k3", "kimi_k3", "kimi_k3", True, "models/moonshotai/Kimi-K3.yaml")

# By the config's architecture (what vLLM dispatches on).
BY_ARCHITECTURE: dict[str, ModelServing] = {
    "DeepseekV4ForCausalLM": _DEEPSEEK_V4,  # DeepSeek-V4-Pro and -Flash
    "KimiK3ForConditionalGeneration": _KIMI_K3,
}


def model_serving(arch: ModelArch) -> Optional[ModelServing]:
    for name in arch.architectures:
        if name in BY_ARCHITECTURE:
            return BY_ARCHITECTURE[name]
    return None


def model_args(arch: ModelArch) -> list[str]:
    """The model's own `vllm serve` flags (empty for a model without an entry and without left-out parts)."""
    args: list[str] = []
    entry = model_serving(arch)
    if entry is not None:
        args += ["--tokenizer-mode", entry.tokenizer_mode]
        if entry.trust_remote_code:
            args.append("--trust-remote-code")
        args += [
            "--reasoning-parser", entry.reasoning_parser,
            "--enable-auto-tool-choice",
            "--tool-call-parser", entry.tool_call_parser,
        ]  # fmt: skip
    if arch.multimodal_parts_left_out:
        args.append("--language-model-only")
    return args
