"""infra/planning/startup.py: what a node reads at a cold start, and the budgets that follow from one estimate.

The read model follows vLLM 0.34's loader (every rank reads every shard), so a
node's read does not shrink with pipeline stages; the probe, the wait for the
head (rollout's) and the two vLLM timeouts are derived from the same cold start and move with it.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from infra.cli.app import app
from infra.config import load_stack_file
from infra.planning import startup
from infra.planning.plan import make_plan
from infra.planning.request import PlanRequest
from infra.planning.serving import NFS_CLIENT_BYTES_PER_S, pod_resources
from infra.catalog.instances import get_instance_type

GB = 10**9


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_every_node_reads_the_whole_checkpoint(nodes):
    st = startup.storage_plan(checkpoint_bytes=865 * GB, nodes=nodes, cold_start_target_s=600)
    assert st.per_node_read_bytes == 865 * GB
    assert st.read_bytes == nodes * 865 * GB
    # Reading it all at the required rate fits in the target's read budget.
    assert st.read_bytes / st.required_read_bytes_per_s <= 600 - startup.ENGINE_INIT_S


def test_pipeline_stages_do_not_shrink_a_nodes_read():
    """TP 8 x PP 4 on 4 nodes and TP 8 x DP 4 read the same per node (the stage filter runs after the read)."""
    pp = make_plan(PlanRequest(model="deepseek-v4-pro", instance_type="p5.48xlarge", nodes=4, tp=8, pp=4))
    assert pp.feasible
    assert pp.storage.per_node_read_bytes == pp.storage.checkpoint_bytes
    assert pp.startup.node_read_bytes == pp.storage.checkpoint_bytes
    assert pp.storage.read_bytes == 4 * pp.storage.checkpoint_bytes


def test_one_nfs_client_limits_a_node():
    slow = startup.storage_plan(checkpoint_bytes=865 * GB, nodes=4, cold_start_target_s=600)
    # 865 GB in 420 s would need 2.06 GB/s per node; one NFS client reads 1,500 MiB/s.
    assert slow.estimated_cold_start_s == pytest.approx(865 * GB / NFS_CLIENT_BYTES_PER_S + startup.ENGINE_INIT_S)
    relaxed = startup.storage_plan(checkpoint_bytes=865 * GB, nodes=4, cold_start_target_s=3600)
    assert relaxed.estimated_cold_start_s == pytest.approx(3600)  # the store's share, not the client, binds


@pytest.mark.parametrize("checkpoint_gb", [1, 100, 865, 1680])
def test_every_budget_follows_the_cold_start(checkpoint_gb):
    pod = pod_resources(get_instance_type("p5.48xlarge"))
    st = startup.storage_plan(checkpoint_bytes=checkpoint_gb * GB, nodes=4, cold_start_target_s=600)
    su = startup.startup_plan(st, pod)
    assert su.cold_start_s == st.estimated_cold_start_s == pytest.approx(su.weights_read_s + su.engine_init_s)
    assert su.engine_ready_timeout_s >= startup.COLD_START_MARGIN * su.cold_start_s
    assert su.startup_budget_s == su.startup_probe_failure_threshold * su.startup_probe_period_s
    assert 0 <= su.startup_budget_s - (su.ray_join_timeout_s + su.engine_ready_timeout_s) < su.startup_probe_period_s
    assert su.ready_wait_s == su.startup_budget_s + su.image_pull_allowance_s
    assert su.execute_model_timeout_s > startup.VLLM_EXECUTE_MODEL_TIMEOUT_DEFAULT_S + su.compile_s
    assert su.restart_s == pytest.approx(su.cold_start_s - su.compile_s) and su.restart_s > su.weights_read_s
    assert su.page_cache_holds_checkpoint == (checkpoint_gb * GB <= su.page_cache_bytes)


def test_a_checkpoint_the_page_cache_cannot_hold_is_said():
    pod = pod_resources(get_instance_type("p5.48xlarge"))
    st = startup.storage_plan(checkpoint_bytes=2 * 2**40, nodes=4, cold_start_target_s=600)
    assert not startup.startup_plan(st, pod).page_cache_holds_checkpoint


def test_the_plan_shows_the_calculation():
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["plan", "--stack", "prod", "--json"]).stdout)
    plan = make_plan(load_stack_file("prod").plan_request())
    assert data["startup"]["cold_start_s"] == data["storage"]["estimated_cold_start_s"]
    assert data["startup"] == json.loads(json.dumps(plan.to_json_dict()["startup"]))
    text = runner.invoke(app, ["plan", "--stack", "prod"], env={"COLUMNS": "160"}).stdout
    assert "Start-up" in text and "VLLM_ENGINE_READY_TIMEOUT_S" in text
    assert f"{data['startup']['engine_ready_timeout_s']:,}" in text
    assert f"{data['startup']['startup_budget_s']:,} s" in text
    # What waits for the head is the rollout command, not `pulumi up` (docs/deploying.md).
    assert "head Ready within" in text and f"{data['startup']['ready_wait_s']:,} s once placed" in text
    assert "Pulumi waits" not in text
    assert math.isclose(data["startup"]["weights_read_s"] + data["startup"]["engine_init_s"], data["startup"]["cold_start_s"])
