"""EC2 GPU instance types the stack can plan for, with provenance.

Hardware figures are copied from EC2 DescribeInstanceTypes (the same data moto
5.2.5 ships in moto/ec2/resources/instance_types.json.gz); tests compare every
one of them against that file, so a typo here fails CI. The product itself never
imports moto: the figures are literal data.

Prices are on-demand Linux, shared tenancy, no Savings Plan. AWS cut P4/P5 prices
by up to 45% in June 2025 (p5.48xlarge $98.32 -> $55.04 in us-east-1).

Which types are here: every NVIDIA GPU type in botocore's EC2 `InstanceType`
enum with at least 24 GB per GPU (A10G and L4 count: NVIDIA's 24 GB, EC2's
22,888 MiB) whose family the EKS AL2023 NVIDIA AMI supports
(`infra.catalog.eks.NVIDIA_AMI_INSTANCE_FAMILIES`), except those listed in
`EXCLUDED_INSTANCE_TYPES` with the reason. Left out by those rules without a
listing: under 24 GB per GPU (g4dn T4, g5g T4G, p3 V100 16 GB, the fractional-L4
g6f and gr6f), and families the AMI table does not name (g7, RTX PRO 4500
32 GB). tests/test_catalog_hardware.py checks the enum against these rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog.gpus import GPU, get_gpu
from infra.errors import unknown_name

MiB = 2**20
GB = 10**9


_EC2 = (
    "EC2 DescribeInstanceTypes (identical in moto 5.2.5 ec2/resources/instance_types.json.gz, "
    "checked by tests/test_catalog_hardware.py)"
)


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
    price_date: str  # ISO date of the price list the figure was read from
    price_source: str
    price_region: str = "us-east-1"  # every price here is a us-east-1 rate
    source: str = _EC2  # every type's hardware figures are EC2's (module doc)
    # NetworkInfo.NetworkCards: the lowest card index that takes EFA interfaces; the cards from
    # it to the last all do. 0 on every type but p6-b300.48xlarge, whose card 0 is ENA-only.
    first_efa_card: int = 0


# One public price list read for most rows; the file that quotes it says it was checked entry
# by entry against AWS's offer file and that P4/P5 rows carry the June 2025 cut.
_PRICE_LIST = (
    "AWS Price List, AmazonEC2 us-east-1 offer file version 20260924211011 (on-demand Linux), "
    "as quoted entry by entry in a public pricing table (nable prices module); read 2026-12-02"
)
_PRICE_LIST_DATE = "2026-09-24"
# Rows the price list above does not quote (p5.4xlarge, p6-b300), read from AWS's own
# on-demand price feed (ec2-ondemand-without-sec-sel, US East (N. Virginia), Linux) as
# tabulated in a public engineering note, and matching instances.vantage.sh's us-east-1
# on-demand rates (tsaol/aws-gpu data/p5_instances.js, data/p6-b300_instances.js).
_PRICE_FEED = (
    "AWS on-demand price feed, US East (N. Virginia) Linux, hawkFilePublicationDate 2026-09-18, "
    "as tabulated in a public engineering note; the same rate in instances.vantage.sh's us-east-1 "
    "data (tsaol/aws-gpu, updated 2026-08-26)"
)
_PRICE_FEED_DATE = "2026-09-18"
# gr6 and g7e: in neither of the above.
_VANTAGE = (
    "instances.vantage.sh us-east-1 on-demand rates as republished in tsaol/aws-gpu "
    "data/gr6_instances.js and data/g7e_instances.js (updated 2026-08-26); the same rates in a "
    "public table copied from the AWS console (g7e.2xlarge also in an AWS Price List query for "
    "US East (Ohio), same rate, 2026-08-06)"
)
_VANTAGE_DATE = "2026-08-26"

# NVIDIA GPU types that meet the catalog's rules (see the module doc) but are left out on
# purpose, with the reason. The tests require every such type to be in the catalog or here.
EXCLUDED_INSTANCE_TYPES: dict[str, str] = {
    "p3dn.24xlarge": (
        "8 x V100 32 GB, compute capability 7.0: no BF16 tensor cores (vLLM runs bfloat16 only from "
        "compute capability 8.0; a BF16 checkpoint would be served as float16) and no FP8 or FP4, "
        "while the planner assumes the checkpoint's own dtypes run natively"
    ),
    "p6e-gb200.36xlarge": (
        "4 x GB200 (186 GB HBM3e each) with Grace arm64 CPUs: only the AL2023 ARM NVIDIA AMI runs it "
        "and this stack's GPU nodes are x86_64 (config offers the x86_64 GPU AMI types only); sold "
        "as UltraServer Capacity Blocks; moto 5.2.5 has no DescribeInstanceTypes data for it"
    ),
}

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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST + "; $98.32 before the June 2025 cut",
        ),
        InstanceType(
            name="p5.4xlarge",
            gpu=get_gpu("H100-SXM-80GB"),
            gpu_count=1,
            vcpus=16,
            memory_bytes=262_144 * MiB,  # 256 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=100,
            local_nvme_bytes=3_800 * GB,
            gpu_memory_mib_ec2=81_920,
            price_usd_per_hour=6.88,
            price_date=_PRICE_FEED_DATE,
            price_source=_PRICE_FEED,
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
            price_date=_PRICE_LIST_DATE,
            price_source=(
                "ASSUMPTION: p5e.48xlarge has no us-east-1 on-demand listing in the AWS Price List "
                "(Capacity Blocks only; noted by several public pricing tables); the p5en.48xlarge "
                "rate (same 8 x H200) is used as a stand-in"
            ),
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
            price_date=_PRICE_LIST_DATE,
            price_source=(
                _PRICE_LIST + "; also `dstack offer` output in dstack PR #4110 (us-east-1 $63.296)"
            ),
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
            price_date="2026-12-02",
            price_source=(
                "Public pricing notes quoting AWS's p6 page and DoiT's us-east-1 p6-b200.48xlarge "
                "page ($113.9328/h), and a us-east-2 rate table verified against Cost Explorer "
                "(same $113.9328); read 2026-12-02"
            ),
        ),
        InstanceType(
            name="p6-b300.48xlarge",
            gpu=get_gpu("B300"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=4_194_304 * MiB,  # 4096 GiB
            # Card 0 takes ENA interfaces only (EC2 InterfaceTypes ['interface']); the 16 EFA
            # devices go on cards 1-16, unlike every other type here (first_efa_card below).
            network_cards=17,
            max_efa_interfaces=16,
            network_bandwidth_gbps=6400,
            local_nvme_bytes=30_400 * GB,  # 8 x 3800 GB
            gpu_memory_mib_ec2=275_040,
            price_usd_per_hour=142.416,
            price_date=_PRICE_FEED_DATE,
            price_source=_PRICE_FEED,
            first_efa_card=1,
        ),
        InstanceType(
            name="g7e.2xlarge",
            gpu=get_gpu("RTX-PRO-6000-Server"),
            gpu_count=1,
            vcpus=8,
            memory_bytes=65_536 * MiB,  # 64 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=50,
            local_nvme_bytes=1_900 * GB,
            gpu_memory_mib_ec2=98_304,
            price_usd_per_hour=3.36312,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
        ),
        InstanceType(
            name="g7e.4xlarge",
            gpu=get_gpu("RTX-PRO-6000-Server"),
            gpu_count=1,
            vcpus=16,
            memory_bytes=131_072 * MiB,  # 128 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=50,
            local_nvme_bytes=1_900 * GB,
            gpu_memory_mib_ec2=98_304,
            price_usd_per_hour=3.99816,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
        ),
        InstanceType(
            name="g7e.8xlarge",
            gpu=get_gpu("RTX-PRO-6000-Server"),
            gpu_count=1,
            vcpus=32,
            memory_bytes=262_144 * MiB,  # 256 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=100,
            local_nvme_bytes=1_900 * GB,
            gpu_memory_mib_ec2=98_304,
            price_usd_per_hour=5.26824,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
        ),
        InstanceType(
            name="g7e.12xlarge",
            gpu=get_gpu("RTX-PRO-6000-Server"),
            gpu_count=2,
            vcpus=48,
            memory_bytes=524_288 * MiB,  # 512 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=400,
            local_nvme_bytes=3_800 * GB,
            gpu_memory_mib_ec2=98_304,
            price_usd_per_hour=8.28608,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
        ),
        InstanceType(
            name="g7e.24xlarge",
            gpu=get_gpu("RTX-PRO-6000-Server"),
            gpu_count=4,
            vcpus=96,
            memory_bytes=1_048_576 * MiB,  # 1024 GiB
            network_cards=2,
            max_efa_interfaces=2,
            network_bandwidth_gbps=800,
            local_nvme_bytes=7_600 * GB,  # 2 x 3800 GB
            gpu_memory_mib_ec2=98_304,
            price_usd_per_hour=16.57216,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
        ),
        InstanceType(
            name="g7e.48xlarge",
            gpu=get_gpu("RTX-PRO-6000-Server"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=2_097_152 * MiB,  # 2048 GiB
            network_cards=4,
            max_efa_interfaces=4,
            network_bandwidth_gbps=1600,
            local_nvme_bytes=15_200 * GB,  # 4 x 3800 GB
            gpu_memory_mib_ec2=98_304,
            price_usd_per_hour=33.14432,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6e.2xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=1,
            vcpus=8,
            memory_bytes=65_536 * MiB,  # 64 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=20,  # "Up to 20 Gigabit"
            local_nvme_bytes=450 * GB,
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=2.24208,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6e.4xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=1,
            vcpus=16,
            memory_bytes=131_072 * MiB,  # 128 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=20,
            local_nvme_bytes=600 * GB,
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=3.00424,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6e.8xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=1,
            vcpus=32,
            memory_bytes=262_144 * MiB,  # 256 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=25,
            local_nvme_bytes=900 * GB,  # 2 x 450 GB
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=4.52856,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6e.16xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=1,
            vcpus=64,
            memory_bytes=524_288 * MiB,  # 512 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=35,
            local_nvme_bytes=1_900 * GB,  # 2 x 950 GB
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=7.57719,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6e.24xlarge",
            gpu=get_gpu("L40S"),
            gpu_count=4,
            vcpus=96,
            memory_bytes=786_432 * MiB,  # 768 GiB
            network_cards=2,
            max_efa_interfaces=2,
            network_bandwidth_gbps=200,
            local_nvme_bytes=3_800 * GB,  # 2 x 1900 GB
            gpu_memory_mib_ec2=45_776,
            price_usd_per_hour=15.06559,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=4,
            memory_bytes=16_384 * MiB,  # 16 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=10,  # "Up to 10 Gigabit"
            local_nvme_bytes=250 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=0.8048,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.2xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=8,
            memory_bytes=32_768 * MiB,  # 32 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=10,  # "Up to 10 Gigabit"
            local_nvme_bytes=450 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=0.9776,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.4xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=16,
            memory_bytes=65_536 * MiB,  # 64 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=25,  # "Up to 25 Gigabit"
            local_nvme_bytes=600 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=1.3232,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.8xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=32,
            memory_bytes=131_072 * MiB,  # 128 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=25,
            local_nvme_bytes=900 * GB,  # 2 x 450 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=2.0144,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.12xlarge",
            gpu=get_gpu("L4"),
            gpu_count=4,
            vcpus=48,
            memory_bytes=196_608 * MiB,  # 192 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=40,
            local_nvme_bytes=3_760 * GB,  # 4 x 940 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=4.6016,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.16xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=64,
            memory_bytes=262_144 * MiB,  # 256 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=25,
            local_nvme_bytes=1_880 * GB,  # 2 x 940 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=3.3968,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.24xlarge",
            gpu=get_gpu("L4"),
            gpu_count=4,
            vcpus=96,
            memory_bytes=393_216 * MiB,  # 384 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=50,
            local_nvme_bytes=3_760 * GB,  # 4 x 940 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=6.6752,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g6.48xlarge",
            gpu=get_gpu("L4"),
            gpu_count=8,
            vcpus=192,
            memory_bytes=786_432 * MiB,  # 768 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=100,
            local_nvme_bytes=7_520 * GB,  # 8 x 940 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=13.3504,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="gr6.4xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=16,
            memory_bytes=131_072 * MiB,  # 128 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=25,  # "Up to 25 Gigabit"
            local_nvme_bytes=600 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=1.5392,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
        ),
        InstanceType(
            name="gr6.8xlarge",
            gpu=get_gpu("L4"),
            gpu_count=1,
            vcpus=32,
            memory_bytes=262_144 * MiB,  # 256 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=25,
            local_nvme_bytes=900 * GB,  # 2 x 450 GB
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=2.4464,
            price_date=_VANTAGE_DATE,
            price_source=_VANTAGE,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g5.2xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=1,
            vcpus=8,
            memory_bytes=32_768 * MiB,  # 32 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=10,  # "Up to 10 Gigabit"
            local_nvme_bytes=450 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=1.212,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g5.4xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=1,
            vcpus=16,
            memory_bytes=65_536 * MiB,  # 64 GiB
            network_cards=1,
            max_efa_interfaces=0,
            network_bandwidth_gbps=25,  # "Up to 25 Gigabit"
            local_nvme_bytes=600 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=1.624,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g5.8xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=1,
            vcpus=32,
            memory_bytes=131_072 * MiB,  # 128 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=25,
            local_nvme_bytes=900 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=2.448,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g5.16xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=1,
            vcpus=64,
            memory_bytes=262_144 * MiB,  # 256 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=25,
            local_nvme_bytes=1_900 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=4.096,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
        InstanceType(
            name="g5.24xlarge",
            gpu=get_gpu("A10G"),
            gpu_count=4,
            vcpus=96,
            memory_bytes=393_216 * MiB,  # 384 GiB
            network_cards=1,
            max_efa_interfaces=1,
            network_bandwidth_gbps=50,
            local_nvme_bytes=3_800 * GB,
            gpu_memory_mib_ec2=22_888,
            price_usd_per_hour=8.144,
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
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
            price_date=_PRICE_LIST_DATE,
            price_source=_PRICE_LIST,
        ),
    ]
}


def get_instance_type(name: str) -> InstanceType:
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise unknown_name("instance type", name, INSTANCE_TYPES) from None
