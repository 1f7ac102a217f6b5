"""EC2 GPU instance types the stack can plan for, with provenance.

Hardware figures are copied from EC2 DescribeInstanceTypes (the same data moto
5.2.5 ships in moto/ec2/resources/instance_types.json.gz); tests compare every
one of them against that file, so a typo here fails CI. The product itself never
imports moto: the figures are literal data.

Prices are on-demand Linux, shared tenancy, no Savings Plan. AWS cut P4/P5 prices
by up to 45% in June 2025 (p5.48xlarge $98.32 -> $55.04 in us-east-1).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog.gpus import GPU, get_gpu
from infra.errors import unknown_name

MiB = 2**20
GB = 10**9


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: GPU
    gpu_count: int
    vcpus: int
    memory_bytes: int  # EC2 MemoryInfo.SizeInMiB * 2**20
    network_cards: int  # NetworkInfo.MaximumNetworkCards
    max_efa_interfaces: int  # NetworkInfo.EfaInfo.MaximumEfaInterfaces, 0 without EFA
    network_bandwidth_gbps: int  # NetworkInfo.NetworkPerformance; "Up to N" is the burst N
    local_nvme_bytes: int  # InstanceStorageInfo.TotalSizeInGB * 10**9
    gpu_memory_mib_ec2: int  # GpuInfo.Gpus[].MemoryInfo.SizeInMiB, per GPU
    price_usd_per_hour: float
    price_region: str
    price_date: str  # ISO date of the price list the figure was read from
    price_source: str
    source: str


_EC2 = (
    "EC2 DescribeInstanceTypes (identical in moto 5.2.5 ec2/resources/instance_types.json.gz, "
    "checked by tests/test_catalog_hardware.py)"
)
# One public price list read for most rows; the file that quotes it says it was checked entry
# by entry against AWS's offer file and that P4/P5 rows carry the June 2025 cut.
_PRICE_LIST = (
    "AWS Price List, AmazonEC2 us-east-1 offer file version 20260924211011 (on-demand Linux), "
    "as quoted entry by entry in a public pricing table (nable prices module); read 2026-12-02"
)
_PRICE_LIST_DATE = "2026-09-24"

INSTANCE_TYPES: dict[str, InstanceType] = {
    i.name: i
    for i in [
        InstanceType(
            name="p4d.24xlarge",
            gpu=get_gpu("A100-40GB"),
            gpu_count=8,
            vcpus=96,
            memory_bytes=1_179_648 * MiB,  # 1152 GiB
            network_cards=4,
            max_efa_interfaces=4,
            network_bandwidth_gbps=400,  # "4x 100 Gigabit"
            local_nvme_bytes=8_000 * GB,  # 8 x 1000 GB
            gpu_memory_mib_ec2=40_960,
            price_usd_per_hour=21.957642,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="p4de.24xlarge",
            gpu=get_gpu("A100-80GB"),
            gpu_count=8,
            vcpus=96,
            memory_bytes=1_179_648 * MiB,
            network_cards=4,
            max_efa_interfaces=4,
            network_bandwidth_gbps=400,  # "4x 100 Gigabit"
            local_nvme_bytes=8_000 * GB,
            gpu_memory_mib_ec2=81_920,
            price_usd_per_hour=27.44705,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="p5.48xlarge",
            gpu=get_gpu("H100-SXM-80GB"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=2_097_152 * MiB,  # 2 TiB
            network_cards=32,
            max_efa_interfaces=32,
            network_bandwidth_gbps=3200,
            local_nvme_bytes=30_400 * GB,  # 8 x 3800 GB
            gpu_memory_mib_ec2=81_920,
            price_usd_per_hour=55.04,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST + "; $98.32 before the June 2025 cut",
            source=_EC2,
        ),
        InstanceType(
            name="p5e.48xlarge",
            gpu=get_gpu("H200-141GB"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=2_097_152 * MiB,
            network_cards=32,
            max_efa_interfaces=32,
            network_bandwidth_gbps=3200,
            local_nvme_bytes=30_400 * GB,
            gpu_memory_mib_ec2=144_384,
            # No on-demand row exists to read: p5e is sold through Capacity Blocks.
            price_usd_per_hour=63.296,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=(
                "ASSUMPTION: p5e.48xlarge has no us-east-1 on-demand listing in the AWS Price List "
                "(Capacity Blocks only; noted by several public pricing tables); the p5en.48xlarge "
                "rate (same 8 x H200) is used as a stand-in"
            ),
            source=_EC2,
        ),
        InstanceType(
            name="p5en.48xlarge",
            gpu=get_gpu("H200-141GB"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=2_097_152 * MiB,
            network_cards=16,
            max_efa_interfaces=16,
            network_bandwidth_gbps=3200,
            local_nvme_bytes=30_400 * GB,
            gpu_memory_mib_ec2=144_384,
            price_usd_per_hour=63.296,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=(
                _PRICE_LIST + "; also `dstack offer` output in dstack PR #4110 (us-east-1 $63.296)"
            ),
            source=_EC2,
        ),
        InstanceType(
            name="p6-b200.48xlarge",
            gpu=get_gpu("B200"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=2_097_152 * MiB,
            network_cards=8,
            max_efa_interfaces=8,
            network_bandwidth_gbps=3200,
            local_nvme_bytes=30_400 * GB,
            gpu_memory_mib_ec2=183_359,
            price_usd_per_hour=113.9328,
            price_region="us-east-1",
            price_date="2026-12-02",
            price_source=(
                "Public pricing notes quoting AWS's p6 page and DoiT's us-east-1 p6-b200.48xlarge "
                "page ($113.9328/h), and a us-east-2 rate table verified against Cost Explorer "
                "(same $113.9328); read 2026-12-02"
            ),
            source=_EC2,
        ),
        InstanceType(
            name="g6e.xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=1,
            vcpus=4,
            memory_bytes=32_768 * MiB,
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=20,  # "Up to 20 Gigabit" (2.5 baseline)
            local_nvme_bytes=250 * GB,
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=1.861,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="g6e.12xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=4,
            vcpus=48,
            memory_bytes=393_216 * MiB,
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=100,
            local_nvme_bytes=3_800 * GB,  # 2 x 1900 GB
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=10.49264,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="g6e.48xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=1_572_864 * MiB,
            network_cards=4,
            max_efa_interfaces=4,
            network_bandwidth_gbps=400,
            local_nvme_bytes=7_600 * GB,  # 4 x 1900 GB
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=30.13118,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="g5.xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=1,
            vcpus=4,
            memory_bytes=16_384 * MiB,
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=10,  # "Up to 10 Gigabit" (2.5 baseline)
            local_nvme_bytes=250 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=1.006,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="g5.12xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=4,
            vcpus=48,
            memory_bytes=196_608 * MiB,
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=40,
            local_nvme_bytes=3_800 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=5.672,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
        InstanceType(
            name="g5.48xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=786_432 * MiB,
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=100,
            local_nvme_bytes=7_600 * GB,  # 2 x 3800 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=16.288,
            price_region="us-east-1",
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
            source=_EC2,
        ),
    ]
}


def get_instance_type(name: str) -> InstanceType:
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise unknown_name("instance type", name, INSTANCE_TYPES) from None
