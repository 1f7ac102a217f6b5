"""GPU node disks, repair and Capacity Block lifecycle (infra/aws/gpu_nodes.py, components/gpu_nodes.py).

- the nodeadm NodeConfig in the launch template's user data: a MIME multi-part
  document EKS can merge, asking for RAID0 on the instance store, on every
  AL2023 type with local NVMe (EC2's InstanceStorageInfo, via moto's data), and
  on every EFA type (EC2's EfaSupported) for a containers' locked-memory limit
  that survives nodeadm's merge into containerd's base runtime spec (modelled
  on nodeadm's code and checked on nodeadm's own e2e case) with the open-file
  default intact; valid against nodeadm's NodeConfig CRD;
- the gp3 root volume's IOPS and throughput, within gp3's limits;
- node auto repair on the GPU node group, as botocore's EKS model spells it;
- a Capacity Block's node group named after its block, and replaced (old one
  first) rather than updated in place; the resource options are computed by
  small functions and checked as the engine records them.
"""

from __future__ import annotations

import base64
import email
import json
import re
from typing import Any

import botocore.session
import jsonschema
import pytest
from moto.utilities.utils import load_resource

from components.gpu_nodes import GpuNodeGroup, GpuNodeGroupArgs
from infra.aws import gpu_nodes as g
from infra.catalog.instances import INSTANCE_TYPES, get_instance_type
from infra.preview.recording import record
from tests.test_rayspec import _strict
from tests import yaml_text

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"
RESERVATION = "cr-0123456789abcdef0"
EKS = botocore.session.get_session().get_service_model("eks")
EC2 = botocore.session.get_session().get_service_model("ec2")
EC2_TYPES = {t["InstanceType"]: t for t in load_resource("ec2/resources/instance_types.json").values()}


def _args(instance: str = "p5.48xlarge", **overrides: Any) -> GpuNodeGroupArgs:
    base = dict(cluster_name="gpu-serving-prod", node_role_arn="arn:aws:iam::123456789012:role/gpu-node",
                subnet_id="subnet-gpu", security_group_ids=["sg-efa", "sg-cluster"],
                instance_type=get_instance_type(instance), node_count=4, root_volume_gib=200,
                release_version="1.35.6-20260714", kubernetes_version="1.35", tags={"project": "gpu-serving"})
    base.update(overrides)
    return GpuNodeGroupArgs(**base)


def _record(a: GpuNodeGroupArgs):
    return record(lambda: GpuNodeGroup("gpu", a))


def _parts(user_data: str) -> list[email.message.Message]:
    msg = email.message_from_string(user_data)
    assert msg.get_content_type() == "multipart/mixed" and msg["MIME-Version"] == "1.0"
    return list(msg.walk())[1:]


# --- nodeadm local storage ------------------------------------------------------------------------


def _node_config(text: str) -> dict:
    (part,) = _parts(text)
    assert part.get_content_type() == g.NODEADM_CONTENT_TYPE
    return yaml_text.safe_load(part.get_payload())


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_raid0_on_every_al2023_type_with_instance_store(name):
    itype = get_instance_type(name)
    ec2 = EC2_TYPES[name]
    has_store = bool(ec2.get("InstanceStorageSupported")) and ec2.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0) > 0
    has_efa = bool(ec2.get("NetworkInfo", {}).get("EfaSupported"))
    assert (itype.local_nvme_bytes > 0) == has_store
    text = g.node_user_data("AL2023_x86_64_NVIDIA", itype)
    assert (text is not None) == (has_store or has_efa)
    if text is None:
        return
    doc = _node_config(text)
    assert (doc["apiVersion"], doc["kind"]) == ("node.eks.aws/v1alpha1", "NodeConfig")
    storage = doc["spec"].get("instance", {}).get("localStorage")
    assert storage == ({"strategy": "RAID0"} if has_store else None)
    assert ("containerd" in doc["spec"]) == has_efa


# --- nodeadm: the containers' locked-memory limit on EFA types ---------------------------------------


def _nodeadm_merge(default: Any, given: Any) -> Any:
    """nodeadm's merge of `baseRuntimeSpec` onto its default (nodeadm/internal/util/merge.go: both sides
    through encoding/json into map[string]interface{}, so every number a float64; mergo WithOverride: maps
    merged key by key, anything else, arrays included, replaced)."""
    if isinstance(default, dict) and isinstance(given, dict):
        out = dict(default)
        for key, value in given.items():
            out[key] = _nodeadm_merge(default.get(key), value)
        return out
    return given


def _as_go_float64(doc: Any) -> Any:
    """A JSON document as Go's encoding/json decodes it into interface{} and encodes it back."""
    return json.loads(json.dumps(doc), parse_int=lambda digits: _go_float_text(float(digits)), parse_float=float)


def _go_float_text(value: float) -> int | float:
    # encoding/json writes a float64 below 1e21 in plain decimal, i.e. the float's exact integer value.
    return int(value) if value.is_integer() and abs(value) < 1e21 else value


def _user_node_config(fixture_file, name: str = "p5.48xlarge") -> tuple[dict, dict]:
    default = json.loads(fixture_file("amazon-eks-ami-nodeadm", "base-runtime-spec.json").read_text())
    doc = _node_config(g.node_user_data("AL2023_x86_64_NVIDIA", get_instance_type(name)))
    return default, doc


def test_the_merge_model_reproduces_nodeadms_own_case(fixture_file):
    """The merge above, on nodeadm's e2e case (tests/e2e/cases/containerd-base-runtime-spec): its
    expected file is what nodeadm wrote, so the model replaces arrays as nodeadm does."""
    default = json.loads(fixture_file("amazon-eks-ami-nodeadm", "base-runtime-spec.json").read_text())
    case = yaml_text.safe_load(fixture_file("amazon-eks-ami-nodeadm", "e2e-containerd-base-runtime-spec-config.yaml").read_text())
    expected = json.loads(fixture_file("amazon-eks-ami-nodeadm", "e2e-containerd-base-runtime-spec-expected.json").read_text())
    assert _nodeadm_merge(_as_go_float64(default), _as_go_float64(case["spec"]["containerd"]["baseRuntimeSpec"])) == expected


def test_efa_nodes_raise_memlock_and_keep_the_open_file_default(fixture_file):
    default, doc = _user_node_config(fixture_file)
    merged = _nodeadm_merge(_as_go_float64(default), _as_go_float64(doc["spec"]["containerd"]["baseRuntimeSpec"]))
    limits = {r["type"]: r for r in merged["process"]["rlimits"]}
    # nodeadm's own open-file limit survives the array's replacement.
    (nofile,) = [r for r in default["process"]["rlimits"] if r["type"] == "RLIMIT_NOFILE"]
    assert limits["RLIMIT_NOFILE"] == nofile
    assert set(limits) == {r["type"] for r in default["process"]["rlimits"]} | {"RLIMIT_MEMLOCK"}
    # The locked-memory limit survives the float64 round trip unchanged, still a uint64 (the OCI spec's
    # POSIXRlimit.Hard/Soft), and covers all of the instance's memory (pinning cannot exceed it).
    memlock = limits["RLIMIT_MEMLOCK"]
    assert memlock["soft"] == memlock["hard"] == g.EFA_MEMLOCK_BYTES
    assert memlock["hard"] < 2**64
    for name, itype in INSTANCE_TYPES.items():
        if itype.max_efa_interfaces:
            assert memlock["soft"] > EC2_TYPES[name]["MemoryInfo"]["SizeInMiB"] * 2**20, name
    # The rest of nodeadm's default spec is untouched.
    assert {k: v for k, v in merged.items() if k != "process"} == _as_go_float64({k: v for k, v in default.items() if k != "process"})


def test_unlimited_would_not_survive_nodeadms_merge():
    """Why not 2**64 - 1 ("unlimited"): through a float64 it becomes 2**64, which no uint64 holds."""
    assert _as_go_float64({"hard": 2**64 - 1})["hard"] == 2**64
    assert _as_go_float64({"hard": g.EFA_MEMLOCK_BYTES})["hard"] == g.EFA_MEMLOCK_BYTES


def test_the_node_config_validates_against_nodeadms_crd(fixture_file):
    crd = yaml_text.safe_load(fixture_file("amazon-eks-ami-nodeadm", "node.eks.aws_nodeconfigs.yaml").read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["served"] and v["name"] == g.NODEADM_API_VERSION.split("/")[1]]
    assert crd["spec"]["group"] == g.NODEADM_API_VERSION.split("/")[0] and crd["spec"]["names"]["kind"] == "NodeConfig"
    schema = _strict(served["schema"]["openAPIV3Schema"])
    for name, itype in INSTANCE_TYPES.items():
        text = g.node_user_data("AL2023_x86_64_NVIDIA", itype)
        if text is not None:
            errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(_node_config(text))]
            assert errors == [], (name, errors)


def test_no_nodeadm_on_bottlerocket():
    assert g.node_user_data("BOTTLEROCKET_x86_64_NVIDIA", get_instance_type("p5.48xlarge")) is None
    assert not g.uses_instance_store("BOTTLEROCKET_x86_64_NVIDIA", get_instance_type("p5.48xlarge"))


def test_the_template_carries_the_user_data_base64():
    rec = _record(_args())
    lt = rec.one(LT).inputs
    text = base64.b64decode(lt["userData"]).decode()
    assert text == g.node_user_data("AL2023_x86_64_NVIDIA", get_instance_type("p5.48xlarge"))
    # EC2 takes the template's user data base64-encoded (a string field of RequestLaunchTemplateData).
    assert EC2.shape_for("RequestLaunchTemplateData").members["UserData"].type_name == "string"


# --- gp3 root volume --------------------------------------------------------------------------------


def test_root_volume_is_baseline_when_images_live_on_the_instance_store():
    perf = g.root_volume_performance(200, on_instance_store=True)
    assert (perf.iops, perf.throughput_mibps) == (3000, 125)


def test_root_volume_takes_the_image_pull_otherwise():
    perf = g.root_volume_performance(200, on_instance_store=False)
    # 60 GiB in 240 s is 256 MiB/s, rounded up to 275; 275 MiB/s at 64 KiB a write is 4,400 IOPS.
    assert (perf.throughput_mibps, perf.iops) == (275, 4400)
    assert perf.throughput_mibps <= perf.iops * g.GP3_MIBPS_PER_IOPS


def test_gp3_ranges_are_ec2s():
    """gp3's IOPS and throughput ranges as EC2 CreateVolume documents them in botocore's ec2 model."""
    members = botocore.session.get_session().get_service_model("ec2").operation_model("CreateVolume").input_shape.members
    text = {k: " ".join(re.sub(r"<[^>]+>", " ", members[k].documentation).split()).replace(",", "") for k in ("Iops", "Throughput")}
    iops = re.search(r"gp3: (\d+) \( default \) - (\d+) IOPS", text["Iops"])
    mibps = re.search(r"Valid Range: (\d+) - (\d+) MiB/s", text["Throughput"])
    assert iops and (int(iops[1]), int(iops[2])) == (g.GP3_BASE_IOPS, g.GP3_MAX_IOPS)
    assert mibps and (int(mibps[1]), int(mibps[2])) == (g.GP3_BASE_MIBPS, g.GP3_MAX_MIBPS)


@pytest.mark.parametrize("size", [8, 50, 200, 2000, 16384])
def test_root_volume_stays_within_gp3_limits(size):
    for store in (True, False):
        perf = g.root_volume_performance(size, store)
        assert g.GP3_BASE_IOPS <= perf.iops <= g.GP3_MAX_IOPS
        assert g.GP3_BASE_MIBPS <= perf.throughput_mibps <= g.GP3_MAX_MIBPS
        assert perf.throughput_mibps <= perf.iops * g.GP3_MIBPS_PER_IOPS
        if perf.iops > g.GP3_BASE_IOPS:
            assert perf.iops <= g.GP3_IOPS_PER_GIB * size


def test_the_template_sets_the_root_volume_performance():
    ebs = _record(_args()).one(LT).inputs["blockDeviceMappings"][0]["ebs"]
    assert (ebs["iops"], ebs["throughput"], ebs["volumeType"]) == (3000, 125, "gp3")
    ebs = _record(_args(ami_type="BOTTLEROCKET_x86_64_NVIDIA")).one(LT).inputs["blockDeviceMappings"][0]["ebs"]
    assert (ebs["iops"], ebs["throughput"]) == (4400, 275)


# --- repair and release ------------------------------------------------------------------------------


def test_node_auto_repair_and_the_pinned_release():
    ng = _record(_args()).one(NG).inputs
    assert ng["nodeRepairConfig"] == {"enabled": True, "maxParallelNodesRepairedCount": 1}
    members = EKS.operation_model("CreateNodegroup").input_shape.members["nodeRepairConfig"].members
    assert set(ng["nodeRepairConfig"]) <= set(members)
    assert ng["releaseVersion"] == "1.35.6-20260714"


# --- Capacity Block lifecycle ------------------------------------------------------------------------


def test_a_capacity_block_group_is_named_after_its_block():
    lt, ng = g.resource_names("gpu", "capacity-block", RESERVATION)
    key = g.capacity_block_key(RESERVATION)
    assert (lt, ng) == (f"gpu-lt-{key}", f"gpu-ng-{key}") and len(key) == 8
    assert g.resource_names("gpu", "capacity-block", "cr-0fedcba9876543210")[1] != ng
    assert g.resource_names("gpu", "on-demand", None) == ("gpu-lt", "gpu-ng")
    assert g.resource_names("gpu", "capacity-reservation", RESERVATION) == ("gpu-lt", "gpu-ng")
    with pytest.raises(ValueError):
        g.resource_names("gpu", "capacity-block", None)


def test_a_capacity_block_group_is_replaced_old_first_never_updated_in_place():
    assert g.replacement_options("capacity-block") == {
        "replace_on_changes": ["launchTemplate.version", "releaseVersion", "version"], "delete_before_replace": True}
    for kind in ("on-demand", "capacity-reservation"):
        assert g.replacement_options(kind) == {"replace_on_changes": [], "delete_before_replace": False}
    # As the engine records them (mocks see inputs only; the options come from the registration).
    block = _record(_args(capacity_kind="capacity-block", reservation_id=RESERVATION))
    (ng,) = block.of_type(NG)
    assert ng.name == f"gpu-ng-{g.capacity_block_key(RESERVATION)}"
    assert ng.options["delete_before_replace"] is True
    assert ng.options["replace_on_changes"] == sorted(g.ROLLING_FIELDS)
    (plain,) = _record(_args()).of_type(NG)
    assert plain.options["delete_before_replace"] is False and plain.options["replace_on_changes"] == []
