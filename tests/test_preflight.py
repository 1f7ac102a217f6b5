"""AWS pre-flight (`infra/ops/preflight.py`, `python -m infra preflight`) against a real moto server.

What moto 5.2.5 answers itself, and is tested as it is: EC2 DescribeInstanceTypeOfferings
(per-zone offerings copied from AWS), DescribeInstanceTypes (EFA data), DescribeInstances;
Service Quotas only for service code `vpc` (for `ec2` it answers NoSuchResourceException);
EKS DescribeClusterVersions is not routed (HTTP 404); EC2 DescribeCapacityReservations is
not implemented (HTTP 500).

So: the offering, EFA and running-instance parts run against moto as they are; the quota's
unknown path and the EKS calendar fallback run against moto's real answers; the quota value,
the capacity reservations and DescribeClusterVersions are answered by `Gaps` (tests/moto_server.py)
through the very same check functions, with answers validated against botocore's model.

The AMI release, VPC, NAT gateway and Elastic IP checks run against moto itself: SSM GetParameter
(moto ships no /aws/service/eks parameter, so a release is missing until a test publishes its
parameter with `publish_parameter`), Service Quotas for service code `vpc` (moto's copy of AWS's
defaults: VPCs per Region and NAT gateways per Availability Zone, 5 each), DescribeVpcs (moto's
default VPC counts), DescribeNatGateways, DescribeSubnets and DescribeAddresses. EC2 quotas
(Standard vCPUs, Elastic IPs) come from `Gaps`, which passes the `vpc` ones through to moto.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from typer.testing import CliRunner

from infra.catalog import eks_versions as ev
from infra.ops import aws as ops_aws
from infra.config import load_stack_file
from infra.ops import preflight as pf
from infra.ops import preflight_eks as pfe
from infra.ops import preflight_stack as pfs
from infra.ops import preflight_state as pfst
from infra.catalog.instances import get_instance_type
from infra.cli.app import app
from tests import cli_in_process
from tests.moto_server import REGION, GapError, Gaps, aws, moto_server, publish_parameter  # noqa: F401  (pytest fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def plans_made_once():
    """The stack's plan (`infra.planning.make_plan`, which `target_from_stack` calls: prod's performance
    search takes seconds) is made once per request of a catalog model in this module; every caller gets a
    deep copy. make_plan is a function of the request and the catalog (tests/test_planning*.py test it);
    a request naming a config file or directory, or one the planner refuses, is made every time."""
    import infra.planning
    from infra.catalog.models import CATALOG

    real, plans = infra.planning.make_plan, {}

    def make_plan(req):
        if req.model not in CATALOG:
            return real(req)
        key = repr(req)  # every field (the request is a frozen dataclass; some fields are not hashable)
        if key not in plans:
            plans[key] = real(req)
        return copy.deepcopy(plans[key])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(infra.planning, "make_plan", make_plan)
        yield


NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)
CR_GOOD, CR_SMALL, CR_ELSEWHERE, CR_BLOCK = "cr-0a1b2c3d4e5f60001", "cr-0a1b2c3d4e5f60002", "cr-0a1b2c3d4e5f60003", "cr-0a1b2c3d4e5f60004"


def target(instance_type: str = "p5.48xlarge", nodes: int = 4, zone: str = "us-east-1a", capacity: str = "on-demand",
           reservation: str | None = None, version: str = "1.33", stack: str = "pf") -> pf.Target:  # fmt: skip
    return pf.Target(stack, REGION, get_instance_type(instance_type), nodes, zone, capacity, reservation, version)


def reservation(rid: str, *, total: int = 4, available: int | None = None, zone: str = "us-east-1a",
                itype: str = "p5.48xlarge", kind: str = "default", state: str = "active",
                start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict:  # fmt: skip
    """A DescribeCapacityReservations item as EC2 returns it."""
    item = {
        "CapacityReservationId": rid,
        "OwnerId": "123456789012",
        "InstanceType": itype,
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": zone,
        "Tenancy": "default",
        "TotalInstanceCount": total,
        "AvailableInstanceCount": total if available is None else available,
        "State": state,
        "ReservationType": kind,
        "StartDate": start or NOW - dt.timedelta(days=1),
        "EndDateType": "limited" if end else "unlimited",
        "InstanceMatchCriteria": "targeted",
    }
    if end:
        item["EndDate"] = end
    return item


def capacity_gaps(*items: dict) -> Gaps:
    """DescribeCapacityReservations as EC2 answers it (moto does not implement it)."""
    store = {i["CapacityReservationId"]: i for i in items}

    def describe(params: dict) -> dict:
        ids = params.get("CapacityReservationIds") or list(store)
        for rid in ids:
            if rid not in store:
                raise GapError("InvalidCapacityReservationId.NotFound", f"The Capacity Reservation ID '{rid}' does not exist")
        return {"CapacityReservations": [store[r] for r in ids]}

    return Gaps().on("ec2", "DescribeCapacityReservations", describe)


def quota_gaps(value: float, code: str = "L-417A185B", name: str = "Running On-Demand P instances") -> Gaps:
    """GetServiceQuota for EC2 as Service Quotas answers it (moto only knows `vpc`)."""

    def get(params: dict) -> dict:
        if params["QuotaCode"] != code:
            raise GapError("NoSuchResourceException", "The request failed because the specified service does not exist.")
        return {"Quota": {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                          "QuotaArn": f"arn:aws:servicequotas:{REGION}:123456789012:ec2/{code}", "QuotaCode": code,
                          "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False}}  # fmt: skip

    return Gaps().on("service-quotas", "GetServiceQuota", get)


EC2_QUOTA_NAMES = {
    "L-417A185B": "Running On-Demand P instances",
    "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-1216C47A": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    "L-0263D0A3": "EC2-VPC Elastic IPs",
}


def ec2_quotas(values: dict[str, float], gaps: Gaps | None = None) -> Gaps:
    """GetServiceQuota for service code `ec2` as Service Quotas answers it (`values`: quota code -> value; moto
    knows no `ec2` quota); every other service code (`vpc`) goes on to moto, which answers it itself."""

    def get(params: dict) -> dict | None:
        if params["ServiceCode"] != "ec2":
            return None
        code = params["QuotaCode"]
        if code not in values:
            raise GapError("NoSuchResourceException", "The request failed because the specified resource does not exist.")
        return {"Quota": {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                          "QuotaArn": f"arn:aws:servicequotas:{REGION}:123456789012:ec2/{code}", "QuotaCode": code,
                          "QuotaName": EC2_QUOTA_NAMES[code], "Value": values[code], "Unit": "None", "Adjustable": True,
                          "GlobalQuota": False}}  # fmt: skip

    return (gaps or Gaps()).on("service-quotas", "GetServiceQuota", get)


def publish_ami(ami_type: str, release: str, image: str = "ami-0123456789abcdef0") -> str:
    """Publish the SSM parameter of an EKS AL2023 AMI release in the moto server; its name."""
    name = pfs.ami_parameter_name(ami_type, release)
    publish_parameter(name, image)
    return name


def publish_stack_amis(version: str) -> None:
    """The GPU (NVIDIA) and system (standard) AMIs of the release pinned for `version`."""
    for ami_type in ("AL2023_x86_64_NVIDIA", pf.SYSTEM_AMI_TYPE):
        publish_ami(ami_type, ev.AL2023_RELEASES[version])


def clients(gaps: Gaps | None = None) -> pf.Clients:
    session = gaps.session() if gaps else boto3.session.Session(region_name=REGION)
    return pf.make_clients(REGION, session)


# --- instance type offered in the zone (moto's real offerings data) -----------------------------


def test_offering_go_and_no_go(aws):
    ec2 = clients().ec2
    go = pf.check_offering(ec2, target("p5en.48xlarge", 2, "us-east-1a"))
    assert go.ok is True and "offered in us-east-1a" in go.detail

    no = pf.check_offering(ec2, target("p5en.48xlarge", 2, "us-east-1b"))
    assert no.ok is False
    assert "not offered in us-east-1b" in no.detail
    # The fix names the zones that do offer it and the config key to change.
    assert "gpu-serving:network.gpuAvailabilityZone" in no.fix
    assert "us-east-1a" in no.fix and "us-east-1c" in no.fix and "us-east-1b" not in no.fix


# --- EFA (moto's copy of DescribeInstanceTypes) ----------------------------------------------------


def test_efa(aws):
    ec2 = clients().ec2
    p5 = pf.check_efa(ec2, target("p5.48xlarge"))
    assert p5.ok is True and "up to 32 interfaces" in p5.detail
    small = pf.check_efa(ec2, target("g6e.xlarge", 1))
    assert small.ok is True and small.detail.startswith("not used")
    # A plan that wires EFA on a type EC2 says has none (catalog figure altered on purpose).
    t = dataclasses.replace(target("g6e.xlarge", 1), instance=dataclasses.replace(get_instance_type("g6e.xlarge"), max_efa_interfaces=1))
    no = pf.check_efa(ec2, t)
    assert no.ok is False and "does not support EFA" in no.detail
    assert "choose an EFA instance type" in no.fix


# --- vCPU quota -------------------------------------------------------------------------------------


def test_quota_unknown_when_service_quotas_cannot_answer(aws):
    # moto's Service Quotas has no `ec2` quotas: a real NoSuchResourceException, then errors for the fallbacks.
    c = clients()
    check = pf.check_quota(c.quotas, c.ec2, target())
    assert check.ok is None and check.status == "unknown"
    assert "NoSuchResourceException" in check.detail and "1152 vCPUs" in check.detail
    assert "servicequotas:GetServiceQuota" in check.fix
    assert "Running On-Demand P instances" in check.fix and "at least 1152" in check.fix


def test_quota_value_compared_with_the_plan(aws):
    # moto cannot hold an EC2 quota value, so GetServiceQuota is answered by Gaps; the check is the same function.
    # The plan's 4 nodes and the node-update surge: EKS raises the group by max(2 x zones, maxUnavailable) = 2.
    low = clients(quota_gaps(768.0))
    check = pf.check_quota(low.quotas, low.ec2, target())
    assert check.ok is False  # enough for the nodes, not for an update
    assert "Running On-Demand P instances (L-417A185B) = 768 vCPUs" in check.detail
    assert "4 x p5.48xlarge and the update surge of 2 (the larger of 2 x 1 zone(s) and maxUnavailable 1) = 6 x 192 = 1152 vCPUs" in check.detail
    assert "request-service-quota-increase --service-code ec2 --quota-code L-417A185B --desired-value 1152" in check.fix
    assert "--region us-east-1" in check.fix

    ok = clients(quota_gaps(1152.0))
    assert pf.check_quota(ok.quotas, ok.ec2, target()).ok is True


def test_quota_counts_other_running_instances_of_the_family(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    # Another team's p5 (counts) and this stack's own node (does not: an update reuses it).
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge")
    ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "project", "Value": "gpu-serving"}, {"Key": "stack", "Value": "pf"}]}],
    )  # fmt: skip
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g6e.xlarge")  # another family
    c = clients(quota_gaps(1300.0))
    check = pf.check_quota(c.quotas, c.ec2, target())
    assert check.ok is False
    assert "192 in use by other instances (1 x p5.48xlarge)" in check.detail
    assert "--desired-value 1344" in check.fix and "stop the other instances" in check.fix
    c = clients(quota_gaps(1344.0))
    assert pf.check_quota(c.quotas, c.ec2, target()).ok is True


def test_quota_not_applicable_with_a_reservation(aws):
    c = clients()
    for kind in ("capacity-reservation", "capacity-block"):
        check = pf.check_quota(c.quotas, c.ec2, target(capacity=kind, reservation=CR_GOOD))
        assert check.ok is True and check.detail.startswith("not applicable") and CR_GOOD in check.detail
        assert "No update surge either" in check.detail and "MINIMAL" in check.detail


def test_update_surge_follows_the_eks_rule():
    # EKS User Guide, "Understand each phase of node updates": the larger of twice the zones and maxUnavailable.
    assert target().update_surge == 2
    assert dataclasses.replace(target(), node_group_zones=3).update_surge == 6
    assert dataclasses.replace(target(), max_unavailable=10).update_surge == 10
    assert dataclasses.replace(target(), node_group_zones=5, max_unavailable=20).update_surge == 20


def test_quota_codes_by_family():
    assert pf.quota_for("p5.48xlarge").code == "L-417A185B"
    assert pf.quota_for("p6-b200.48xlarge").code == "L-417A185B"
    assert pf.quota_for("g6e.xlarge").code == "L-DB2E81BA"
    assert pf.quota_for("m7i.xlarge").code == "L-1216C47A"
    assert pf.quota_for("inf2.xlarge").name == "Running On-Demand Inf instances"
    assert pf.quota_for("mac2.metal") is None


# --- capacity reservation / Capacity Block --------------------------------------------------------


@pytest.fixture
def reservations(aws):
    end_soon = NOW + dt.timedelta(minutes=20)
    return clients(capacity_gaps(
        reservation(CR_GOOD),
        reservation(CR_SMALL, total=2),
        reservation(CR_ELSEWHERE, zone="us-east-1c"),
        reservation(CR_BLOCK, kind="capacity-block", state="scheduled",
                    start=NOW + dt.timedelta(days=2), end=NOW + dt.timedelta(days=9)),
        reservation("cr-0a1b2c3d4e5f60005", kind="capacity-block", end=NOW + dt.timedelta(days=3)),
        reservation("cr-0a1b2c3d4e5f60006", kind="capacity-block", start=NOW - dt.timedelta(days=1), end=end_soon),
        reservation("cr-0a1b2c3d4e5f60007", available=1),
        reservation("cr-0a1b2c3d4e5f60008", itype="p5en.48xlarge"),
    ))  # fmt: skip


def check_cr(c: pf.Clients, rid: str, kind: str = "capacity-reservation") -> pf.Check:
    return pf.check_reservation(c.ec2, target(capacity=kind, reservation=rid), NOW)


def test_reservation_right_type_zone_and_size_is_a_go(reservations):
    check = check_cr(reservations, CR_GOOD)
    assert check.ok is True
    assert "4 x p5.48xlarge in us-east-1a" in check.detail and "4 available" in check.detail


def test_reservation_too_small(reservations):
    check = check_cr(reservations, CR_SMALL)
    assert check.ok is False and "holds 2 instances, the plan needs 4" in check.detail
    assert "at least 4 x p5.48xlarge" in check.fix


def test_reservation_in_another_zone(reservations):
    check = check_cr(reservations, CR_ELSEWHERE)
    assert check.ok is False and "it is in us-east-1c, the GPU nodes go to us-east-1a" in check.detail
    assert "gpu-serving:network.gpuAvailabilityZone to us-east-1c" in check.fix


def test_reservation_partly_in_use_or_of_another_type(reservations):
    busy = check_cr(reservations, "cr-0a1b2c3d4e5f60007")
    assert busy.ok is False and "only 1 of 4 instances are available" in busy.detail
    other = check_cr(reservations, "cr-0a1b2c3d4e5f60008")
    assert other.ok is False and "holds p5en.48xlarge" in other.detail
    assert "gpu-serving:gpu.instanceType to p5en.48xlarge" in other.fix


def test_reservation_not_found(reservations):
    check = check_cr(reservations, "cr-0fffffffffffffff0")
    assert check.ok is False and "not found" in check.detail
    assert "reservationId" in check.fix and "describe-capacity-reservations --region us-east-1" in check.fix


def test_capacity_block_scheduled_shows_start_and_end(reservations):
    check = check_cr(reservations, CR_BLOCK, "capacity-block")
    assert check.ok is False
    assert "scheduled" in check.detail
    assert "starts 2026-12-04 12:00 UTC (in 2.0 days)" in check.detail and "ends 2026-12-11 12:00 UTC" in check.detail
    assert "after 2026-12-04 11:30 UTC" in check.fix  # 30 minutes of `up` before the node group is created


def test_capacity_block_active_and_ending(reservations):
    active = check_cr(reservations, "cr-0a1b2c3d4e5f60005", "capacity-block")
    assert active.ok is True and "ends in 3.0 days" in active.detail and "40 minutes before" in active.detail
    ending = check_cr(reservations, "cr-0a1b2c3d4e5f60006", "capacity-block")
    assert ending.ok is False and "scales its node group to zero 40 minutes before" in ending.detail
    assert "purchase-capacity-block-offering" in ending.fix


def test_reservation_kind_must_match_config(reservations):
    check = check_cr(reservations, CR_GOOD, "capacity-block")
    assert check.ok is False and "not a Capacity Block" in check.detail
    assert "capacity.type to capacity-reservation" in check.fix
    check = check_cr(reservations, "cr-0a1b2c3d4e5f60005", "capacity-reservation")
    assert check.ok is False and "capacity.type to capacity-block" in check.fix


def test_reservation_unreadable_is_unknown(aws):
    # moto itself: DescribeCapacityReservations is not implemented (HTTP 500), so the answer is unknown, not a go.
    check = check_cr(clients(), CR_GOOD)
    assert check.ok is None and "could not read" in check.detail


# --- EKS version ----------------------------------------------------------------------------------


def test_eks_version_from_the_api(aws):
    def versions(params: dict) -> dict:
        table = {
            "1.34": {"clusterVersion": "1.34", "versionStatus": "STANDARD_SUPPORT", "status": "standard-support"},
            "1.31": {"clusterVersion": "1.31", "versionStatus": "EXTENDED_SUPPORT", "status": "extended-support"},
            "1.24": {"clusterVersion": "1.24", "versionStatus": "UNSUPPORTED", "status": "unsupported"},
        }
        return {"clusterVersions": [table[v] for v in params["clusterVersions"] if v in table]}

    eks = clients(Gaps().on("eks", "DescribeClusterVersions", versions)).eks
    assert pfe.check_eks_version(eks, target(version="1.34")).ok is True
    ext = pfe.check_eks_version(eks, target(version="1.31"))
    assert ext.ok is True and "extended support" in ext.detail
    old = pfe.check_eks_version(eks, target(version="1.24"))
    assert old.ok is False and "kubernetesVersion" in old.fix
    missing = pfe.check_eks_version(eks, target(version="1.19"))
    assert missing.ok is False and "does not offer Kubernetes 1.19" in missing.detail


def test_eks_version_falls_back_to_the_calendar(aws):
    # moto does not route DescribeClusterVersions (404): the built-in calendar answers, and says so.
    eks = clients().eks
    today = NOW.date()
    ext = pfe.check_eks_version(eks, target(version="1.33"), today)
    assert ext.ok is True and "extended support until 2027-07-29" in ext.detail
    assert "built-in calendar" in ext.detail and "DescribeClusterVersions failed" in ext.detail
    assert pfe.check_eks_version(eks, target(version="1.35"), today).detail.startswith("1.35: standard support until 2027-03-27")
    gone = pfe.check_eks_version(eks, target(version="1.28"), today)
    assert gone.ok is False and "support ended 2025-11-26" in gone.detail and "newest known: 1.36" in gone.fix
    new = pfe.check_eks_version(eks, target(version="1.40"), today)
    assert new.ok is None and "newer than" in new.detail


# --- the command ----------------------------------------------------------------------------------


def write_stack(root: Path, name: str, *, instance_type: str, nodes: int, gpu_zone: str = "us-east-1a",
                capacity: dict | None = None, version: str = "1.33") -> None:  # fmt: skip
    config = {
        "aws:region": REGION,
        "gpu-serving:model": {"name": "qwen3-0.6b"},
        "gpu-serving:gpu": {"instanceType": instance_type, "nodes": nodes, **({"capacity": capacity} if capacity else {})},
        "gpu-serving:network": {"availabilityZones": ["us-east-1a", "us-east-1b", "us-east-1c"], "gpuAvailabilityZone": gpu_zone},
        "gpu-serving:cluster": {"kubernetesVersion": version},
        "gpu-serving:lifecycle": {"production": False, "owner": "tests", "expiresAt": "2026-12-31T23:00:00Z"},
        # The pre-flight reads two figures of the plan, its node count and cold start, which the objective does
        # not change on these stacks; max-kv gives them without an SLA search (4 x p5.48xlarge: 11 s of CPU).
        "gpu-serving:serving": {"objective": "max-kv"},
    }
    (root / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))


def run_cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "infra", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def run_in_process(*args: str) -> subprocess.CompletedProcess:
    """The app in-process (tests/cli_in_process.py), as wide as `cli_env`; the `aws` fixture's moto server,
    credentials and region are in os.environ, which the app's boto3 session reads as the subprocess did.
    The exit status is left to the caller; a traceback fails (an exception other than the exit is raised)."""
    return cli_in_process.invoke(*args, expect=None, env={"COLUMNS": "200"})


def cli_env() -> dict:
    # The `aws` fixture put AWS_ENDPOINT_URL (the moto server), fake credentials and the region in os.environ.
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    return {**env, "COLUMNS": "200"}


def test_cli_prints_the_table_and_exits_1_on_a_no_go(aws, tmp_path):
    write_stack(tmp_path, "nogo", instance_type="p5en.48xlarge", nodes=2, gpu_zone="us-east-1b")
    proc = run_in_process("preflight", "--stack", "nogo", "--root", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Pre-flight: stack nogo, 2 x p5en.48xlarge in us-east-1b" in out
    for name in ("instance type offered in zone", "On-Demand vCPU quota", "capacity reservation", "EFA supported", "EKS version supported"):
        assert name in out
    assert "no-go" in out and "not offered in us-east-1b" in out
    assert "gpuAvailabilityZone" in out  # the fix is in the table
    assert "NO-GO" in out

    data = json.loads(run_in_process("preflight", "--stack", "nogo", "--root", str(tmp_path), "--json").stdout)
    assert data["go"] is False
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    assert statuses == {
        "instance type offered in zone": "no-go",
        "On-Demand vCPU quota": "unknown",  # moto has no EC2 quotas
        "capacity reservation": "go",
        "EFA supported": "go",
        "EKS version supported": "go",
        "add-on versions offered": "unknown",  # moto has no DescribeAddonVersions
        "AMI release published": "no-go",  # moto has no EKS AMI parameter until a test publishes it
        "On-Demand vCPU quota: system nodes, bastion": "unknown",  # moto has no EC2 quotas
        "VPC quota": "go",  # moto's `vpc` quotas: 5 VPCs, its default VPC in use
        "NAT gateway quota": "go",
        "Elastic IP quota": "unknown",  # an `ec2` quota
        "Pulumi state backend": "go",  # the test's root has no Pulumi.yaml: the current login decides
        "serving image pushed": "go",  # no repository yet: a new stack, told to push beside its first `up`
        "cluster admin access": "go",  # no adminPrincipalArns: the caller becomes the admin
    }


def test_cli_unknown_is_not_a_go_unless_allowed(aws, tmp_path):
    write_stack(tmp_path, "small", instance_type="g6e.xlarge", nodes=1)
    publish_stack_amis("1.33")
    assert run_in_process("preflight", "--stack", "small", "--root", str(tmp_path)).returncode == 1
    proc = run_in_process("preflight", "--stack", "small", "--root", str(tmp_path), "--allow-unknown")
    assert proc.returncode == 0, proc.stdout
    # The GPU and the system vCPU quotas, the Elastic IPs (moto has no `ec2` quotas) and the add-on versions.
    assert "GO" in proc.stdout and "4 unknown, allowed" in proc.stdout


def test_cli_all_go_exits_0(aws, tmp_path, monkeypatch):
    # The calls moto lacks answered by Gaps inside the CLI's own session (in-process run).
    write_stack(tmp_path, "block", instance_type="p5.48xlarge", nodes=4,
                capacity={"type": "capacity-block", "reservationId": CR_BLOCK})  # fmt: skip
    gaps = capacity_gaps(reservation(CR_BLOCK, kind="capacity-block", end=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=5)))
    gaps.on("eks", "DescribeClusterVersions",
            lambda p: {"clusterVersions": [{"clusterVersion": "1.33", "versionStatus": "STANDARD_SUPPORT"}]})  # fmt: skip
    gaps.on("eks", "DescribeAddonVersions", addon_versions_answer(ev.ADDON_VERSIONS["1.33"]))
    ec2_quotas({"L-1216C47A": 64.0, "L-0263D0A3": 5.0}, gaps)  # the system nodes' and the NAT gateway's
    publish_stack_amis("1.33")
    monkeypatch.setattr(ops_aws, "new_session", lambda region=None: gaps.session(region or REGION))
    result = CliRunner().invoke(app, ["preflight", "--stack", "block", "--root", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "GO" in result.output and "every check passed" in result.output
    assert ("ec2", "DescribeCapacityReservations") in {(s, o) for s, o, _ in gaps.calls}


def test_cli_config_errors_exit_2(aws, tmp_path):
    # This and the next run `python -m infra preflight` in a fresh process: the real entry point's exit 2 and errors.
    proc = run_cli("preflight", "--stack", "nope", "--root", str(tmp_path), env=cli_env())
    assert proc.returncode == 2 and "no stack file Pulumi.nope.yaml" in proc.stderr


def test_cli_without_credentials_exits_2(aws, tmp_path):
    write_stack(tmp_path, "small", instance_type="g6e.xlarge", nodes=1)
    env = {k: v for k, v in cli_env().items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    proc = run_cli("preflight", "--stack", "small", "--root", str(tmp_path), env=env)
    assert proc.returncode == 2 and "no AWS credentials" in proc.stderr



# --- reservations in placement groups, Capacity Block windows -------------------------------------


def test_a_reservation_in_a_placement_group_must_be_named(aws):
    arn = "arn:aws:ec2:us-east-1:123456789012:placement-group/p5-blocks"
    c = clients(capacity_gaps({**reservation(CR_GOOD), "PlacementGroupArn": arn}, reservation(CR_SMALL, total=4)))
    unnamed = pf.check_reservation(c.ec2, target(capacity="capacity-reservation", reservation=CR_GOOD), NOW)
    assert unnamed.ok is False and "made in placement group p5-blocks" in unnamed.detail
    assert "set gpu-serving:network.placementGroupName to p5-blocks" in unnamed.fix
    named = dataclasses.replace(target(capacity="capacity-reservation", reservation=CR_GOOD), placement_group_name="p5-blocks")
    go = pf.check_reservation(c.ec2, named, NOW)
    assert go.ok is True and "in placement group p5-blocks" in go.detail
    stray = dataclasses.replace(target(capacity="capacity-reservation", reservation=CR_SMALL), placement_group_name="p5-blocks")
    no = pf.check_reservation(c.ec2, stray, NOW)
    assert no.ok is False and "in no placement group" in no.detail and "remove gpu-serving:network.placementGroupName" in no.fix


def _block(rid: str, **kw) -> dict:
    return reservation(rid, kind="capacity-block", **kw)


def test_capacity_block_window_against_the_planned_change(aws):
    soon, short, long_ = "cr-0a1b2c3d4e5f60011", "cr-0a1b2c3d4e5f60012", "cr-0a1b2c3d4e5f60013"
    c = clients(capacity_gaps(
        _block(soon, state="scheduled", start=NOW + dt.timedelta(minutes=20), end=NOW + dt.timedelta(days=1)),
        _block(short, start=NOW - dt.timedelta(hours=23), end=NOW + dt.timedelta(minutes=90)),
        _block(long_, start=NOW - dt.timedelta(hours=1), end=NOW + dt.timedelta(days=2)),
    ))  # fmt: skip
    t = dataclasses.replace(target(capacity="capacity-block"), cold_start=dt.timedelta(minutes=10))
    # Starts before `up` reaches the node group: a go.
    starting = pf.check_reservation(c.ec2, dataclasses.replace(t, reservation_id=soon), NOW)
    assert starting.ok is True and "before the change reaches the node group" in starting.detail
    # Active, but 30 min lead + 15 min to Ready + 10 min cold start + the 40 min scale-down leave nothing.
    ending = pf.check_reservation(c.ec2, dataclasses.replace(t, reservation_id=short), NOW)
    assert ending.ok is False and "nothing would serve" in ending.detail and "cold start takes 0.2 h" in ending.detail
    assert "a new block gets a new node group, created before the old one goes" in ending.fix
    # Two days: a go, with the serving time this change leaves.
    fine = pf.check_reservation(c.ec2, dataclasses.replace(t, reservation_id=long_), NOW)
    assert fine.ok is True and "leaving ~46.4 h of serving after this change" in fine.detail


# --- Kubernetes version warning, add-on pins --------------------------------------------------------


def test_eks_version_warns_within_60_days_of_the_end_of_standard_support(aws):
    eks = clients().eks  # moto: the calendar answers
    warned = pfe.check_eks_version(eks, target(version="1.35"), dt.date(2027, 2, 1))
    assert warned.ok is True and warned.status == "go"
    assert warned.warning.startswith("standard support of 1.35 ends 2027-03-27 (in 54 days)")
    assert "one minor version at a time" in warned.fix
    assert pfe.check_eks_version(eks, target(version="1.35"), dt.date(2027, 1, 25)).warning == ""  # 61 days out: not yet
    assert "(in 60 days)" in pfe.check_eks_version(eks, target(version="1.35"), dt.date(2027, 1, 26)).warning
    assert pfe.check_eks_version(eks, target(version="1.33"), NOW.date()).warning.startswith("standard support of 1.33 ended")

    def versions(params: dict) -> dict:
        return {"clusterVersions": [{"clusterVersion": "1.35", "versionStatus": "STANDARD_SUPPORT",
                                     "endOfStandardSupportDate": dt.datetime(2027, 3, 27, tzinfo=dt.timezone.utc)}]}  # fmt: skip

    api = clients(Gaps().on("eks", "DescribeClusterVersions", versions)).eks
    assert "ends 2027-03-27 (in 54 days)" in pfe.check_eks_version(api, target(version="1.35"), dt.date(2027, 2, 1)).warning


def test_render_shows_the_warning(aws):
    from rich.console import Console

    console = Console(record=True, width=600)
    check = pfe.check_eks_version(clients().eks, target(version="1.35"), dt.date(2027, 2, 1))
    pf.render(target(version="1.35"), [check], console)
    out = console.export_text()
    assert "(warning)" in out and "Warning: standard support of 1.35 ends 2027-03-27" in out
    assert "one minor version at a time" in out  # the fix column is shown for a warning


def addon_versions_answer(pins: dict, drop: str = ""):
    """DescribeAddonVersions as EKS answers it (moto 5.2.5 does not implement it): each pin, bar `drop`, offered."""

    def answer(params: dict) -> dict:
        name = params["addonName"]
        offered = [f"{pins[name].version.rsplit('.', 1)[0]}.99"] + ([] if name == drop else [pins[name].version])
        return {"addons": [{"addonName": name, "type": "networking", "addonVersions": [
            {"addonVersion": v, "architecture": ["amd64", "arm64"],
             "compatibilities": [{"clusterVersion": params["kubernetesVersion"], "platformVersions": ["*"], "defaultVersion": False}]}
            for v in offered]}]}  # fmt: skip

    return answer


def test_addon_pins_checked_against_describe_addon_versions(aws):
    pins = ev.ADDON_VERSIONS["1.35"]
    t = dataclasses.replace(target(version="1.35"), addon_versions=tuple((a, p.version) for a, p in pins.items()))
    gaps = Gaps().on("eks", "DescribeAddonVersions", addon_versions_answer(pins))
    ok = pfe.check_addon_versions(clients(gaps).eks, t)
    assert ok.ok is True and "vpc-cni v1.21.1-eksbuild.7" in ok.detail
    asked = {(p["addonName"], p["kubernetesVersion"]) for svc, op, p in gaps.calls if op == "DescribeAddonVersions"}
    assert asked == {(a, "1.35") for a in pins}
    gaps = Gaps().on("eks", "DescribeAddonVersions", addon_versions_answer(pins, drop="coredns"))
    no = pfe.check_addon_versions(clients(gaps).eks, t)
    assert no.ok is False and f"EKS does not offer coredns {pins['coredns'].version} for Kubernetes 1.35" in no.detail
    assert "ADDON_VERSIONS['1.35']" in no.fix
    assert f"(coredns: e.g. {pins['coredns'].version.rsplit('.', 1)[0]}.99)" in no.fix  # what EKS does offer
    unknown = pfe.check_addon_versions(clients().eks, t)  # moto itself: not routed
    assert unknown.ok is None and "could not list the versions of" in unknown.detail


def test_target_of_the_prod_stack(aws):
    ev_today = dt.date(2026, 12, 3)
    mp = pytest.MonkeyPatch()
    mp.setattr(ev, "today", lambda: ev_today)
    try:
        t = pf.target_from_stack("prod", REPO_ROOT)
    finally:
        mp.undo()
    assert t.kubernetes_version == "1.35" and t.update_surge == 2 and t.vcpus_needed == 6 * 192
    assert dict(t.addon_versions) == {a: p.version for a, p in ev.ADDON_VERSIONS["1.35"].items() if a != "aws-fsx-csi-driver"}
    target_s = load_stack_file("prod").serving.cold_start_target_seconds
    assert dt.timedelta(minutes=5) < t.cold_start <= dt.timedelta(seconds=target_s)  # the plan's estimate, within its target


def test_target_of_the_prod_stack_names_what_else_it_creates(aws):
    mp = pytest.MonkeyPatch()
    mp.setattr(ev, "today", lambda: dt.date(2026, 12, 3))
    try:
        t = pf.target_from_stack("prod", REPO_ROOT)
    finally:
        mp.undo()
    release = ev.AL2023_RELEASES["1.35"]
    assert t.node_amis == (
        pf.NodeAmi("GPU nodes", "AL2023_x86_64_NVIDIA", release, "infra/catalog/eks_versions.py AL2023_RELEASES['1.35']"),
        pf.NodeAmi("system nodes", "AL2023_x86_64_STANDARD", release, "infra/catalog/eks_versions.py AL2023_RELEASES['1.35']"),
    )
    # private-ssm: the bastion; natGatewayPerAz: a NAT gateway (and an Elastic IP) in each of the three zones.
    assert t.bastion_instance_type == "t3.micro" and t.creates_vpc
    assert t.nat_zones == ("us-east-1a", "us-east-1b", "us-east-1c")
    assert t.other_instances == (("m7i.xlarge", 2 + 6, "2 system node(s) and the update surge of 6"), ("t3.micro", 1, "the SSM bastion"))


def test_what_preflight_reads_agrees_with_the_program():
    # Copied here, not imported (the program's modules build Pulumi resources): they must say the same.
    from components.cluster import SYSTEM_AMI_TYPE
    from components.network import nat_zones
    from infra.aws.access import BASTION_INSTANCE_TYPE

    assert pf.SYSTEM_AMI_TYPE == SYSTEM_AMI_TYPE
    zones = ("us-east-1a", "us-east-1b", "us-east-1c")
    for per_az in (True, False):
        assert pf.nat_zones(zones, per_az) == nat_zones(zones, per_az)
    assert BASTION_INSTANCE_TYPE == "t3.micro"  # the vCPUs the check counts for it come from DescribeInstanceTypes
    # Every AL2023 AMI type EKS knows has its path (botocore's eks model, AMITypes).
    import botocore.session

    ami_types = botocore.session.get_session().get_service_model("eks").shape_for("AMITypes").enum
    assert {a for a in ami_types if a.startswith("AL2023_")} == set(pfs.AL2023_AMI_PATHS)
    # The quota codes: moto's copy of AWS's default `vpc` quotas names the two VPC ones.
    from moto.servicequotas.resources.default_quotas.vpc import VPC_DEFAULT_QUOTAS

    names = {q["QuotaCode"]: q["QuotaName"] for q in VPC_DEFAULT_QUOTAS}
    assert names[pf.VPC_QUOTA.code] == pf.VPC_QUOTA.name and names[pf.NAT_QUOTA.code] == pf.NAT_QUOTA.name


# --- AMI release published (SSM GetParameter against moto) -----------------------------------------------------


def amis_target(release: str = "1.35.6-20260714", version: str = "1.35", gpu_ami: str = "AL2023_x86_64_NVIDIA") -> pf.Target:
    pin = f"infra/catalog/eks_versions.py AL2023_RELEASES[{version!r}]"
    return dataclasses.replace(target("g6e.xlarge", 1, version=version), node_amis=(
        pf.NodeAmi("GPU nodes", gpu_ami, release, pin), pf.NodeAmi("system nodes", pf.SYSTEM_AMI_TYPE, release, pin)))  # fmt: skip


def test_ami_parameter_names():
    # The EKS User Guide's tree (/aws/service/eks/optimized-ami/<version>/amazon-linux-2023/x86_64/nvidia/...)
    # with a release's name in place of `recommended`, as Karpenter resolves al2023@v<date>.
    assert pfs.ami_parameter_name("AL2023_x86_64_NVIDIA", "1.35.6-20260714") == (
        "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/"
        "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id")
    assert pfs.ami_parameter_name("AL2023_x86_64_STANDARD", "1.33.13-20260714") == (
        "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/x86_64/standard/"
        "amazon-eks-node-al2023-x86_64-standard-1.33-v20260714/image_id")
    assert "/arm64/nvidia/amazon-eks-node-al2023-arm64-nvidia-1.34-v20260714/" in pfs.ami_parameter_name("AL2023_ARM_64_NVIDIA", "1.34.9-20260714")
    assert pfs.ami_parameter_name("BOTTLEROCKET_x86_64_NVIDIA", "1.35.6-20260714") is None
    assert pfs.ami_parameter_name("AL2023_x86_64_NVIDIA", "v20260714") is None


def test_ami_release_missing_is_a_no_go_published_is_a_go(aws):
    ssm = clients().ssm
    t = amis_target()
    missing = pfs.check_ami_release(ssm, t)
    assert missing.ok is False and missing.status == "no-go"
    assert "GPU nodes: AL2023_x86_64_NVIDIA 1.35.6-20260714 is not published in us-east-1" in missing.detail
    assert "amazon-eks-node-al2023-x86_64-nvidia-1.35-v20260714/image_id" in missing.detail
    # One fix for both node groups (they share the pin), and how to read the newest release.
    assert missing.fix == (
        "pin an AMI release that exists in us-east-1: infra/catalog/eks_versions.py AL2023_RELEASES['1.35']; the newest: "
        "`aws ssm get-parameter --name /aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/recommended/"
        "release_version --region us-east-1`")

    publish_ami("AL2023_x86_64_NVIDIA", "1.35.6-20260714", "ami-0aaaaaaaaaaaaaaa1")
    half = pfs.check_ami_release(ssm, t)  # the system nodes' (standard) AMI is still missing
    assert half.ok is False and "GPU nodes: AL2023_x86_64_NVIDIA 1.35.6-20260714 is ami-0aaaaaaaaaaaaaaa1" in half.detail
    assert "system nodes: AL2023_x86_64_STANDARD 1.35.6-20260714 is not published" in half.detail

    publish_ami(pf.SYSTEM_AMI_TYPE, "1.35.6-20260714", "ami-0bbbbbbbbbbbbbbb2")
    go = pfs.check_ami_release(ssm, t)
    assert go.ok is True and "ami-0aaaaaaaaaaaaaaa1" in go.detail and "ami-0bbbbbbbbbbbbbbb2" in go.detail
    # Published in us-east-1 is not published in us-west-2: the check asks the region the stack deploys to.
    west = pf.make_clients("us-west-2", boto3.session.Session(region_name="us-west-2")).ssm
    assert pfs.check_ami_release(west, dataclasses.replace(t, region="us-west-2")).ok is False


def test_ami_release_of_another_kubernetes_version_or_not_readable(aws):
    publish_stack_amis("1.34")
    other = pfs.check_ami_release(clients().ssm, amis_target(ev.AL2023_RELEASES["1.34"], version="1.35"))
    assert other.ok is False and "is a release of Kubernetes 1.34; the cluster runs 1.35" in other.detail
    assert "pin a Kubernetes 1.35 release" in other.fix

    def denied(params: dict) -> dict:
        raise GapError("AccessDeniedException", "User is not authorized to perform: ssm:GetParameter")

    no_access = pfs.check_ami_release(clients(Gaps().on("ssm", "GetParameter", denied)).ssm, amis_target())
    assert no_access.ok is None and no_access.status == "unknown"
    assert "grant ssm:GetParameter on arn:aws:ssm:us-east-1::parameter/aws/service/eks/*" in no_access.fix

    # A Bottlerocket GPU release is not looked up: unknown (the system nodes' AL2023 AMI still is).
    publish_stack_amis("1.35")
    br = pfs.check_ami_release(clients().ssm, amis_target(gpu_ami="BOTTLEROCKET_x86_64_NVIDIA"))
    assert br.ok is None and "BOTTLEROCKET_x86_64_NVIDIA 1.35.6-20260714 not looked up" in br.detail
    assert "system nodes: AL2023_x86_64_STANDARD 1.35.6-20260714 is ami-" in br.detail


# --- the system nodes' and the bastion's vCPUs ----------------------------------------------------------------------


def test_system_vcpu_quota(aws):
    # Two m7i.xlarge system nodes in 2 zones and their update surge max(2 x 2, 1) = 4: 6 x 4 vCPUs; the bastion 2.
    t = dataclasses.replace(target("g6e.xlarge", 1), bastion_instance_type="t3.micro")
    low = clients(ec2_quotas({"L-1216C47A": 24.0}))
    no = pfs.check_system_vcpu_quota(low.quotas, low.ec2, t)
    assert no.ok is False
    assert ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances (L-1216C47A) = 24 vCPUs; the stack needs "
            "2 system node(s) and the update surge of 4 = 6 x m7i.xlarge (24 vCPUs) + the SSM bastion = 1 x t3.micro (2 vCPUs)") in no.detail
    assert "--service-code ec2 --quota-code L-1216C47A --desired-value 26 --region us-east-1" in no.fix
    assert "systemNodeCount" in no.fix
    ok = clients(ec2_quotas({"L-1216C47A": 26.0}))
    assert pfs.check_system_vcpu_quota(ok.quotas, ok.ec2, t).ok is True
    # Another team's m7i counts; this stack's own system node does not.
    ec2 = boto3.client("ec2", region_name=REGION)
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="m7i.xlarge")
    ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="m7i.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "project", "Value": "gpu-serving"}, {"Key": "stack", "Value": "pf"}]}],
    )  # fmt: skip
    busy = pfs.check_system_vcpu_quota(ok.quotas, ok.ec2, t)
    assert busy.ok is False and "4 in use by other instances (1 x m7i.xlarge)" in busy.detail
    assert "--desired-value 30" in busy.fix and "stop the other instances" in busy.fix
    # No bastion (public-restricted) and moto's own answer for `ec2` quotas: unknown, with what is needed.
    unknown = pfs.check_system_vcpu_quota(clients().quotas, clients().ec2, target("g6e.xlarge", 1))
    assert unknown.ok is None and "NoSuchResourceException" in unknown.detail and "bastion" not in unknown.detail
    assert "servicequotas:GetServiceQuota" in unknown.fix


def test_system_instance_type_ec2_does_not_know(aws):
    c = clients(ec2_quotas({"L-1216C47A": 1000.0}))
    check = pfs.check_system_vcpu_quota(c.quotas, c.ec2, dataclasses.replace(target(), system_instance_type="m99z.xlarge"))
    assert check.ok is False and "EC2 does not know m99z.xlarge" in check.detail and "systemInstanceType" in check.fix


# --- VPCs, NAT gateways, Elastic IPs (moto's own `vpc` quotas and resources) ---------------------------------------


def network_target(nat_zones: tuple[str, ...] = ("us-east-1a",), existing: str | None = None) -> pf.Target:
    return dataclasses.replace(target("g6e.xlarge", 1), nat_zones=() if existing else nat_zones, existing_vpc_id=existing)


OWN_TAGS = [{"ResourceType": "vpc", "Tags": [{"Key": "project", "Value": "gpu-serving"}, {"Key": "stack", "Value": "pf"}]}]


def test_vpc_quota_counts_the_vpcs_in_the_region(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    for i in range(3):
        ec2.create_vpc(CidrBlock=f"10.{i}.0.0/16")
    ec2.create_vpc(CidrBlock="10.9.0.0/16", TagSpecifications=OWN_TAGS)  # this stack's: a rerun reuses it
    c = clients()
    go = pfs.check_vpc_quota(c.quotas, c.ec2, network_target())  # moto's default VPC and 3 others: 4 of 5
    assert go.ok is True and "VPCs per Region (L-F678F1CE) = 5: 4 in use, the stack adds 1 (its VPC)" in go.detail
    ec2.create_vpc(CidrBlock="10.3.0.0/16")
    no = pfs.check_vpc_quota(c.quotas, c.ec2, network_target())
    assert no.ok is False and "5 in use, the stack adds 1" in no.detail
    assert "--service-code vpc --quota-code L-F678F1CE --desired-value 6 --region us-east-1" in no.fix
    assert "gpu-serving:network.existingVpcId" in no.fix
    existing = pfs.check_vpc_quota(c.quotas, c.ec2, network_target(existing="vpc-0123456789abcdef0"))
    assert existing.ok is True and existing.detail.startswith("not applicable: the stack uses the existing VPC vpc-0123456789abcdef0")


def test_nat_gateway_quota_per_zone(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    for _ in range(5):
        ec2.create_nat_gateway(SubnetId=subnet, AllocationId=ec2.allocate_address(Domain="vpc")["AllocationId"])
    c = clients()
    full = pfs.check_nat_quota(c.quotas, c.ec2, network_target(("us-east-1a", "us-east-1b")))
    assert full.ok is False
    assert "NAT gateways per Availability Zone (L-FE5A380F) = 5 in us-east-1a: 5 in use, the stack adds 1" in full.detail
    assert "= 5 in us-east-1b: 0 in use" in full.detail
    assert "--service-code vpc --quota-code L-FE5A380F --desired-value 6" in full.fix
    assert "delete unused NAT gateways in us-east-1a" in full.fix and "natGatewayPerAz: false" in full.fix
    assert pfs.check_nat_quota(c.quotas, c.ec2, network_target(("us-east-1b",))).ok is True
    assert pfs.check_nat_quota(c.quotas, c.ec2, network_target(existing="vpc-0123456789abcdef0")).ok is True


def test_elastic_ip_quota_one_per_nat_gateway(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    for _ in range(4):
        ec2.allocate_address(Domain="vpc")
    c = clients(ec2_quotas({"L-0263D0A3": 5.0}))
    per_az = pfs.check_eip_quota(c.quotas, c.ec2, network_target(("us-east-1a", "us-east-1b")))
    assert per_az.ok is False
    assert "EC2-VPC Elastic IPs (L-0263D0A3) = 5: 4 in use, the stack adds 2 (one per NAT gateway, in us-east-1a, us-east-1b)" in per_az.detail
    assert "--service-code ec2 --quota-code L-0263D0A3 --desired-value 6" in per_az.fix
    assert "release unassociated Elastic IPs" in per_az.fix and "natGatewayPerAz: false" in per_az.fix
    assert pfs.check_eip_quota(c.quotas, c.ec2, network_target(("us-east-1a",))).ok is True
    unknown = pfs.check_eip_quota(clients().quotas, clients().ec2, network_target())  # moto: no `ec2` quotas
    assert unknown.ok is None and "at least 5" in unknown.fix


# --- acceptance: `python -m infra preflight` with a missing AMI release and too small a vCPU quota -----------------


def write_full_stack(root: Path, name: str) -> None:
    """A g6e.xlarge stack on Kubernetes 1.35 with the defaults: private-ssm (a bastion), one NAT gateway."""
    write_stack(root, name, instance_type="g6e.xlarge", nodes=1, version="1.35")


def preflight_in_process(root: Path, stack: str, gaps: Gaps, monkeypatch, *args: str):
    monkeypatch.setattr(ops_aws, "new_session", lambda region=None: gaps.session(region or REGION))
    # Wide enough that no cell of the table wraps: the fixes are asserted whole.
    return CliRunner().invoke(app, ["preflight", "--stack", stack, "--root", str(root), *args], env={"COLUMNS": "3000"})


def eks_answers(version: str) -> Gaps:
    gaps = Gaps().on("eks", "DescribeClusterVersions",
                     lambda p: {"clusterVersions": [{"clusterVersion": version, "versionStatus": "STANDARD_SUPPORT"}]})  # fmt: skip
    return gaps.on("eks", "DescribeAddonVersions", addon_versions_answer(ev.ADDON_VERSIONS[version]))


def test_acceptance_missing_ami_release_and_small_vcpu_quota_are_no_go(aws, tmp_path, monkeypatch):
    write_full_stack(tmp_path, "short")
    # No AMI parameter published (moto ships none under /aws/service/eks); the G and Standard quotas too small.
    gaps = ec2_quotas({"L-DB2E81BA": 4.0, "L-1216C47A": 16.0, "L-0263D0A3": 5.0}, eks_answers("1.35"))
    result = preflight_in_process(tmp_path, "short", gaps, monkeypatch)
    assert result.exit_code == 1, result.output
    out = result.output
    release = ev.AL2023_RELEASES["1.35"]
    assert "NO-GO: 3 no-go" in out
    ami_fix = "pin an AMI release that exists in us-east-1: infra/catalog/eks_versions.py AL2023_RELEASES['1.35']"
    assert f"GPU nodes: AL2023_x86_64_NVIDIA {release} is not published in us-east-1" in out and ami_fix in out
    assert "--quota-code L-DB2E81BA --desired-value 12" in out  # 1 g6e.xlarge and the update surge of 2: 3 x 4 vCPUs
    # 2 m7i.xlarge system nodes in 3 zones with the surge of 6 (8 x 4 vCPUs) and the t3.micro bastion (2): 34 vCPUs.
    assert "--quota-code L-1216C47A --desired-value 34" in out

    data = json.loads(preflight_in_process(tmp_path, "short", gaps, monkeypatch, "--json").output)
    checks = {c["name"]: c for c in data["checks"]}
    assert data["go"] is False
    assert {n for n, c in checks.items() if c["status"] != "go"} == {
        "AMI release published", "On-Demand vCPU quota", "On-Demand vCPU quota: system nodes, bastion"}
    assert checks["AMI release published"]["status"] == "no-go" and checks["AMI release published"]["fix"].startswith(ami_fix)
    assert checks["On-Demand vCPU quota"]["status"] == "no-go"
    assert checks["On-Demand vCPU quota: system nodes, bastion"]["status"] == "no-go"
    assert "request L-1216C47A >= 34" in checks["On-Demand vCPU quota: system nodes, bastion"]["fix"]
    assert checks["VPC quota"]["status"] == checks["NAT gateway quota"]["status"] == checks["Elastic IP quota"]["status"] == "go"


def test_acceptance_published_release_and_enough_quota_is_a_go(aws, tmp_path, monkeypatch):
    write_full_stack(tmp_path, "fine")
    publish_stack_amis("1.35")  # only here: the AMI parameters of the pinned release
    gaps = ec2_quotas({"L-DB2E81BA": 12.0, "L-1216C47A": 34.0, "L-0263D0A3": 5.0}, eks_answers("1.35"))
    result = preflight_in_process(tmp_path, "fine", gaps, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "GO: every check passed" in result.output
    asked = [p["Name"] for s, o, p in gaps.calls if o == "GetParameter"]
    assert asked == []  # SSM is moto's own answer, not a gap
    data = json.loads(preflight_in_process(tmp_path, "fine", gaps, monkeypatch, "--json").output)
    assert data["go"] is True and all(c["status"] == "go" for c in data["checks"])


# --- the state backend (no AWS call) ------------------------------------------------------------------------------


def test_a_production_stack_on_a_local_state_file_is_warned(tmp_path):
    from infra.config import REPO_ROOT

    url, source = pfst.state_backend(REPO_ROOT, {})
    assert (url, source) == ("file://~", "Pulumi.yaml backend.url")  # the repository's default
    prod = pf.Target(stack="prod", region="us-east-1", instance=get_instance_type("p5.48xlarge"), nodes=4, zone="us-east-1a",
                     capacity_type="on-demand", reservation_id=None, kubernetes_version="1.35", production=True,
                     backend_url=url, backend_source=source)  # fmt: skip
    check = pfst.check_state_backend(prod)
    assert check.ok is True and "local file" in check.warning and "s3://" in check.fix and "awskms://" in check.fix
    # The project file sets backend.url, which Pulumi takes before a stored login: the fix names the variable.
    assert "export PULUMI_BACKEND_URL=s3://" in check.fix and "pulumi login s3://" not in check.fix
    assert not pfst.check_state_backend(dataclasses.replace(prod, production=False)).warning
    # The environment wins over the project (pulumi/pulumi#5789), and an S3 backend needs no warning.
    url, source = pfst.state_backend(REPO_ROOT, {"PULUMI_BACKEND_URL": "s3://state-bucket"})
    assert (url, source) == ("s3://state-bucket", "PULUMI_BACKEND_URL")
    assert not pfst.check_state_backend(dataclasses.replace(prod, backend_url=url, backend_source=source)).warning
    # Nothing set: the current `pulumi login` decides; production is told to make sure.
    unset = pfst.state_backend(tmp_path, {})
    assert unset[0] is None
    check = pfst.check_state_backend(dataclasses.replace(prod, backend_url=None, backend_source=unset[1]))
    assert check.ok is True and check.warning
