"""The hardware catalog against data it does not own.

EC2 figures are checked against the DescribeInstanceTypes data that ships inside
moto (read straight from the package, no server); instance names against
botocore's EC2 service model; GPU memory against what EC2 reports per GPU; the
choice of types against botocore's enum, moto's GPU data and the EKS user guide's
NVIDIA AMI table (`infra.catalog.eks.NVIDIA_AMI_INSTANCE_FAMILIES`).

Every catalog type is in moto's data, so every EC2 figure is checked. botocore
lists a few GPU types moto 5.2.5 has no data for; they are in DOC_ONLY below with
the per-GPU memory from AWS's documentation, and none of them is in the catalog
(a test says so): a type added without moto data would need its figures checked
against a second recorded source instead.
"""

from __future__ import annotations

import re
from datetime import date

import botocore.session
import pytest
from moto.utilities.utils import load_resource

from infra.catalog import eks
from infra.catalog.gpus import GPUS, get_gpu
from infra.catalog.instances import EXCLUDED_INSTANCE_TYPES, INSTANCE_TYPES, get_instance_type
from infra.errors import UserError

GiB = 2**30
MiB = 2**20

EC2 = load_resource("ec2/resources/instance_types.json")
ENUM = set(botocore.session.get_session().get_service_model("ec2").shape_for("InstanceType").enum)

# The catalog's size rule: at least 24 GB per GPU. EC2 gives NVIDIA's 24 GB parts (A10G, L4)
# 22888 MiB, 23.9998e9 bytes: the rule in EC2's terms is at least that many MiB.
MIN_GPU_MIB = 22_888
MIN_GPU_GB = 24

# botocore instance types of an NVIDIA-AMI family that moto 5.2.5's DescribeInstanceTypes data
# lacks, so nothing here can check them against EC2's own figures: GPU memory per GPU in GB from
# AWS's documentation (EC2 User Guide, accelerated computing instance specifications; P6e-GB200
# UltraServer pages: 4 x GB200 with 186 GB HBM3e each, as MLCommons system descriptions also give).
DOC_ONLY = {
    "p3.2xlarge": 16,  # V100 16 GB
    "p3.8xlarge": 16,
    "p3.16xlarge": 16,
    "p6e-gb200.36xlarge": 186,  # GB200, arm64 (Grace)
}


# Families in the EKS user guide's AMI table that botocore 1.44.8 has no instance type for yet.
NOT_YET_IN_BOTOCORE = {"p6e-gb300"}


def _family(name: str) -> str:
    return name.split(".", 1)[0]


NVIDIA_AMI_FAMILIES = {f for families in eks.NVIDIA_AMI_INSTANCE_FAMILIES.values() for f in families}

# The name EC2 gives each catalog GPU in GpuInfo.Gpus[].Name.
EC2_GPU_NAME = {
    "H100-SXM-80GB": "H100",
    "H200-141GB": "H200",
    "B200": "B200",
    "A100-40GB": "A100",
    "A100-80GB": "A100",
    "L40S": "L40S",
    "A10G": "A10G",
    "L4": "L4",
    "RTX-PRO-6000-Server": "RTX PRO Server 6000",
    "B300": "B300",
}


def _network_gbps(performance: str) -> int:
    """'4x 100 Gigabit' -> 400, '3200 Gigabit' -> 3200, 'Up to 20 Gigabit' -> 20."""
    m = re.fullmatch(r"(?:Up to )?(?:(\d+)x )?(\d+) Gigabit", performance)
    assert m, f"unexpected NetworkPerformance {performance!r}"
    return int(m.group(1) or 1) * int(m.group(2))


def _only_gpu(d):
    gpus = d["GpuInfo"]["Gpus"]
    assert len(gpus) == 1, "one GPU model per instance type"
    return gpus[0]


# field -> (catalog value, EC2 value)
FIELDS = {
    "vcpus": (lambda i: i.vcpus, lambda d: d["VCpuInfo"]["DefaultVCpus"]),
    "memory_bytes": (lambda i: i.memory_bytes, lambda d: d["MemoryInfo"]["SizeInMiB"] * MiB),
    "gpu_count": (lambda i: i.gpu_count, lambda d: _only_gpu(d)["Count"]),
    "gpu_manufacturer": (lambda i: "NVIDIA", lambda d: _only_gpu(d)["Manufacturer"]),
    "gpu_name": (lambda i: EC2_GPU_NAME[i.gpu.name], lambda d: _only_gpu(d)["Name"]),
    "gpu_memory_mib_ec2": (
        lambda i: i.gpu_memory_mib_ec2,
        lambda d: _only_gpu(d)["MemoryInfo"]["SizeInMiB"],
    ),
    "network_cards": (lambda i: i.network_cards, lambda d: d["NetworkInfo"]["MaximumNetworkCards"]),
    "max_efa_interfaces": (
        lambda i: i.max_efa_interfaces,
        lambda d: (d["NetworkInfo"].get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0),
    ),
    "local_nvme_bytes": (
        lambda i: i.local_nvme_bytes,
        lambda d: d.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0) * 10**9,
    ),
    "network_bandwidth_gbps": (
        lambda i: i.network_bandwidth_gbps,
        lambda d: _network_gbps(d["NetworkInfo"]["NetworkPerformance"]),
    ),
}


@pytest.mark.parametrize(
    "itype,field",
    [(n, f) for n in INSTANCE_TYPES for f in FIELDS],
    ids=[f"{n}-{f}" for n in INSTANCE_TYPES for f in FIELDS],
)
def test_instance_figures_match_ec2(itype, field):
    assert itype in EC2, f"{itype} is not in EC2's DescribeInstanceTypes data"
    ours, theirs = FIELDS[field]
    assert ours(INSTANCE_TYPES[itype]) == theirs(EC2[itype])


def test_instance_names_are_botocore_enum_members():
    assert set(INSTANCE_TYPES) - ENUM == set()


def _qualifies_in_ec2_data(name: str) -> bool:
    """An NVIDIA GPU type with whole GPUs of at least 24 GB each, by moto's EC2 data."""
    gpus = (EC2[name].get("GpuInfo") or {}).get("Gpus", [])
    return any(
        g["Manufacturer"] == "NVIDIA" and g["Count"] >= 1 and g["MemoryInfo"]["SizeInMiB"] >= MIN_GPU_MIB
        for g in gpus
    )


def test_every_qualifying_enum_type_is_in_the_catalog_or_excluded_with_a_reason():
    in_moto = {n for n in ENUM if n in EC2 and _family(n) in NVIDIA_AMI_FAMILIES and _qualifies_in_ec2_data(n)}
    documented = {n for n, gb in DOC_ONLY.items() if gb >= MIN_GPU_GB}
    qualifying = in_moto | documented
    covered = set(INSTANCE_TYPES) | set(EXCLUDED_INSTANCE_TYPES)
    assert qualifying - covered == set(), "add these to the catalog or to EXCLUDED_INSTANCE_TYPES"
    assert covered - qualifying == set(), "these do not meet the catalog's rules"


def test_enum_types_moto_cannot_check_are_the_documented_ones():
    # A new botocore GPU type of an NVIDIA-AMI family without moto data must be looked up in
    # AWS's documentation and recorded in DOC_ONLY: nothing else can tell whether it qualifies.
    unchecked = {n for n in ENUM if _family(n) in NVIDIA_AMI_FAMILIES and n not in EC2}
    assert unchecked == set(DOC_ONLY)


def test_no_catalog_type_is_documentation_only():
    # moto checks every EC2 figure of every catalog type (test_instance_figures_match_ec2).
    assert set(INSTANCE_TYPES) & set(DOC_ONLY) == set()
    assert all(n in EC2 for n in INSTANCE_TYPES)


def test_excluded_types_are_not_in_the_catalog_and_say_why():
    assert set(EXCLUDED_INSTANCE_TYPES) & set(INSTANCE_TYPES) == set()
    assert all(reason.strip() for reason in EXCLUDED_INSTANCE_TYPES.values())


@pytest.mark.parametrize("itype", list(INSTANCE_TYPES))
def test_catalog_types_run_on_the_x86_nvidia_amis(itype):
    assert EC2[itype]["ProcessorInfo"]["SupportedArchitectures"] == ["x86_64"]
    for ami_type in eks.gpu_ami_types("x86_64"):
        assert eks.ami_supports(ami_type, itype), (ami_type, itype)


def test_ami_table_names_real_families_and_known_ami_types():
    enum_families = {_family(n) for n in ENUM}
    assert set(eks.NVIDIA_AMI_INSTANCE_FAMILIES) == set(eks.GPU_AMI_TYPES)
    for ami_type, families in eks.NVIDIA_AMI_INSTANCE_FAMILIES.items():
        arch = eks.GPU_AMI_TYPES[ami_type]
        for family in families:
            if family in NOT_YET_IN_BOTOCORE:
                assert family not in enum_families, f"{family} is in botocore now: drop it from NOT_YET_IN_BOTOCORE"
                continue
            assert family in enum_families, (ami_type, family)
            archs = {
                a for n, d in EC2.items() if _family(n) == family for a in d["ProcessorInfo"]["SupportedArchitectures"]
            }
            assert archs <= {arch}, (ami_type, family, archs)
    assert not eks.ami_supports("AL2023_x86_64_NVIDIA", "g7.48xlarge")
    assert eks.ami_supports("AL2023_x86_64_NVIDIA", "p6-b300.48xlarge")


@pytest.mark.parametrize("itype", list(INSTANCE_TYPES))
def test_first_efa_card_matches_the_cards_ec2_reports(itype):
    cards = sorted(EC2[itype]["NetworkInfo"]["NetworkCards"], key=lambda c: c["NetworkCardIndex"])
    efa_cards = [c["NetworkCardIndex"] for c in cards if "efa-only" in c.get("InterfaceTypes", [])]
    it = INSTANCE_TYPES[itype]
    if not efa_cards:
        assert it.max_efa_interfaces == 0 and it.first_efa_card == 0
        return
    assert efa_cards[0] == it.first_efa_card
    # Contiguous up to the last card, and one EFA device per EFA-capable card.
    assert efa_cards == list(range(it.first_efa_card, it.network_cards))
    assert len(efa_cards) == it.max_efa_interfaces


@pytest.mark.parametrize("name", list(GPUS))
def test_visible_memory_below_marketing(name):
    gpu = GPUS[name]
    # NVIDIA's "GB" on HBM parts is binary (80 GB = 81920 MiB in EC2), so compare in GiB.
    assert 0 < gpu.visible_memory_bytes < gpu.marketing_memory_gb * GiB


@pytest.mark.parametrize("itype", list(INSTANCE_TYPES))
def test_visible_memory_consistent_with_ec2(itype):
    ec2_bytes = _only_gpu(EC2[itype])["MemoryInfo"]["SizeInMiB"] * MiB
    visible = INSTANCE_TYPES[itype].gpu.visible_memory_bytes
    # The runtime reserves a little; a few percent at most.
    assert 0.97 * ec2_bytes <= visible <= ec2_bytes


def test_h100_visible_memory_matches_vllm_logs():
    assert abs(get_gpu("H100-SXM-80GB").visible_memory_bytes / GiB - 79.19) <= 0.1


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UserError) as e:
        get_gpu("H800")
    assert "H800" in str(e.value)
    assert all(n in str(e.value) for n in GPUS)


def test_unknown_instance_type_lists_known_names():
    with pytest.raises(UserError) as e:
        get_instance_type("p5.96xlarge")
    assert "p5.96xlarge" in str(e.value)
    assert all(n in str(e.value) for n in INSTANCE_TYPES)


def test_every_entry_has_a_source():
    assert all(g.source.strip() for g in GPUS.values())
    assert all(i.source.strip() for i in INSTANCE_TYPES.values())


def test_every_price_has_region_date_and_source():
    regions = set(botocore.session.get_session().get_available_regions("ec2"))
    for i in INSTANCE_TYPES.values():
        assert i.price_usd_per_hour > 0, i.name
        assert i.price_region in regions, i.name
        assert date.fromisoformat(i.price_date) <= date.today(), i.name
        assert i.price_source.strip(), i.name


def test_fp8_and_fp4_flags_follow_the_hardware():
    for g in GPUS.values():
        major, minor = map(int, g.compute_capability.split("."))
        assert g.supports_fp8 == ((major, minor) >= (8, 9)), g.name
        assert g.supports_fp8 == (g.fp8_dense_tflops is not None), g.name
        assert g.supports_fp4 == (major >= 10), g.name
        assert g.supports_fp4 == (g.fp4_dense_tflops is not None), g.name
