"""Parsers of Hugging Face `config.json` files, one module per model family.

`PARSERS` maps the text model's `model_type` to the function that turns its
config into a `ModelArch`; `infra.catalog.models.parse_config` dispatches on it.
"""

from __future__ import annotations

from infra.catalog.families.deepseek import parse_deepseek_v3, parse_deepseek_v4
from infra.catalog.families.gqa import parse_gpt_oss, parse_gqa_dense, parse_gqa_moe
from infra.catalog.families.kimi import parse_kimi_linear

PARSERS = {
    "llama": parse_gqa_dense,
    "mistral": parse_gqa_dense,
    "qwen2": parse_gqa_dense,
    "qwen3": parse_gqa_dense,
    "qwen3_moe": parse_gqa_moe,
    "mixtral": parse_gqa_moe,
    "gpt_oss": parse_gpt_oss,
    "deepseek_v3": parse_deepseek_v3,
    "kimi_k2": parse_deepseek_v3,
    "deepseek_v32": parse_deepseek_v3,
    "deepseek_v4": parse_deepseek_v4,
    "kimi_linear": parse_kimi_linear,
}
