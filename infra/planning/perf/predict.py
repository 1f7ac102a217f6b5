"""One prediction: a model on some GPUs in one layout, under a load.

`setup` builds what the simulation needs from the same pieces the plan uses: the
memory planner's evaluation of the layout (KV blocks, groups and per-request
reservations of the pinned vLLM release: infra/planning/layout.py) and the
step-time model of its stages (ops.py, step.py). `run` drives the scheduler
simulation (scheduler.py) with a workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from infra.catalog import vllm as vllm_reference
from infra.catalog.arch import ModelArch
from infra.catalog.instances import InstanceType
from infra.errors import UserError
from infra.planning import cudagraph, kv_cache, memory, serving
from infra.planning.layout import Evaluation, Knobs, Layout, evaluate, layout_errors, model_runner_v2, shares_moe_layers
from infra.planning.model_serving import model_serving
from infra.planning.perf.fitted import DEFAULT, Efficiency
from infra.planning.perf.hardware import Hardware
from infra.planning.perf.ops import model_stages
from infra.planning.perf.scheduler import KVPool, SimResult, simulate
from infra.planning.perf.step import StepModel
from infra.planning.perf.workload import Latency, Workload
from infra.planning.vllm_release import PINNED, release

# Default acceptance of one MTP-drafted token: DeepSeek-V3 Technical Report (arXiv
# 2412.19437), section 5.4.3: "the acceptance rate of the second token prediction
# ranges between 85% and 90%"; the lower end is taken. ASSUMPTION: the same for V4.
DEFAULT_MTP_ACCEPTANCE = 0.85


@dataclass(frozen=True)
class Serving:
    """The engine's knobs for a prediction; None: vLLM's default for the release and GPU."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    async_scheduling: bool | None = None
    num_speculative_tokens: int = 0
    acceptance_rate: float = DEFAULT_MTP_ACCEPTANCE
    vllm_version: str | None = None
    tokenizer_mode: str | None = None  # None: the stack's own for the model (tokenizer_mode)


@dataclass(frozen=True)
class Setup:
    arch: ModelArch
    hw: Hardware
    layout: Layout
    knobs: Knobs
    evaluation: Evaluation
    step: StepModel
    pool: KVPool
    serving: Serving

    @property
    def gpus(self) -> int:
        return self.layout.tp * self.layout.pp * self.layout.dp


def _host(hw: Hardware, gpus: int) -> tuple[InstanceType, int]:
    """The instance type the memory planner evaluates on, and the node count: the real one
    when the hardware names one, else nodes of the GPU as `hw` describes them."""
    from infra.catalog.instances import get_instance_type

    per_node = hw.gpus_per_node if gpus >= hw.gpus_per_node else gpus
    base = get_instance_type(hw.instance) if hw.instance else None
    if base is None or base.gpu_count != per_node:
        base = InstanceType(
            name=f"{per_node} x {hw.gpu.name}", gpu=hw.gpu, gpu_count=per_node, vcpus=0, memory_bytes=0,
            network_cards=1, max_efa_interfaces=1 if hw.network_bytes_per_s else 0, network_bandwidth_gbps=0,
            local_nvme_bytes=0, gpu_memory_mib_ec2=0, price_usd_per_hour=0.0, price_date="", price_source="",
        )  # fmt: skip
    return base, max(1, math.ceil(gpus / per_node))


def setup(arch: ModelArch, hw: Hardware, srv: Serving, eff: Efficiency = DEFAULT) -> Setup:
    """Refuses (UserError, one line) a layout vLLM would not run or whose memory does not fit."""
    r = release(srv.vllm_version)
    gpu = hw.gpu
    itype, nodes = _host(hw, srv.tp * srv.pp * srv.dp)
    if srv.tp * srv.pp * srv.dp != nodes * itype.gpu_count:
        raise UserError(f"TP {srv.tp} x PP {srv.pp} x DP {srv.dp} = {srv.tp * srv.pp * srv.dp} GPUs do not fill "
                        f"whole {hw.gpus_per_node}-GPU nodes of {hw.instance or gpu.name}")  # fmt: skip
    for flag, value in (("--max-model-len", srv.max_model_len), ("--max-num-seqs", srv.max_num_seqs),
                        ("--max-num-batched-tokens", srv.max_num_batched_tokens)):  # fmt: skip
        if value is not None and value < 1:  # config/scheduler.py: ge=1 (0.34's --max-model-len -1, fit to memory, not modelled)
            raise UserError(f"{flag} must be at least 1, got {value}")
    max_len = srv.max_model_len or min(arch.max_position_embeddings or serving.DEFAULT_MAX_MODEL_LEN_CAP,
                                       serving.DEFAULT_MAX_MODEL_LEN_CAP)  # fmt: skip
    batched, seqs = serving.batch_knobs(srv.max_num_batched_tokens, srv.max_num_seqs, max_len, gpu.visible_memory_bytes,
                                        gpu.name, r)  # fmt: skip
    knobs = Knobs(
        gpu_memory_utilization=srv.gpu_memory_utilization or r.default_gpu_memory_utilization,
        max_model_len=max_len,
        max_num_batched_tokens=batched,
        max_num_seqs=seqs,
        release=r,
        async_scheduling=r.async_scheduling(ray=nodes > 1) if srv.async_scheduling is None else srv.async_scheduling,
        num_speculative_tokens=srv.num_speculative_tokens,
    )
    if knobs.max_num_batched_tokens < knobs.max_num_seqs:  # SchedulerConfig (0.10: config.py; 0.11+: config/scheduler.py)
        seqs = f"--max-num-seqs {knobs.max_num_seqs}" if srv.max_num_seqs else \
            f"vLLM {r.version}'s default --max-num-seqs for {gpu.name} ({knobs.max_num_seqs})"
        raise UserError(f"--max-num-batched-tokens {knobs.max_num_batched_tokens} is below {seqs}: vLLM refuses "
                        "fewer batched tokens than sequences; give --max-num-seqs at most the batched tokens")  # fmt: skip
    if srv.tokenizer_mode and srv.tokenizer_mode not in known_tokenizer_modes(r.version):
        raise UserError(f"tokenizer mode {srv.tokenizer_mode!r} is not one vLLM {r.version} takes: "
                        + ", ".join(sorted(known_tokenizer_modes(r.version))))  # fmt: skip
    if srv.num_speculative_tokens and not arch.mtp_layers:
        raise UserError(f"{arch.name} has no multi-token-prediction layers: speculative method mtp needs them")
    layout = Layout(srv.tp, srv.pp, srv.dp, srv.expert_parallel, srv.kv_cache_dtype)
    errors = layout_errors(arch, itype, nodes, layout)
    ev = evaluate(arch, itype, nodes, layout, knobs) if not errors else None
    if errors or not ev.feasible:
        raise UserError(f"the memory plan refuses TP {srv.tp} x PP {srv.pp} x DP {srv.dp} on {gpu.name}: "
                        + "; ".join(errors or ev.errors))  # fmt: skip
    kv_bytes = memory.kv_element_bytes(layout.kv_cache_dtype, arch.model_dtype)
    moe_dp = srv.dp if shares_moe_layers(arch, layout) else 1
    stages = model_stages(arch, tp=srv.tp, pp=srv.pp, gpu=gpu, expert_parallel=srv.expert_parallel, kv_bytes=kv_bytes,
                          speculative=bool(srv.num_speculative_tokens), release=r, dp=moe_dp)  # fmt: skip
    sizes = cudagraph.capture_sizes(
        r, max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens,
        decode_query_len=1 + srv.num_speculative_tokens, sm100=gpu.compute_capability.startswith("10"),
        ceiling=cudagraph.model_ceiling(r, arch.model_type),
    )  # fmt: skip
    step = StepModel(
        stages, hw, tp=srv.tp, eff=eff, async_scheduling=knobs.async_scheduling, graph_max_tokens=max(sizes),
        # vLLM's PP send carries the hidden states and the residual (IntermediateTensors), bf16.
        hop_bytes_per_token=2 * arch.hidden_size * 2,
        hop_over_network=srv.pp > 1 and srv.tp * srv.pp > hw.gpus_per_node,
        num_speculative_tokens=srv.num_speculative_tokens,
        # A MoE layer's dispatch gathers each token's bf16 hidden state, its top-k weights
        # (fp32) and ids (int32; fused_moe/router/fused_topk_router.py fused_topk), and its
        # combine returns the bf16 output (AgRsAll2AllManager).
        moe_dp=moe_dp, exchange_bytes_per_token=2 * arch.hidden_size * 2 + 8 * arch.experts_per_token,
        exchange_over_network=srv.tp * moe_dp > hw.gpus_per_node,
    )  # fmt: skip
    return Setup(arch, hw, layout, knobs, ev, step, _pool(ev), srv)


def _pool(ev: Evaluation) -> KVPool:
    """The layout's KV blocks, and what one request holds with N tokens of which `in_flight`
    are being computed: each group's blocks at that length (kv_cache.request_blocks), a sliding
    window only its window and those tokens. vLLM frees the blocks a window has passed at each
    allocate_slots (v1/core/single_type_kv_cache_manager.py SlidingWindowManager.remove_skipped_blocks,
    called from kv_cache_manager.py allocate_slots; 0.11.0 and 0.34.0). Admission charges the
    same count at its own tokens in flight (the planner's Admission.sliding_tokens).
    ASSUMPTION: 0.34 frees on the processed-token basis (less the tokens of steps still in
    flight, a few a batch with async scheduling or PP): left out, under a block."""
    groups, adm, r = list(ev.kv.groups), ev.admission, ev.knobs.release

    @lru_cache(maxsize=65536)
    def held_for(tokens: int, in_flight: int) -> int:
        return kv_cache.request_blocks(groups, replace(adm, sliding_tokens=in_flight), release=r, max_len=max(1, tokens))

    def blocks_for(tokens: int) -> int:
        return held_for(tokens, adm.sliding_tokens)

    return KVPool(num_blocks=ev.num_blocks, blocks_for=blocks_for, held_for=held_for)


def run(s: Setup, workload: Workload, *, concurrency: int | None, request_rate: float | None, num_prompts: int,
        seed: int = 0, prefix_cache_hit_rate: float = 0.0) -> SimResult:  # fmt: skip
    """Simulate vLLM serving `num_prompts` requests of `workload` under the load.

    The API server takes requests in, `frontend_intake(s)` of its time each
    (chat template, tokenizing), sharing its one event loop among those it holds
    (workload.Client): a burst reaches the engine together, after all of it is taken in. Its time
    that does not queue (`request_overhead(s)`) is added to every TTFT. With DP, from 0.15 each
    replica has its own API server, up to 0.14 one takes every replica's requests in
    (Release.api_servers): the simulated replica's share of the burst then waits on the others'
    intake too, each request `dp` times as long.

    A MoE model's replicas run their MoE layers together: a closed loop of fewer requests than
    replicas leaves the rest idle (StepModel.at_load)."""
    step = s.step.at_load(concurrency) if concurrency is not None else s.step
    res = simulate(
        step, s.pool, workload, concurrency=concurrency, request_rate=request_rate, num_prompts=num_prompts,
        seed=seed, prefix_hit_rate=prefix_cache_hit_rate, **_engine_args(s),
    )  # fmt: skip
    extra_ms = request_overhead(s) * 1000
    ttft = res.ttft_ms
    return replace(res, ttft_ms=Latency(ttft.mean + extra_ms, ttft.p50 + extra_ms, ttft.p90 + extra_ms, ttft.p99 + extra_ms))


def _engine_args(s: Setup) -> dict:
    """What `simulate` takes from the setup besides its step model and KV pool."""
    k = s.knobs
    return dict(
        max_num_seqs=k.max_num_seqs, max_num_batched_tokens=k.max_num_batched_tokens, max_model_len=k.max_model_len,
        async_scheduling=k.async_scheduling, num_speculative_tokens=k.num_speculative_tokens,
        acceptance_rate=s.serving.acceptance_rate, dp=s.layout.dp, reserve_full_input=k.release.reserve_full_input,
        max_concurrent_batches=k.release.max_concurrent_batches(
            s.layout.pp, async_scheduling=k.async_scheduling, mrv2=model_runner_v2(s.arch, k.release)),
        frontend_s=frontend_intake(s) * s.layout.dp / k.release.api_servers(s.layout.dp),
        prefix_caching=prefix_cache_reuse(s.evaluation),
    )  # fmt: skip


# Tokenizer modes whose tokenizer renders a conversation to token ids in its own code, with no
# chat template: DeepSeek-V3.2's (0.13.0 tokenizers/deepseek_v32.py DeepseekV32Tokenizer
# apply_chat_template: encode_messages, then encode, called synchronously by serving_engine.py
# _preprocess_chat, which then skips the micro-batching tokenizer), DeepSeek-V4's (0.34.0
# tokenizers/deepseek_v4.py, renderers/deepseek_v4.py) and V4.1's (renderers/deepseek_v4.py
# DeepseekV41Renderer, the same renderer over its own encoding).
ENCODED_TOKENIZER_MODES = frozenset({"deepseek_v32", "deepseek_v4", "deepseek_v41"})


# Tokenizer modes of releases older than any flag reference in the repo (0.13.0 config/model.py
# TokenizerMode: auto, hf, slow, mistral, deepseek_v32).
OLDER_TOKENIZER_MODES = frozenset({"hf", "slow", "mistral", "deepseek_v32"})


def known_tokenizer_modes(version: str) -> frozenset[str]:
    """The --tokenizer-mode values a release takes, as its flag reference lists them (`auto`
    among them) when the repo has one; else those of the pinned release and of the older
    releases (above), the repo having no reference to tell which of them this one takes."""
    if version in vllm_reference.known_releases():
        return frozenset(vllm_reference.flag_values(version, "--tokenizer-mode"))
    return frozenset({*vllm_reference.flag_values(PINNED, "--tokenizer-mode"), *OLDER_TOKENIZER_MODES})


def tokenizer_mode(s: Setup) -> str:
    """The server's --tokenizer-mode: the one given; else the stack's own for the model
    (model_serving); else `auto` as the release resolves it for the model's architecture
    (registries.auto_tokenizer_modes of its flag reference, where the repo has one)."""
    if s.serving.tokenizer_mode:
        mode = s.serving.tokenizer_mode
    else:
        entry = model_serving(s.arch)
        mode = entry.tokenizer_mode if entry is not None else "auto"
    version = s.knobs.release.version
    if mode == "auto" and version in vllm_reference.known_releases():
        auto = vllm_reference.load_reference(version)["registries"]["auto_tokenizer_modes"]
        mode = next((auto[name] for name in s.arch.architectures if name in auto), mode)
    return mode


def chat_path(s: Setup) -> str:
    """How the API server takes the model's chat requests in:
    - "harmony": gpt-oss's, rendered by openai_harmony and their output parsed by its streaming
      parser (vLLM's serving_chat.py picks the path by model_type "gpt_oss", `use_harmony`);
    - "encoded": rendered to token ids by the tokenizer's own code (ENCODED_TOKENIZER_MODES);
    - "template": the chat template (jinja) and the tokenizer, every other model's."""
    if s.arch.model_type == "gpt_oss":
        return "harmony"
    return "encoded" if tokenizer_mode(s) in ENCODED_TOKENIZER_MODES else "template"


def frontend_intake(s: Setup) -> float:
    """The API server's time to take one chat request in, on the model's chat path. ASSUMPTION:
    a conversation encoded by the tokenizer's own code takes harmony's (neither renders a chat
    template; no row of that path is a fit row, fitted.py)."""
    eff = s.step.eff
    return eff.frontend_intake_s if chat_path(s) == "template" else eff.frontend_intake_harmony_s


def request_overhead(s: Setup) -> float:
    """A request's time outside the engine that does not queue, added to its TTFT, on the
    model's chat path: harmony's, or the chat template's, whose output path the encoded one
    shares (the detokenizer and the model's reasoning parser)."""
    eff = s.step.eff
    return eff.request_overhead_harmony_s if chat_path(s) == "harmony" else eff.request_overhead_s


def prefix_cache_reuse(ev: Evaluation) -> bool:
    """Whether a preempted request finds its computed blocks in vLLM's prefix cache (on by
    default, config/cache.py enable_prefix_caching): modelled for full-attention, MLA and
    sliding-window groups. A sliding-window group hits where the window's last blocks are
    still cached (v1/core/single_type_kv_cache_manager.py SlidingWindowManager
    find_longest_cache_hit, in 0.10.2 as in 0.34.0; HybridKVCacheCoordinator pairs it with
    the full-attention hit; prefix caching stays on for such models, only Mamba hybrids
    turned it off in 0.10.2, model_executor/models/config.py). ASSUMPTION: DeepSeek-V4's
    compressed SWA caches and state (Mamba) groups keep no reusable prefix here (vLLM
    caches those only at block or checkpoint boundaries of their own)."""
    return bool(ev.kv) and all(g.first.spec in ("full", "mla", "sliding") for g in ev.kv.groups)


def with_efficiency(s: Setup, eff: Efficiency) -> Setup:
    """The same setup with other achieved fractions (the fit)."""
    return replace(s, step=s.step.with_efficiency(eff))
