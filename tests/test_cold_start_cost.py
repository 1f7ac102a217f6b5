"""infra/planning/cold_start_cost.py: what one cold start costs, and the first `up` on top, in the plan.

The figures are tied to the plan's own (its cold start, its hourly price, the
staging Job's deadline) and to the issue's independent estimate for prod (about
3.5 TB read from EFS at every cold start), not recomputed from the code.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from infra.cli.app import app
from infra.config import load_stack_file
from infra.k8s.staging import staging_deadline_s
from infra.planning.cold_start_cost import cold_start_cost
from infra.planning.plan import make_plan


@pytest.fixture(scope="module")
def prod():
    return make_plan(load_stack_file("prod").plan_request())


def test_prod_reads_the_checkpoint_once_per_node_from_efs(prod):
    cs = prod.cold_start_cost
    assert cs.storage_kind == "efs"
    assert 3.4e12 <= cs.read_bytes <= 3.6e12  # four nodes x 865 GB: "about 3.5 TB" (issue 18)
    assert cs.read_usd > 0 and cs.usd == pytest.approx(cs.read_usd + cs.gpu_wait_usd)


def test_the_prices_are_efs_elastic_throughputs(prod):
    """Published EFS Elastic throughput prices (us-east-1: $0.03 per GB read, $0.06 per GB written; a GB of 2^30
    bytes): reading a TiB costs about $31, writing it about $61, and prod's 3.5 TB about $100 a cold start."""
    tib = 2**40
    one = cold_start_cost(storage_kind="efs", checkpoint_bytes=tib, nodes=1, cold_start_s=0, gpu_usd_per_hour=0)
    assert one.read_usd == pytest.approx(30.72) and one.staging_write_usd == pytest.approx(61.44)
    assert 90 < prod.cold_start_cost.read_usd < 110
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.read_usd = 0  # a plan's figure is not edited after the fact


def test_the_staging_bound_assumes_100_mib_per_second(prod):
    """The rate the README and the staging Job's deadline state (an ASSUMPTION): 865 GB in about 2.3 hours."""
    cs = prod.cold_start_cost
    assert cs.staging_bytes_per_s == 100 * 2**20
    assert cs.staging_s_at_most * 100 * 2**20 == pytest.approx(prod.storage.checkpoint_bytes)
    assert 2.2 < cs.staging_s_at_most / 3600 < 2.4


def test_the_gpu_wait_is_the_plans_cold_start_at_its_hourly_price(prod):
    cs = prod.cold_start_cost
    assert cs.gpu_wait_s == prod.startup.cold_start_s
    # A whole hour of cold start would cost the cluster's hourly price.
    hour = cold_start_cost(storage_kind="efs", checkpoint_bytes=1, nodes=prod.nodes, cold_start_s=3600,
                           gpu_usd_per_hour=prod.cost.hourly_usd)  # fmt: skip
    assert hour.gpu_wait_usd == pytest.approx(prod.cost.hourly_usd)


def test_the_staging_bound_fits_the_staging_jobs_deadline(prod):
    """The upper bound on the first `up`'s idle GPU time is a time the staging Job is allowed to run."""
    cs = prod.cold_start_cost
    assert cs.staging_s_at_most <= staging_deadline_s(prod.storage.checkpoint_bytes, prod.request.cold_start_target_s)
    assert cs.staging_gpu_idle_usd_at_most == pytest.approx(prod.cost.hourly_usd * cs.staging_s_at_most / 3600)


def test_fsx_has_no_per_gb_charge_but_the_same_gpu_wait(prod):
    fsx = make_plan(prod.request.replace(storage_kind="fsx")).cold_start_cost
    efs = prod.cold_start_cost
    assert (fsx.read_usd, fsx.staging_write_usd) == (0.0, 0.0)
    assert fsx.gpu_wait_usd == pytest.approx(efs.gpu_wait_usd) and fsx.read_bytes == efs.read_bytes
    assert efs.staging_write_usd > 0  # EFS bills the one write of the checkpoint


@given(nodes=st.integers(1, 16), checkpoint=st.integers(1, 2 * 10**12))
def test_reads_grow_with_every_node(nodes, checkpoint):
    one = cold_start_cost(storage_kind="efs", checkpoint_bytes=checkpoint, nodes=1, cold_start_s=600, gpu_usd_per_hour=55.0)
    many = cold_start_cost(storage_kind="efs", checkpoint_bytes=checkpoint, nodes=nodes, cold_start_s=600, gpu_usd_per_hour=55.0)
    assert many.read_bytes == nodes * checkpoint and many.read_usd == pytest.approx(nodes * one.read_usd)
    assert many.staging_write_usd == one.staging_write_usd  # staged once, whatever the node count


def test_the_plan_prints_and_carries_it(prod):
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["plan", "--stack", "prod", "--json"]).stdout)
    cs = data["cold_start_cost"]
    assert cs == json.loads(json.dumps(prod.to_json_dict()["cold_start_cost"]))
    text = runner.invoke(app, ["plan", "--stack", "prod"], env={"COLUMNS": "200"}).stdout
    assert f"one cold start                  │ ${cs['usd']:,.2f}" in text
    assert f"{cs['gpu_wait_s']:,.0f} s before serving ${cs['gpu_wait_usd']:,.2f}" in text
    assert f"up to {cs['staging_s_at_most'] / 3600:,.1f} h, ${cs['staging_gpu_idle_usd_at_most']:,.2f} (at 100 MiB/s" in text
