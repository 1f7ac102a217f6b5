"""What one cold start costs, and what the first `pulumi up` costs on top (pure).

A cold start (a new node group, a node replaced, a rollout of new pods) is paid
twice:

- GPU hours before the engine serves: every GPU node is billed from the moment
  it runs, and serves nothing until the head is ready. The plan's cold start
  (infra/planning/startup.py: the checkpoint read at the node's share of the
  store's throughput, then the engine's start) is that time; pulling the
  serving image onto fresh nodes comes on top and is left out (it depends on
  the registry, not on the plan).
- Storage reads: every node reads the whole checkpoint (startup.py, module
  doc), so the cluster reads it once per node. Amazon EFS in Elastic
  throughput mode (what the stack creates) bills each GB read; FSx for Lustre
  bills provisioned throughput with its storage, not per read, so a cold start
  reads at no extra charge.

The first `up` also writes the checkpoint once (EFS Elastic bills writes per
GB) and keeps the GPU nodes idle while it does: the GPU node group is created
with the cluster, not after the weights are staged. At the slowest download
rate the staging Job accepts (`STAGING_MIN_BYTES_PER_S`, its deadline's basis)
that is an upper bound; the hub or S3 usually give several times that rate.

Prices (us-east-1, where the catalog's instance prices are read too; other
regions differ): EFS Elastic throughput, $0.03 per GB read and $0.06 per GB
written ("Amazon EFS pricing" as quoted by factualminds.com, "Amazon EFS
Pricing", 2026-06-13; AWS re:Post, "How do I estimate Elastic Throughput mode
costs for Amazon EFS?", gives $0.03 read and $0.07 written for eu-west-1).
ASSUMPTION: AWS's own pricing page was not readable here; the two sources agree
on the read price. AWS bills these in GB of 2^30 bytes, as it does storage.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.planning.memory import GiB, MiB

EFS_ELASTIC_READ_USD_PER_GB = 0.03
EFS_ELASTIC_WRITE_USD_PER_GB = 0.06
# Per-GB charges by file system kind: FSx for Lustre has none (throughput is provisioned).
READ_USD_PER_GB = {"efs": EFS_ELASTIC_READ_USD_PER_GB, "fsx": 0.0}
WRITE_USD_PER_GB = {"efs": EFS_ELASTIC_WRITE_USD_PER_GB, "fsx": 0.0}
# ASSUMPTION: one staging pod downloads at no less than 100 MiB/s from the Hugging Face hub or S3
# (through the VPC's S3 gateway endpoint; both usually give several times that). The staging Job's
# deadline is based on it (infra/k8s/staging.py).
STAGING_MIN_BYTES_PER_S = 100 * MiB
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ColdStartCost:
    storage_kind: str  # "efs" or "fsx"
    read_bytes: int  # what the cluster reads at a cold start: the checkpoint once per node
    read_usd: float
    gpu_wait_s: float  # GPU node time before the engine serves: the plan's cold start
    gpu_wait_usd: float
    usd: float  # one cold start: reads and GPU wait
    # The first `up`, on top of its cold start.
    staging_write_bytes: int
    staging_write_usd: float
    staging_bytes_per_s: int  # STAGING_MIN_BYTES_PER_S: the rate the bound below assumes
    staging_s_at_most: float  # the checkpoint at that rate
    staging_gpu_idle_usd_at_most: float  # the GPU nodes idle meanwhile


def cold_start_cost(
    *, storage_kind: str, checkpoint_bytes: int, nodes: int, cold_start_s: float, gpu_usd_per_hour: float
) -> ColdStartCost:
    """`gpu_usd_per_hour`: all GPU nodes together; `cold_start_s`: startup.Startup.cold_start_s."""
    read_bytes = checkpoint_bytes * nodes
    read_usd = read_bytes / GiB * READ_USD_PER_GB[storage_kind]
    gpu_wait_usd = gpu_usd_per_hour * cold_start_s / SECONDS_PER_HOUR
    staging_s = checkpoint_bytes / STAGING_MIN_BYTES_PER_S
    return ColdStartCost(
        storage_kind=storage_kind,
        read_bytes=read_bytes,
        read_usd=read_usd,
        gpu_wait_s=cold_start_s,
        gpu_wait_usd=gpu_wait_usd,
        usd=read_usd + gpu_wait_usd,
        staging_write_bytes=checkpoint_bytes,
        staging_write_usd=checkpoint_bytes / GiB * WRITE_USD_PER_GB[storage_kind],
        staging_bytes_per_s=STAGING_MIN_BYTES_PER_S,
        staging_s_at_most=staging_s,
        staging_gpu_idle_usd_at_most=gpu_usd_per_hour * staging_s / SECONDS_PER_HOUR,
    )
