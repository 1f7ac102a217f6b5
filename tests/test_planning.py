"""The planner against facts from outside the code: vLLM's layer split, published
KV sizes, the seed scenario, and the TCO example."""

from __future__ import annotations

import json
import re

import pytest

from infra.catalog.models import load_model
from infra.errors import UserError
from infra.planning import PlanRequest, TcoInputs, make_plan
from infra.catalog.instances import get_instance_type
from infra.planning import memory, serving
from infra.planning.memory import GiB
from infra.planning.cost import breakeven_tokens_per_month, cost_per_million_tokens

TB = 1e12


# --- Pipeline split: vLLM's get_pp_indices -----------------------------------


@pytest.mark.parametrize(
    "layers, pp, expected",
    [
        # vllm/distributed/utils.py get_pp_indices: DeepSeek-V3, 61 layers, PP4 -> 15, 15, 16, 15.
        (61, 4, [15, 15, 16, 15]),
        # vLLM tests/distributed/test_utils.py::test_get_pp_indices style cases:
        # the remainder goes to the stages before the last, nearest the end first.
        (62, 4, [15, 16, 16, 15]),
        (32, 4, [8, 8, 8, 8]),
        (93, 4, [23, 23, 24, 23]),
        (61, 1, [61]),
    ],
)
def test_split_layers_follows_vllm(layers, pp, expected):
    assert memory.split_layers(layers, pp) == expected


# --- KV bytes per token: published figures ------------------------------------


def test_mla_kv_is_replicated_on_every_tp_rank():
    # DeepSeek-V2 paper (MLA): the cache per token and layer is d_c + d_h^R =
    # 512 + 64 elements, whatever the head count; vLLM keeps it whole on each TP rank.
    arch = load_model("deepseek-v3")
    per_layer_bf16 = (512 + 64) * 2
    for tp in (1, 2, 8):
        assert memory.bytes_per_token(arch.layers, tp, 2) == per_layer_bf16 * 61


def test_gqa_kv_heads_are_sharded_then_replicated():
    # Llama-3.1-70B: 8 KV heads of 128 dims, 80 layers; K and V in bf16 = 320 KiB
    # per token on one GPU (the figure Meta's model card arithmetic gives).
    arch = load_model("llama-3.1-70b")
    assert memory.bytes_per_token(arch.layers, 1, 2) == 2 * 8 * 128 * 2 * 80
    assert memory.bytes_per_token(arch.layers, 8, 2) == 2 * 1 * 128 * 2 * 80
    # Qwen3-235B-A22B has 4 KV heads: past TP4 each rank still keeps one head.
    qwen = load_model("qwen3-235b-a22b")
    assert memory.bytes_per_token(qwen.layers, 8, 2) == memory.bytes_per_token(qwen.layers, 4, 2)
    assert memory.bytes_per_token(qwen.layers, 4, 2) * 2 == memory.bytes_per_token(qwen.layers, 2, 2)


def test_linear_attention_state_does_not_grow_with_length():
    arch = load_model("kimi-k3")
    kda = [l for l in arch.layers if l.attention == "kda"]
    assert kda
    short = memory.bytes_per_sequence(tuple(kda), 8, 2, 1024)
    long = memory.bytes_per_sequence(tuple(kda), 8, 2, 1_000_000)
    assert short == long > 0


# --- The seed scenario ------------------------------------------------------------


def _prod(**kw) -> PlanRequest:
    base = dict(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4, max_model_len=131072)
    base.update(kw)
    return PlanRequest(**base)


def test_deepseek_v4_pro_on_four_p5_at_tp8_pp4():
    plan = make_plan(_prod(pp=4))
    data = plan.to_json_dict()
    assert data["feasible"], data["errors"]
    assert (data["layout"]["tp"], data["layout"]["pp"], data["layout"]["dp"]) == (8, 4, 1)
    # vLLM's split of 61 layers over 4 stages.
    assert data["layout"]["layers_per_stage"] == [15, 15, 16, 15]
    assert data["kv_cache"]["tokens"] > 131072
    assert data["kv_cache"]["max_concurrency"] >= 1
    args = data["vllm_args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--pipeline-parallel-size") + 1] == "4"
    assert args[args.index("--max-model-len") + 1] == "131072"
    # The per-rank budget is that of the stage with the least room.
    tight = min(plan.stages, key=lambda s: s.max_sequences)
    assert data["per_rank"]["kv_cache_bytes"] == tight.kv_cache_bytes


def test_the_most_sequences_for_deepseek_v4_pro_come_from_replicas_sharing_the_experts():
    """objective max-kv: replicas hold the most sequences, since vLLM splits a MoE model's experts
    over all TP x DP GPUs (fused_moe/config.py FusedMoEParallelConfig.make) and only attention and
    the dense layers are copied per replica: each GPU of 32 holds 1/32 of the 384 experts."""
    pp4, best = make_plan(_prod(pp=4)), make_plan(_prod())
    assert pp4.feasible and best.feasible, best.errors
    lay = best.evaluation.layout
    assert lay.pp == 1 and lay.tp * lay.dp == 32
    assert best.evaluation.max_concurrency > pp4.evaluation.max_concurrency
    # Routed experts are ~96% of V4-Pro's 850.7 GB: at most 850.7 / 32 GB of them per GPU, plus the
    # rest (under 40 GB) over TP 2 or more.
    assert best.constrained.weights_bytes < 850.7e9 / 32 + 40e9 / lay.tp
    assert "--data-parallel-size" in best.serving_args


def test_kimi_k3_fp8_is_refused_with_the_numbers():
    plan = make_plan(_prod(model="kimi-k3", weight_format="fp8"))
    assert not plan.feasible
    message = " ".join(plan.errors)
    # About 2.8 TB of weights against what 32 x H100 hold (32 x ~85 GB visible).
    assert "weights do not fit" in message
    assert re.search(r"needs 2\.[789]\d* TB", message), message
    assert re.search(r"32 x H100\S* hold 2\.7\d* TB", message), message


def test_kimi_k3_mxfp4_is_accepted():
    plan = make_plan(_prod(model="kimi-k3"))
    assert plan.feasible, plan.errors
    assert plan.layout.tp * plan.layout.pp * plan.layout.dp == 32


def test_json_has_the_documented_keys():
    data = json.loads(json.dumps(make_plan(_prod()).to_json_dict()))
    assert set(data["model"]) >= {"name", "params_total", "params_active", "weight_bytes"}
    assert set(data["layout"]) >= {"tp", "pp", "ep", "dp", "nodes", "gpus_per_node", "layers_per_stage"}
    assert set(data["per_rank"]) >= {
        "gpu_visible_bytes", "weights_bytes", "activation_bytes", "kv_cache_bytes",
        "comm_buffer_bytes", "cuda_overhead_bytes", "headroom_bytes",
    }  # fmt: skip
    assert set(data["kv_cache"]) >= {"tokens", "bytes_per_token", "max_concurrency"}
    assert isinstance(data["vllm_args"], list) and all(isinstance(a, str) for a in data["vllm_args"])
    assert set(data) >= {"feasible", "errors", "warnings", "cost"}
    assert set(data["cost"]) >= {"hourly_usd", "monthly_usd"}


# --- Bad input ----------------------------------------------------------------


def test_tp_larger_than_a_node_is_refused():
    plan = make_plan(_prod(tp=16, pp=2))
    assert not plan.feasible
    assert any("larger than a node" in e for e in plan.errors)


@pytest.mark.parametrize("model, instance, nodes", [("deepseek-v4-flash", "p5.48xlarge", 3), ("qwen3-30b-a3b", "p5.48xlarge", 5),
                                                   ("gpt-oss-120b", "p5.48xlarge", 7), ("mixtral-8x7b", "p5e.48xlarge", 5)])  # fmt: skip
def test_data_parallel_moe_layouts_split_experts_only_where_they_divide(model, instance, nodes):
    """vLLM 0.34 splits a routed expert's intermediate columns over TP x DP without expert parallel
    (fused_moe/config.py flatten_tp_across_dp_and_pcp) and asserts they divide (FusedMoEConfig
    __post_init__). On these node counts the searched plan used to pick a split that does not."""
    from infra.catalog.instances import get_instance_type
    from infra.planning.layout import Layout, layout_errors

    plan = make_plan(PlanRequest(model=model, instance_type=instance, nodes=nodes))
    lay, inter = plan.evaluation.layout, plan.model.moe_intermediate_size
    assert plan.feasible
    assert lay.dp == 1 or lay.expert_parallel or inter % (lay.tp * lay.dp) == 0, lay
    # Every data-parallel split the search could try without expert parallel: refused exactly
    # when TP x DP does not divide the columns, with the figures.
    gpn = get_instance_type(instance).gpu_count
    for tp in (1, 2, 4, 8):
        dp = nodes * gpn // tp
        errors = layout_errors(plan.model, get_instance_type(instance), nodes, Layout(tp, 1, dp, False, "auto"))
        named = [e for e in errors if "intermediate columns over" in e]
        assert bool(named) == (inter % (tp * dp) != 0), (tp, dp, errors)
        if named:
            assert f"{inter:,} intermediate columns over all {tp * dp} GPUs (TP {tp} x DP {dp})" in named[0]
            assert "expertParallel true" in named[0]
        # With expert parallel the experts stay whole: nothing to divide.
        if tp > 1:
            with_ep = layout_errors(plan.model, get_instance_type(instance), nodes, Layout(tp, 1, dp, True, "auto"))
            assert not [e for e in with_ep if "intermediate columns over" in e]


def test_single_gpu_nodes_whose_count_does_not_divide_the_experts_serve_with_expert_parallel():
    """One GPU per node leaves TP 1: five replicas split Qwen3-30B-A3B's 768 columns five ways,
    which vLLM refuses, and expert parallel over TP 1 x DP 5 is the layout it starts
    (fused_moe/config.py FusedMoEParallelConfig.make: use_ep when DP x TP > 1, ep_size the
    flattened TP x DP; its docstring's "TP = 1, DP = 2 and EP = True" case). Four nodes split
    the columns evenly and need no expert parallel; five serve at least as many sequences."""
    four = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="g7e.2xlarge", nodes=4, max_model_len=4096))
    five = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="g7e.2xlarge", nodes=5, max_model_len=4096,
                                 weight_format=four.weight_format))  # fmt: skip
    assert four.feasible and five.feasible, five.errors
    assert (four.evaluation.layout.dp, four.evaluation.layout.expert_parallel) == (4, False)
    lay = five.evaluation.layout
    assert (lay.tp, lay.dp, lay.expert_parallel, lay.ep) == (1, 5, True, 5)
    assert "--enable-expert-parallel" in five.serving_args
    assert five.evaluation.max_concurrency >= four.evaluation.max_concurrency


def test_a_moe_whose_experts_tp_does_not_divide_is_refused(tmp_path):
    """The same assert with TP alone (no catalog model has such a size: one is made by editing
    Qwen3-30B-A3B's config.json): 772 columns split 4 ways, not 8."""
    import json

    from infra.catalog.instances import get_instance_type
    from infra.catalog.models import CONFIG_DIR, load_model
    from infra.planning.layout import Layout, layout_errors

    config = json.loads((CONFIG_DIR / "qwen3-30b-a3b.json").read_text())
    config["moe_intermediate_size"] = 772
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = load_model(str(tmp_path / "config.json"))
    p5 = get_instance_type("p5.48xlarge")
    tp8 = layout_errors(arch, p5, 1, Layout(8, 1, 1, False, "auto"))
    assert any("772 intermediate columns over all 8 GPUs (tensor parallel 8)" in e for e in tp8), tp8
    assert not [e for e in layout_errors(arch, p5, 1, Layout(8, 1, 1, True, "auto")) if "intermediate columns" in e]
    assert not [e for e in layout_errors(arch, get_instance_type("g6e.12xlarge"), 1, Layout(4, 1, 1, False, "auto"))
                if "intermediate columns" in e]  # fmt: skip


def test_tp_must_divide_the_heads():
    # Qwen3-0.6B has 16 query heads and 8 KV heads: TP 3 divides neither.
    plan = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="g5.12xlarge", nodes=3, tp=3))
    assert not plan.feasible


def test_unknown_model_and_instance_list_the_known_names():
    with pytest.raises(UserError, match="deepseek-v4-pro"):
        make_plan(_prod(model="deepseek-v9"))
    with pytest.raises(UserError, match="p5.48xlarge"):
        make_plan(_prod(instance_type="p9.96xlarge"))


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(gpu_memory_utilization=1.5), "gpu-memory-utilization"),
        (dict(kv_cache_dtype="fp7"), "kv-cache-dtype"),
        (dict(weight_format="fp2"), "weight format"),
        (dict(nodes=0), "nodes"),
    ],
)
def test_bad_knobs_name_the_field(change, fragment):
    with pytest.raises(UserError, match=fragment):
        make_plan(_prod(**change))


def test_max_model_len_too_long_for_the_kv_cache_is_refused():
    # Llama-3.1-405B in bf16 on one p5: weights alone need ~810 GB of 8 x 85 GB.
    plan = make_plan(PlanRequest(model="llama-3.1-405b", instance_type="p5.48xlarge", nodes=1))
    assert not plan.feasible
    assert "weights do not fit" in " ".join(plan.errors)


# --- Cost -------------------------------------------------------------------------


def test_tco_example_breakeven():
    # The example: $57,000 a month against an API at $2.50 per million
    # tokens breaks even at about 22.8 billion tokens a month, ~760 million a day.
    assert breakeven_tokens_per_month(57_000, 2.50) == pytest.approx(22.8e9, rel=1e-3)
    plan = make_plan(
        _prod(
            tco=TcoInputs({"hardware": 33_333.33, "power": 12_000, "network": 1_666.67, "engineering": 10_000}),
            api_price_usd_per_mtok=2.50,
        )
    )
    cost = plan.to_json_dict()["cost"]
    assert cost["tco_monthly_usd"] == pytest.approx(57_000, rel=1e-6)
    assert cost["breakeven"]["tokens_per_month"] == pytest.approx(22.8e9, rel=1e-3)
    assert cost["breakeven"]["tokens_per_day"] == pytest.approx(760e6, rel=0.02)


def test_cloud_cost_is_price_times_nodes():
    plan = make_plan(_prod())
    cost = plan.to_json_dict()["cost"]
    assert cost["hourly_usd"] == pytest.approx(4 * plan.instance.price_usd_per_hour)
    assert cost["monthly_usd"] == pytest.approx(cost["hourly_usd"] * 730)


def test_cost_per_million_tokens():
    # $57,000 / month at 10,000 tokens/s: 57,000 / (10,000 x 2,628,000 s) x 1e6.
    assert cost_per_million_tokens(57_000, 10_000) == pytest.approx(57_000 / 26_280, rel=1e-9)


# --- Derived serving parameters ------------------------------------------------------


def test_pod_and_shm_fit_in_the_node():
    plan = make_plan(_prod())
    node_ram = plan.instance.memory_bytes
    assert plan.pod.memory_bytes < node_ram
    assert plan.pod.object_store_bytes < plan.pod.shm_bytes <= plan.pod.memory_bytes // 2
    assert plan.pod.cpu < plan.instance.vcpus
    assert plan.ray_params["num-gpus"] == "8"


def test_storage_is_sized_from_the_checkpoint():
    plan = make_plan(_prod(cold_start_target_s=900))
    st = plan.storage
    assert st.size_bytes > st.checkpoint_bytes >= plan.to_json_dict()["model"]["weight_bytes"]
    # Reading everything at the required rate fits in the target.
    assert st.read_bytes / st.required_read_bytes_per_s <= 900


def test_min_cost_finds_cheapest_hardware_for_a_target():
    req = PlanRequest(model="qwen3-0.6b", instance_type=None, nodes=None, objective="min-cost", target_concurrency=4, max_model_len=8192)
    plan = make_plan(req)
    assert plan.feasible
    assert plan.evaluation.max_concurrency >= 4
    # The smallest model fits on the cheapest single-GPU instance in the catalog.
    from infra.catalog.instances import INSTANCE_TYPES

    cheapest = min(INSTANCE_TYPES.values(), key=lambda t: t.price_usd_per_hour)
    assert plan.instance.name == cheapest.name and plan.nodes == 1


def test_replicas_that_span_nodes_need_efa():
    """11 x g7e.2xlarge (one GPU each, no EFA) could hold DeepSeek-V4-Pro as an 11-stage
    pipeline over TCP; the stack only runs multi-node replicas over EFA, so it is refused,
    and min-cost picks an EFA type instead."""
    from infra.catalog.instances import get_instance_type
    from infra.planning import PlanRequest, make_plan

    assert get_instance_type("g7e.2xlarge").max_efa_interfaces == 0
    plan = make_plan(PlanRequest(model="deepseek-v4-pro", instance_type="g7e.2xlarge", nodes=11, pp=11, max_model_len=32768))
    assert not plan.feasible and any("no EFA" in e for e in plan.errors)
    cheapest = make_plan(PlanRequest(model="deepseek-v4-pro", instance_type=None, nodes=None, objective="min-cost",
                                     target_concurrency=4, max_model_len=32768))  # fmt: skip
    assert cheapest.nodes == 1 or cheapest.instance.max_efa_interfaces > 0
    # One replica per node needs no fabric between nodes.
    small = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="g6e.xlarge", nodes=2))
    assert small.feasible and small.layout.dp == 2


def test_deepseek_v4_refuses_a_kv_dtype_its_packed_layout_refuses():
    """vLLM 0.34 models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype raises for a
    non-fp8 KV dtype on the packed fp8_ds_mla layout, which both the FlashMLA class and
    SM12's FlashInfer class (nvidia/flashinfer_sparse.py) use."""
    from infra.catalog.instances import get_instance_type
    from infra.catalog.models import load_model
    from infra.planning import PlanRequest, make_plan
    from infra.planning.layout import Layout, layout_errors

    req = PlanRequest(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4)
    refused = make_plan(req.replace(kv_cache_dtype="bfloat16"))
    assert not refused.feasible and any("packed" in e for e in refused.errors)
    assert make_plan(req.replace(kv_cache_dtype="fp8")).feasible
    # SM12 (RTX PRO 6000, g7e) too.
    g7e = get_instance_type("g7e.48xlarge")
    assert g7e.gpu.compute_capability.startswith("12")
    arch = load_model("deepseek-v4-flash")
    layout = Layout(tp=8, pp=1, dp=1, expert_parallel=False, kv_cache_dtype="bfloat16")
    assert any("packed" in e for e in layout_errors(arch, g7e, 1, layout))
    assert not any("packed" in e for e in layout_errors(arch, g7e, 1, Layout(8, 1, 1, False, "auto")))


def test_a_moe_model_under_data_parallel_is_planned_with_a_warning_of_what_the_figures_leave_out() -> None:
    """vLLM shards a MoE model's experts over TP x DP GPUs and steps the replicas together
    (its tokens exchanged every MoE layer); the plan counts both but takes the replicas as evenly
    loaded, and says so, naming EFA when the replicas span nodes."""
    two_nodes = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="p5.48xlarge", nodes=2, dp=4, tp=4))
    lay = two_nodes.evaluation.layout
    assert (lay.tp, lay.dp) == (4, 4) and two_nodes.feasible
    [w] = [w for w in two_nodes.warnings if w.startswith("data parallel")]
    assert "over all 16 GPUs, TP x DP" in w and "over EFA between nodes" in w and "evenly loaded" in w
    one_node = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="p5.48xlarge", nodes=1, dp=2, tp=4))
    [w] = [w for w in one_node.warnings if w.startswith("data parallel")]
    assert "over all 8 GPUs, TP x DP" in w and "EFA" not in w
    # Single-GPU nodes without EFA (g7e.2xlarge): the exchange goes over TCP, and the step model
    # takes the instance's network for it.
    no_efa = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="g7e.2xlarge", nodes=4, max_model_len=4096))
    [w] = [w for w in no_efa.warnings if w.startswith("data parallel")]
    assert "over TCP between nodes, which have no EFA" in w
    # The same model without data parallel, and a dense model with it, carry no such warning.
    single = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="p5.48xlarge", nodes=1, tp=8))
    dense = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="p5.48xlarge", nodes=1, dp=8, tp=1))
    assert dense.evaluation.layout.dp == 8
    assert not [w for w in single.warnings + dense.warnings if w.startswith("data parallel")]


@pytest.mark.parametrize("model, instance, nodes, dp", [("deepseek-v3", "p5e.48xlarge", 5, 40), ("kimi-k3", "p6-b300.48xlarge", 2, 2)])
def test_replicas_of_a_moe_model_take_a_smaller_chunk_when_its_activations_crowd_out_the_kv_cache(model, instance, nodes, dp):
    """Each MoE layer of a replica runs every replica's tokens (vLLM 0.34 all-gathers them,
    device_communicators/all2all.py AgRsAll2AllManager.dispatch; the profile run puts
    max-num-batched-tokens on every DP rank at once), so its activations grow with DP x chunk:
    the search tries smaller chunks for such layouts, and says why."""
    plan = make_plan(PlanRequest(model=model, instance_type=instance, nodes=nodes, max_model_len=4096, pp=1, dp=dp))
    ev = plan.evaluation
    assert plan.feasible and ev.layout.dp == dp
    default = serving.default_batched_tokens(get_instance_type(instance).gpu.visible_memory_bytes, get_instance_type(instance).gpu.name,
                                             ev.knobs.release)  # fmt: skip
    assert ev.knobs.max_num_batched_tokens < default
    [note] = [n for n in ev.notes if "each MoE layer runs the tokens" in n]
    assert f"of all {dp} replicas" in note and f"(vLLM's default {default})" in note
    at_default = make_plan(PlanRequest(model=model, instance_type=instance, nodes=nodes, max_model_len=4096, pp=1, dp=dp,
                                       max_num_batched_tokens=default))  # fmt: skip
    assert not at_default.feasible or at_default.constrained.activation_bytes > 2 * plan.constrained.activation_bytes


def test_replicas_of_a_moe_model_pay_for_the_nccl_groups_that_join_them():
    """One-GPU replicas of a MoE model share NCCL groups (each MoE layer's gather spans them),
    so each GPU holds the ~1 GiB more that vLLM 0.19 logs show once NCCL groups exist
    (memory.CUDA_CONTEXT_DISTRIBUTED_BYTES); a dense model's one-GPU replicas do not."""
    moe = make_plan(PlanRequest(model="qwen3-30b-a3b", instance_type="g7e.2xlarge", nodes=4, max_model_len=4096))
    dense = make_plan(PlanRequest(model="qwen3-0.6b", instance_type="g7e.2xlarge", nodes=4, max_model_len=4096))
    assert moe.layout.dp == dense.layout.dp == 4 and moe.layout.tp == dense.layout.tp == 1
    context = [p.constrained.cuda_overhead_bytes - p.constrained.cudagraph_bytes for p in (moe, dense)]
    assert context[0] - context[1] == pytest.approx(1.0 * GiB, abs=0.01 * GiB)


def test_the_mtp_layers_experts_are_split_like_the_targets():
    """DeepSeek-V3's MTP layer is a MoE layer too: over TP 8 x DP 2 its experts are split over 16
    GPUs, on the last stage of TP 8 x PP 2 over 8, so the drafter weighs half its experts' share
    less on a replica's GPU."""
    def added(**kw) -> float:
        req = dict(model="deepseek-v3", instance_type="p5e.48xlarge", nodes=2, max_model_len=4096, **kw)
        with_mtp = make_plan(PlanRequest(**req, speculative_method="mtp", num_speculative_tokens=1))
        plain = make_plan(PlanRequest(**req, speculative_method="off"))
        assert with_mtp.feasible and plain.feasible
        return with_mtp.stages[-1].weights_bytes - plain.stages[-1].weights_bytes

    arch = load_model("deepseek-v3")
    experts = sum(memory.group_bytes_per_rank(g, 1, 1) for layer in arch.mtp_layers for g in layer.params
                  if g.role.value == "routed_expert")  # fmt: skip
    assert experts > 0
    assert added(tp=8, pp=2) - added(tp=8, dp=2) == pytest.approx(experts / 8 - experts / 16, rel=0.01)


def test_the_sla_search_tries_every_parallel_shape_with_replicas_sharing_moe_layers_last():
    """The memory ranking puts V4-Pro's replicas first (they share the experts, so hold the most
    sequences), but the SLA search must weigh TP 8 x PP 4 too: every shape (TP x PP x DP) is a
    candidate, each with expert parallel off and on; the shapes whose replicas exchange MoE
    tokens go last, so the pipeline sets the bar they must beat and they stop early."""
    from infra.planning import plan as planning
    from infra.planning.sla_search import sla_candidates

    req = _prod()
    arch, itype = load_model(req.model), get_instance_type(req.instance_type)
    ranked = [ev for ev in planning.search(req, arch, itype, 4, planning._knobs(req, arch, itype))
              if ev.feasible and ev.layout.kv_cache_dtype == "auto"]  # fmt: skip
    pool = sla_candidates(arch, ranked)
    shapes = [(ev.layout.tp, ev.layout.pp, ev.layout.dp) for ev in pool]
    assert ranked[0].layout.dp > 1 and shapes[:2] == [(8, 4, 1)] * 2
    assert {(ev.layout.tp, ev.layout.pp, ev.layout.dp) for ev in ranked} == set(shapes)
    for shape in set(shapes):
        assert sorted(ev.layout.expert_parallel for ev in pool if (ev.layout.tp, ev.layout.pp, ev.layout.dp) == shape) == [False, True]
    # Among the replicas, the memory ranking's order.
    dp_shapes = list(dict.fromkeys(s for s in shapes if s[2] > 1))
    assert dp_shapes == list(dict.fromkeys((ev.layout.tp, ev.layout.pp, ev.layout.dp) for ev in ranked if ev.layout.dp > 1))
