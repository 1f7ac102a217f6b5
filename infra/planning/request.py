"""What the planner is asked: the model, the hardware, and the serving knobs.

Every field left as None is decided by the planner. This is the single input of
`infra.planning.make_plan`; `infra.config` builds it from a stack's config and
the `plan` command builds it from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from infra.planning.performance import Sla, WorkloadSpec
from infra.planning.system_nodes import SystemNodes
from infra.planning.vllm_release import PINNED

Objective = Literal["sla-throughput-per-dollar", "max-kv", "min-cost"]

# `--gpu-memory-utilization` the stack accepts. ASSUMPTION: below 0.5 a GPU is mostly idle.
# Up to 1.0, vLLM's own bound (config/cache.py, CacheConfig.gpu_memory_utilization le=1) and
# 0.34's default with the extensible KV cache, which keeps its own margin below it; for a
# release without that cache the plan's headroom warning says when too little is left for
# the CUDA context and what vLLM does not count.
GPU_MEMORY_UTILIZATION_RANGE = (0.5, 1.0)
# vLLM's --kv-cache-dtype values the planner sizes (vllm/config/cache.py CacheDType in 0.11;
# 0.34's CacheDType still has each of them, and more the planner does not size).
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
WEIGHT_FORMAT_CHOICES = ("bf16", "fp8", "mxfp4", "nvfp4", "int4")
# Speculative decoding the planner accounts for: the model's own multi-token-
# prediction layers as the drafter (vLLM config/speculative.py method "mtp").
SPECULATIVE_METHODS = ("mtp",)
# What a request may say of speculative decoding: a drafter, or "off"; unset (None), the
# sla-throughput-per-dollar search tries the model's MTP layers with one draft token against
# none (sla_search.by_sla_throughput) and every other objective plans none.
SPECULATIVE_CHOICES = SPECULATIVE_METHODS + ("off",)


@dataclass(frozen=True)
class TcoInputs:
    """Monthly total cost of ownership by category, in USD per month.

    Categories are free-form so an operator can add their own (e.g. support
    contracts); the hourly cloud price is used when this is not given.
    """

    categories: dict[str, float] = field(default_factory=dict)

    @property
    def monthly_usd(self) -> float:
        return float(sum(self.categories.values()))


@dataclass(frozen=True)
class PlanRequest:
    model: str  # catalog name or path to a config.json / model directory
    instance_type: str | None  # None only with the min-cost objective: the planner picks
    nodes: int | None
    max_nodes: int | None = None  # min-cost without `nodes`: the most nodes the search may use
    tp: int | None = None
    pp: int | None = None
    expert_parallel: bool | None = None
    dp: int | None = None
    max_model_len: int | None = None  # default: min(model's max, 131072)
    # ASSUMPTION: 0.90, passed explicitly. vLLM 0.34 leaves it unset by default and then
    # requests 1.0 with the extensible KV cache (config/cache.py
    # CacheConfig.resolved_gpu_memory_utilization; 0.92 without it); the plan warns what
    # 0.90 keeps out of the cache.
    gpu_memory_utilization: float = 0.90
    max_num_batched_tokens: int | None = None  # default: vLLM's for the GPU
    max_num_seqs: int | None = None  # default: derived from KV capacity
    async_scheduling: bool | None = None  # default: vLLM's, unless turning it off admits markedly more
    vllm_version: str = PINNED  # the release whose accounting the plan follows (infra/planning/vllm_release.py)
    speculative_method: str | None = None  # "mtp": the model's MTP layers draft; "off"; None: searched (SPECULATIVE_CHOICES)
    num_speculative_tokens: int | None = None  # tokens drafted per step (1 with a method and no count)
    kv_cache_dtype: str | None = None  # None: the model's own ("auto"), FP8 only if that does not fit
    weight_format: str | None = None  # default: the checkpoint's own
    objective: Objective = "max-kv"  # the stack config's default is sla-throughput-per-dollar
    target_concurrency: int | None = None  # sequences at max-model-len (min-cost)
    cold_start_target_s: float = 600.0  # time to read all weights from storage
    storage_kind: str = "efs"  # the weight store ("efs" or "fsx"): what a cold start's reads cost
    tco: TcoInputs | None = None
    api_price_usd_per_mtok: float | None = None
    throughput_tokens_per_s: float | None = None  # measured cluster output tokens/s: the cost per token uses it
    # What the plan predicts against (infra/planning/performance.py); no SLA: no prediction.
    sla: Sla | None = None
    workload: WorkloadSpec | None = None
    duty_cycle: float = 1.0  # share of the month at the SLA capacity, for tokens per month
    predict_benchmark: bool = False  # the benchmark Job runs: predict what it will measure (one more simulation)
    # The system node group and the in-cluster Prometheus' retention: the plan checks the system pods fit
    # (infra/planning/system_nodes.py); None: not checked (a plan without a stack).
    system: SystemNodes | None = None

    def replace(self, **changes) -> "PlanRequest":
        return replace(self, **changes)
