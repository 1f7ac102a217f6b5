"""Model-weight file systems: FSx for Lustre sizing and what Amazon EFS can serve.

Pure (no Pulumi, no cloud). The plan (`infra.planning.startup.storage_plan`)
says how many bytes the checkpoint has and how fast the serving cluster must
read them to meet its cold-start target; this module turns those two figures
into a valid FSx for Lustre configuration, and gives EFS's documented read
ceiling so the serving layer can warn when a plan asks EFS for more.

Rules and where they come from
------------------------------

FSx for Lustre, PERSISTENT_2 deployment on SSD storage:

- storage capacity: "the valid values are 1200 GiB, 2400 GiB, and increments of
  2400 GiB" (FSx API reference, CreateFileSystem `StorageCapacity`; the same
  text is in botocore's `fsx` service model, which the tests read); growing an
  existing file system: "multiples of 2400 GiB" (FSx for Lustre user guide,
  "Increasing storage capacity"; UpdateFileSystem `StorageCapacity`);
- per-unit storage throughput: "For PERSISTENT_2 SSD storage: 125, 250, 500,
  1000 MB/s/TiB", and "file system throughput capacity is calculated by
  multiplying file system storage capacity (TiB) by the PerUnitStorageThroughput
  (MB/s/TiB)" (CreateFileSystemLustreConfiguration `PerUnitStorageThroughput`,
  also in botocore's model; user guide "Managing provisioned throughput
  capacity");
- the per-unit figure is the *disk* throughput baseline of PERSISTENT_2
  (user guide, "Performance characteristics of SSD and HDD storage classes":
  disk throughput 125/250/500/1000 MBps/TiB, network baseline 320/640/1300/2600
  with bursts). A cold start reads the checkpoint once, from disk, not from the
  servers' cache, so the sizing uses the disk baseline and never counts on
  bursts.

Units: MB/s are AWS's decimal megabytes (10^6 bytes); capacity is converted to
TiB as GiB / 1024. AWS's own worked example treats 2400 GiB as "2.4 TiB"
(GiB / 1000), so this errs on the low side by 2.4 %: a plan that fits here fits
on AWS's arithmetic too.

Amazon EFS, Regional file system, Elastic throughput (EFS user guide, "Amazon
EFS quotas", table "Total default Elastic throughput per file system for all
connected clients"): maximum read throughput 60 GiBps in US East (Ohio), US East
(N. Virginia), US West (Oregon), Asia Pacific (Singapore), Asia Pacific (Tokyo),
Europe (Frankfurt) and Europe (Ireland); the document history (2 May 2025) adds
Asia Pacific (Mumbai), Asia Pacific (Seoul), Asia Pacific (Sydney) and Europe
(London), "increased from 20 GiBps to 60 GiBps"; "All other AWS Regions" get
10 GiBps in the quota table. Older copies of the guide list 3, 20 and 30 GiBps:
the figure moves, so it is a constant here with its date, and a region not in
the list gets the lowest current figure. One client (one node) reads at most
1,500 MiBps (`infra.planning.serving.NFS_CLIENT_BYTES_PER_S`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from infra.planning.memory import GiB
from infra.planning.serving import STORAGE_MARGIN

MB = 10**6  # AWS throughput units (MB/s, MBps) are decimal
GIB_PER_TIB = 1024

FSX_DEPLOYMENT_TYPE = "PERSISTENT_2"
FSX_STORAGE_TYPE = "SSD"
# FSx API reference, CreateFileSystemLustreConfiguration.PerUnitStorageThroughput.
FSX_PER_UNIT_THROUGHPUTS_MBPS: tuple[int, ...] = (125, 250, 500, 1000)
# FSx API reference, CreateFileSystem.StorageCapacity (SSD, SCRATCH_2/PERSISTENT_1/PERSISTENT_2).
FSX_MIN_CAPACITY_GIB = 1200
FSX_CAPACITY_STEP_GIB = 2400

# EFS user guide, "Amazon EFS quotas" (Elastic throughput, Regional file systems),
# as of the May 2025 document history entry.
EFS_ELASTIC_MAX_READ_GIBPS_HIGH = 60
EFS_ELASTIC_MAX_READ_GIBPS_OTHER = 10
EFS_ELASTIC_HIGH_READ_REGIONS = frozenset(
    {
        "us-east-1",
        "us-east-2",
        "us-west-2",
        "ap-southeast-1",
        "ap-northeast-1",
        "eu-central-1",
        "eu-west-1",
        # Document history, 2 May 2025: raised from 20 to 60 GiBps.
        "ap-south-1",
        "ap-northeast-2",
        "ap-southeast-2",
        "eu-west-2",
    }
)


@dataclass(frozen=True)
class FsxSizing:
    storage_capacity_gib: int  # LustreFileSystem.storage_capacity
    per_unit_storage_throughput_mbps: int  # LustreFileSystem.per_unit_storage_throughput (MB/s/TiB)
    deployment_type: str  # LustreFileSystem.deployment_type
    throughput_bytes_per_s: int  # the disk baseline this configuration guarantees
    storage_type: str = FSX_STORAGE_TYPE


def fsx_capacity_at_least(gib: int) -> int:
    """The smallest valid PERSISTENT_2 SSD capacity (GiB) holding `gib`: 1200, 2400, 4800, ..."""
    if gib <= FSX_MIN_CAPACITY_GIB:
        return FSX_MIN_CAPACITY_GIB
    return math.ceil(gib / FSX_CAPACITY_STEP_GIB) * FSX_CAPACITY_STEP_GIB


def fsx_next_capacity(capacity_gib: int) -> int:
    """The next valid capacity above a valid one (1200 -> 2400 -> 4800 -> ...)."""
    return fsx_capacity_at_least(capacity_gib + 1)


def is_valid_fsx_capacity(capacity_gib: int) -> bool:
    return capacity_gib == FSX_MIN_CAPACITY_GIB or (capacity_gib > 0 and capacity_gib % FSX_CAPACITY_STEP_GIB == 0)


def fsx_throughput_bytes_per_s(capacity_gib: int, per_unit_mbps: int) -> int:
    """Disk baseline of a PERSISTENT_2 SSD file system: capacity (TiB) x MB/s/TiB."""
    return capacity_gib * per_unit_mbps * MB // GIB_PER_TIB


def fsx_lustre_sizing(checkpoint_bytes: int, required_read_bytes_per_s: int) -> FsxSizing:
    """The FSx for Lustre file system for a checkpoint and a cold-start read rate.

    Capacity: the smallest valid one that holds the checkpoint with the plan's
    margin (`STORAGE_MARGIN`, as `startup.storage_plan` sizes any weight store). Then
    the smallest per-unit throughput that reaches the required read rate; when
    even 1000 MB/s/TiB does not, the capacity grows to the next valid size
    (throughput scales with capacity) until one does.
    """
    if checkpoint_bytes <= 0:
        raise ValueError(f"checkpoint_bytes must be positive, not {checkpoint_bytes}")
    if required_read_bytes_per_s < 0:
        raise ValueError(f"required_read_bytes_per_s must not be negative, not {required_read_bytes_per_s}")
    need_gib = math.ceil(checkpoint_bytes * STORAGE_MARGIN / GiB)
    capacity = fsx_capacity_at_least(need_gib)
    top = FSX_PER_UNIT_THROUGHPUTS_MBPS[-1]
    if fsx_throughput_bytes_per_s(capacity, top) < required_read_bytes_per_s:
        # Jump straight to the capacity the top tier needs instead of stepping.
        want_gib = math.ceil(required_read_bytes_per_s * GIB_PER_TIB / (top * MB))
        capacity = max(capacity, fsx_capacity_at_least(want_gib))
        while fsx_throughput_bytes_per_s(capacity, top) < required_read_bytes_per_s:  # integer rounding
            capacity = fsx_next_capacity(capacity)
    for per_unit in FSX_PER_UNIT_THROUGHPUTS_MBPS:
        throughput = fsx_throughput_bytes_per_s(capacity, per_unit)
        if throughput >= required_read_bytes_per_s:
            return FsxSizing(
                storage_capacity_gib=capacity,
                per_unit_storage_throughput_mbps=per_unit,
                deployment_type=FSX_DEPLOYMENT_TYPE,
                throughput_bytes_per_s=throughput,
            )
    raise AssertionError("unreachable: the top tier reaches the rate at this capacity")  # pragma: no cover


def efs_read_throughput_bytes_per_s(region: Optional[str] = None) -> int:
    """EFS Elastic throughput's documented maximum read rate of one file system (all clients together).

    Without a region: the lowest current figure (what every region gets), so a
    warning based on it is never missed.
    """
    gibps = EFS_ELASTIC_MAX_READ_GIBPS_HIGH if region in EFS_ELASTIC_HIGH_READ_REGIONS else EFS_ELASTIC_MAX_READ_GIBPS_OTHER
    return gibps * GiB


def efs_shortfall(required_read_bytes_per_s: int, region: Optional[str] = None) -> Optional[str]:
    """A warning when the plan needs more read throughput than EFS Elastic gives, else None."""
    limit = efs_read_throughput_bytes_per_s(region)
    if required_read_bytes_per_s <= limit:
        return None
    where = region or "the least served regions"
    return (
        f"the cold-start target needs {required_read_bytes_per_s / GiB:.1f} GiB/s of reads, more than EFS Elastic "
        f"throughput gives one file system in {where} ({limit // GiB} GiB/s): use FSx for Lustre or a longer "
        "coldStartTargetSeconds"
    )
