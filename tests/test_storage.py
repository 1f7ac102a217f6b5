"""Model-weight storage: FSx sizing (pure), and the ModelStorage component under the recording engine.

The component runs under `infra.recording.record` (mocks, preview off); every
assertion is on what reached the engine: inputs and resource options. Every
Kubernetes object is rebuilt as a manifest from its recorded inputs and
validated with kubernetes-validate (strict) against Kubernetes 1.33; AWS enum
values are checked against botocore's efs and fsx service models, and the FSx
sizing rules against the text of botocore's fsx model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import botocore.session
import kubernetes_validate
import pulumi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulumi.runtime import rpc

from components import storage as storage_mod
from components.storage import (
    EFS_CSI_DRIVER,
    FSX_CSI_DRIVER,
    LUSTRE_PORTS,
    ModelStorage,
    ModelStorageArgs,
)
from infra.preview import recording
from infra.config import load_stack_file
from infra.errors import UserError
from infra.planning import make_plan
from infra.planning.memory import GiB
from infra.planning.serving import STORAGE_MARGIN
from infra.planning.storage import (
    FSX_CAPACITY_STEP_GIB,
    FSX_MIN_CAPACITY_GIB,
    FSX_PER_UNIT_THROUGHPUTS_MBPS,
    efs_read_throughput_bytes_per_s,
    efs_shortfall,
    fsx_lustre_sizing,
    fsx_throughput_bytes_per_s,
    is_valid_fsx_capacity,
)
from infra.k8s import script_files
from infra.k8s.scripts.stage_weights import EXIT_SOURCE, MARKER_NAME
from infra.k8s.staging import STAGING_UID, staging_deadline_s
from infra.preview.synth import plain

K8S_VERSION = "1.33.0"
TOKEN = "hf_NeverInPlainText0123456789"
GPU_SUBNET = "subnet-0gpu"
CLIENT_SGS = ["sg-0cluster", "sg-0efa"]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving-vllm:0.34.0-ray2.60.0"

EFS_FS = "aws:efs/fileSystem:FileSystem"
EFS_MT = "aws:efs/mountTarget:MountTarget"
FSX_FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
SECRET = "kubernetes:core/v1:Secret"
JOB = "kubernetes:batch/v1:Job"
SA = "kubernetes:core/v1:ServiceAccount"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
STAGING_TAG = "staging-hub2.4.0-boto3-1.44.8-0123456789ab"

SESSION = botocore.session.get_session()
EFS_MODEL = SESSION.get_service_model("efs")
FSX_MODEL = SESSION.get_service_model("fsx")

# Values the mocks cannot know and the component reads (the mount target's
# address, the Lustre DNS and mount names). Kept here until infra/preview/recording.py
# answers them itself.
EXTRA_COMPUTED = {
    EFS_MT: lambda name, inputs: {"ipAddress": "10.0.0.17"},
    FSX_FS: lambda name, inputs: {"dnsName": f"<id:{name}>.fsx.us-east-1.amazonaws.com", "mountName": "abcdefgh"},
}


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod_storage():
    plan = make_plan(load_stack_file("prod").plan_request())
    assert plan.feasible
    return plan.storage


def _args(prod_storage, **overrides) -> ModelStorageArgs:
    base: dict[str, Any] = dict(
        kind="efs",
        vpc_id="vpc-0123",
        subnet_id=GPU_SUBNET,
        client_security_group_ids=CLIENT_SGS,
        storage=prod_storage,
        production=True,
        namespace="gpu-serving",
        checkpoint="deepseek-ai/DeepSeek-V4-Pro",
        source="hf",
        staging_image=IMAGE,
        region="us-east-1",
    )
    base.update(overrides)
    return ModelStorageArgs(**base)


def _record(args_factory):
    holder: dict[str, ModelStorage] = {}

    def program() -> None:
        holder["c"] = ModelStorage("weights", args_factory())

    with pytest.MonkeyPatch.context() as mp:
        for typ, fn in EXTRA_COMPUTED.items():
            mp.setitem(recording.COMPUTED_OUTPUTS, typ, fn)
        rec = recording.record(program)
    return rec, holder["c"]


@pytest.fixture(scope="module")
def efs_prod(prod_storage):
    return _record(lambda: _args(prod_storage, hf_token=pulumi.Output.secret(TOKEN)))


@pytest.fixture(scope="module")
def efs_ephemeral(prod_storage):
    return _record(lambda: _args(prod_storage, production=False))


@pytest.fixture(scope="module")
def fsx_prod(prod_storage):
    return _record(lambda: _args(prod_storage, kind="fsx", hf_token=pulumi.Output.secret(TOKEN)))


@pytest.fixture(scope="module")
def s3_ephemeral(prod_storage):
    return _record(
        lambda: _args(
            prod_storage,
            kind="fsx",
            production=False,
            source="s3",
            checkpoint="s3://ml-weights-bucket/deepseek/v4-pro/",
            cluster_name="gpu-serving-test",
            # The stack's repository: known only as an Output; the tag names the image for the Job's name.
            staging_image=pulumi.Output.concat("123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving-test/vllm", ":", STAGING_TAG),
            staging_image_id=STAGING_TAG,
            vpc_cidr="10.0.0.0/16",
        )
    )


@pytest.fixture(scope="module")
def variants(efs_prod, efs_ephemeral, fsx_prod, s3_ephemeral):
    return {"efs-prod": efs_prod, "efs-ephemeral": efs_ephemeral, "fsx-prod": fsx_prod, "s3-fsx-ephemeral": s3_ephemeral}


# ---- manifests from recorded inputs ------------------------------------------------------------------


def _redacted(value: Any) -> Any:
    """A secret's shape with every string replaced: lets a schema check a secret map without seeing it."""
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return "redacted" if isinstance(value, str) else value


def _unwrap_redacted(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return _redacted(_unwrap_redacted(rpc.unwrap_rpc_secret(value)))
    if isinstance(value, dict):
        return {k: _unwrap_redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_redacted(v) for v in value]
    return value


def manifest(res: recording.RecordedResource) -> dict[str, Any]:
    doc = plain(_unwrap_redacted(res.inputs))
    assert doc["apiVersion"] and doc["kind"], res.name
    return doc


def k8s_objects(rec) -> list[recording.RecordedResource]:
    found = [r for r in rec.resources if r.type.startswith("kubernetes:") and not r.type.startswith("pulumi:providers:")]
    assert found
    return found


def only_rules(rec, typ: str, sg_name: str) -> list[dict]:
    sg_id = recording.placeholder("id", sg_name)
    return [plain(r.inputs) for r in rec.of_type(typ) if r.inputs.get("securityGroupId") == sg_id]


# ---- FSx sizing (pure) ------------------------------------------------------------------------------


def _doc(shape_doc: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", shape_doc))


def test_fsx_rules_match_the_fsx_api_model():
    """The constants are the ones botocore's fsx model documents (CreateFileSystem)."""
    capacity = _doc(FSX_MODEL.operation_model("CreateFileSystem").input_shape.members["StorageCapacity"].documentation)
    assert re.search(
        r"For SCRATCH_2 , PERSISTENT_2 , and PERSISTENT_1 deployment types using SSD storage type, "
        rf"the valid values are {FSX_MIN_CAPACITY_GIB} GiB, {FSX_CAPACITY_STEP_GIB} GiB, and increments of {FSX_CAPACITY_STEP_GIB} GiB",
        capacity,
    ), capacity
    per_unit = _doc(FSX_MODEL.shape_for("CreateFileSystemLustreConfiguration").members["PerUnitStorageThroughput"].documentation)
    match = re.search(r"For PERSISTENT_2 SSD storage: ([\d, ]+) MB/s/TiB", per_unit)
    assert match, per_unit
    assert tuple(int(x) for x in match.group(1).split(",")) == FSX_PER_UNIT_THROUGHPUTS_MBPS
    bounds = FSX_MODEL.shape_for("PerUnitStorageThroughput").metadata
    assert bounds["min"] <= min(FSX_PER_UNIT_THROUGHPUTS_MBPS) and max(FSX_PER_UNIT_THROUGHPUTS_MBPS) <= bounds["max"]


def test_fsx_sizing_for_the_prod_plan(prod_storage):
    sizing = fsx_lustre_sizing(prod_storage.checkpoint_bytes, prod_storage.required_read_bytes_per_s)
    # Every one of the 4 nodes reads the whole 864.7 GB checkpoint (vLLM's loader reads every shard on
    # every rank): 3.46 TB in prod's 750 s target less 180 s of engine init = 6.07 GB/s. 864.7 GB x 1.15
    # fits 1200 GiB, but even 1000 MB/s/TiB needs more: 4800 GiB gives 4.69 GB/s, 7200 GiB 7.03 GB/s.
    assert prod_storage.cold_start_target_s == 750
    assert prod_storage.read_bytes == 4 * prod_storage.checkpoint_bytes
    assert (sizing.storage_capacity_gib, sizing.per_unit_storage_throughput_mbps) == (7200, 1000)
    assert sizing.deployment_type == "PERSISTENT_2" and sizing.storage_type == "SSD"
    assert sizing.throughput_bytes_per_s >= prod_storage.required_read_bytes_per_s


def _check_sizing(checkpoint: int, required: int) -> None:
    s = fsx_lustre_sizing(checkpoint, required)
    assert is_valid_fsx_capacity(s.storage_capacity_gib), s
    assert s.storage_capacity_gib * GiB >= checkpoint * STORAGE_MARGIN, s
    assert s.per_unit_storage_throughput_mbps in FSX_PER_UNIT_THROUGHPUTS_MBPS
    assert s.throughput_bytes_per_s == fsx_throughput_bytes_per_s(s.storage_capacity_gib, s.per_unit_storage_throughput_mbps)
    assert s.throughput_bytes_per_s >= required, s
    # Smallest per-unit throughput at this capacity.
    lower = [p for p in FSX_PER_UNIT_THROUGHPUTS_MBPS if p < s.per_unit_storage_throughput_mbps]
    assert all(fsx_throughput_bytes_per_s(s.storage_capacity_gib, p) < required for p in lower), s
    # Smallest capacity: the next smaller valid one either does not hold the checkpoint
    # or cannot reach the rate even at the top tier.
    smaller = FSX_MIN_CAPACITY_GIB if s.storage_capacity_gib == FSX_CAPACITY_STEP_GIB else s.storage_capacity_gib - FSX_CAPACITY_STEP_GIB
    if smaller < s.storage_capacity_gib:
        holds = smaller * GiB >= checkpoint * STORAGE_MARGIN
        fast = fsx_throughput_bytes_per_s(smaller, FSX_PER_UNIT_THROUGHPUTS_MBPS[-1]) >= required
        assert not (holds and fast), s


@settings(max_examples=400, deadline=None)
@given(
    checkpoint=st.integers(min_value=1, max_value=200 * 2**40),
    required=st.integers(min_value=0, max_value=2 * 10**12),
)
def test_fsx_sizing_properties(checkpoint, required):
    _check_sizing(checkpoint, required)


@pytest.mark.parametrize(
    "checkpoint,required",
    [
        (1, 0),
        (int(1200 * GiB / STORAGE_MARGIN), 0),  # exactly 1200 GiB with the margin
        (int(1200 * GiB / STORAGE_MARGIN) + 1, 0),  # one byte more: 2400
        (10**9, fsx_throughput_bytes_per_s(1200, 125)),  # exactly the smallest tier
        (10**9, fsx_throughput_bytes_per_s(1200, 125) + 1),
        (10**9, fsx_throughput_bytes_per_s(1200, 1000) + 1),  # grows
        (700 * 10**12, 10**12),  # 700 TB at 1 TB/s
    ],
)
def test_fsx_sizing_edges(checkpoint, required):
    _check_sizing(checkpoint, required)


def test_fsx_capacity_grid():
    assert [c for c in range(1, 10_000) if is_valid_fsx_capacity(c)] == [1200, 2400, 4800, 7200, 9600]
    with pytest.raises(ValueError):
        fsx_lustre_sizing(0, 1)


def test_efs_read_ceiling():
    assert efs_read_throughput_bytes_per_s("us-east-1") == 60 * GiB
    assert efs_read_throughput_bytes_per_s("eu-north-1") == 10 * GiB
    assert efs_read_throughput_bytes_per_s() == 10 * GiB  # unknown region: the floor
    assert efs_shortfall(2 * 10**9, "us-east-1") is None
    assert "FSx for Lustre" in efs_shortfall(61 * GiB, "us-east-1")


# ---- EFS --------------------------------------------------------------------------------------------


def test_efs_file_system(efs_prod):
    rec, _ = efs_prod
    fs = plain(rec.one(EFS_FS).inputs)
    assert fs["encrypted"] is True
    assert fs["throughputMode"] == "elastic"
    assert fs["performanceMode"] == "generalPurpose"
    # Nothing moves the weights to Infrequent Access or Archive.
    policies = fs["lifecyclePolicies"]
    assert policies and all(set(p) == {"transitionToPrimaryStorageClass"} for p in policies)


def test_efs_mount_target_in_the_gpu_subnet(efs_prod):
    rec, _ = efs_prod
    mt = plain(rec.one(EFS_MT).inputs)
    sg = rec.one(SG)
    assert mt["subnetId"] == GPU_SUBNET
    assert mt["fileSystemId"] == recording.placeholder("id", rec.one(EFS_FS).name)
    assert mt["securityGroups"] == [recording.placeholder("id", sg.name)]


def test_efs_security_group_allows_only_nfs_from_the_clients(efs_prod):
    rec, _ = efs_prod
    (sg,) = rec.of_type(SG)
    ingress = only_rules(rec, INGRESS, sg.name)
    assert sorted(r["referencedSecurityGroupId"] for r in ingress) == sorted(CLIENT_SGS)
    for rule in ingress:
        assert (rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 2049, 2049)
        assert not {"cidrIpv4", "cidrIpv6", "prefixListId"} & set(rule)
    assert len(rec.of_type(INGRESS)) == len(CLIENT_SGS), "no other ingress anywhere"
    assert not rec.of_type(EGRESS), "the mount target never opens connections"


@pytest.mark.parametrize("variant,expected", [("efs-prod", True), ("efs-ephemeral", False), ("fsx-prod", True), ("s3-fsx-ephemeral", False)])
def test_protection_follows_production(variants, variant, expected):
    rec, _ = variants[variant]
    (fs,) = rec.of_type(EFS_FS) + rec.of_type(FSX_FS)
    pv = rec.one(PV)
    for res in (fs, pv):
        assert res.options["protect"] is expected, res.name
        assert res.options["retain_on_delete"] is expected, res.name
    assert rec.one(PVC).options["protect"] is expected
    # Nothing else is protected: the rest is cheap to recreate.
    others = [r.name for r in rec.resources if r.custom and r not in (fs, pv, rec.one(PVC)) and r.options["protect"]]
    assert not others


# ---- FSx ----------------------------------------------------------------------------------------------


def test_fsx_file_system_sized_by_the_plan(fsx_prod, prod_storage):
    rec, comp = fsx_prod
    fs = plain(rec.one(FSX_FS).inputs)
    sizing = fsx_lustre_sizing(prod_storage.checkpoint_bytes, prod_storage.required_read_bytes_per_s)
    assert fs["storageCapacity"] == sizing.storage_capacity_gib
    assert fs["perUnitStorageThroughput"] == sizing.per_unit_storage_throughput_mbps
    assert fs["deploymentType"] == sizing.deployment_type == "PERSISTENT_2"
    assert fs["storageType"] == "SSD"
    assert fs["subnetIds"] == GPU_SUBNET
    assert fs["securityGroupIds"] == [recording.placeholder("id", rec.one(SG).name)]
    assert comp.fsx_sizing == sizing
    assert comp.read_throughput_bytes_per_s == sizing.throughput_bytes_per_s >= prod_storage.required_read_bytes_per_s
    # The volume's capacity is the file system's.
    assert plain(rec.one(PV).inputs)["spec"]["capacity"] == {"storage": f"{sizing.storage_capacity_gib}Gi"}


def test_fsx_security_group_opens_lustre_ports_only(fsx_prod):
    rec, _ = fsx_prod
    (sg,) = rec.of_type(SG)
    sg_id = recording.placeholder("id", sg.name)
    ports = {(lo, hi) for lo, hi in LUSTRE_PORTS}
    inbound = only_rules(rec, INGRESS, sg.name)
    outbound = only_rules(rec, EGRESS, sg.name)
    for rules in (inbound, outbound):
        assert {(r["referencedSecurityGroupId"], r["fromPort"], r["toPort"]) for r in rules} == {
            (peer, lo, hi) for peer in [sg_id, *CLIENT_SGS] for lo, hi in ports
        }
        assert all(r["ipProtocol"] == "tcp" and "cidrIpv4" not in r for r in rules)
    # Lustre servers reach back to the clients on the same ports.
    back = [plain(r.inputs) for r in rec.of_type(INGRESS) if r.inputs.get("referencedSecurityGroupId") == sg_id and r.inputs["securityGroupId"] != sg_id]
    assert {(r["securityGroupId"], r["fromPort"], r["toPort"]) for r in back} == {(c, lo, hi) for c in CLIENT_SGS for lo, hi in ports}


# ---- the volume and the claim ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["efs-prod", "fsx-prod"])
def test_static_binding(variants, variant):
    rec, comp = variants[variant]
    pv, pvc = manifest(rec.one(PV)), manifest(rec.one(PVC))
    assert pv["spec"]["storageClassName"] == "" == pvc["spec"]["storageClassName"]
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"]["name"] == pvc["metadata"]["name"] == comp.pvc_name == "model-weights"
    assert pv["spec"]["claimRef"]["namespace"] == pvc["metadata"]["namespace"] == "gpu-serving"
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] == pvc["spec"]["accessModes"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["capacity"]["storage"] == pvc["spec"]["resources"]["requests"]["storage"]
    assert not [r for r in rec.resources if r.type == "kubernetes:storage.k8s.io/v1:StorageClass"]
    fs = (rec.of_type(EFS_FS) + rec.of_type(FSX_FS))[0]
    assert pv["spec"]["csi"]["volumeHandle"] == recording.placeholder("id", fs.name)


def test_efs_volume_attributes(efs_prod):
    rec, _ = efs_prod
    csi = manifest(rec.one(PV))["spec"]["csi"]
    assert csi["driver"] == EFS_CSI_DRIVER
    # The driver refuses any other attribute (aws-efs-csi-driver pkg/driver/node.go).
    assert set(csi["volumeAttributes"]) <= {"path", "encryptintransit", "mounttargetip", "crossaccount"}
    assert csi["volumeAttributes"]["mounttargetip"] == "10.0.0.17"


def test_fsx_volume_attributes(fsx_prod):
    rec, _ = fsx_prod
    pv = manifest(rec.one(PV))
    csi = pv["spec"]["csi"]
    assert csi["driver"] == FSX_CSI_DRIVER
    assert csi["volumeAttributes"] == {"dnsname": "<id:weights-fsx>.fsx.us-east-1.amazonaws.com", "mountname": "abcdefgh"}
    assert pv["spec"]["mountOptions"] == ["flock"]


# ---- Kubernetes schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["efs-prod", "efs-ephemeral", "fsx-prod", "s3-fsx-ephemeral"])
def test_every_kubernetes_object_validates(variants, variant):
    rec, _ = variants[variant]
    kinds = set()
    errors = []
    for res in k8s_objects(rec):
        doc = manifest(res)
        kinds.add(doc["kind"])
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{res.name} ({doc['kind']}): {exc.message} at {list(exc.path)}")
    assert not errors, "\n".join(errors)
    assert {"PersistentVolume", "PersistentVolumeClaim", "Job", "ServiceAccount", "NetworkPolicy"} <= kinds
    if variant in ("efs-prod", "fsx-prod"):
        assert "Secret" in kinds


def test_the_validator_is_strict():
    """Guards the test above: an unknown field really fails."""
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "x"}, "spec": {"bogus": 1}}, K8S_VERSION, strict=True
        )


# ---- secrets ------------------------------------------------------------------------------------------------


def _plain_strings(value: Any, path: str = "") -> list[tuple[str, str]]:
    """Every string reachable without opening a secret."""
    if rpc.is_rpc_secret(value):
        return []
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _plain_strings(v, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [s for i, v in enumerate(value) for s in _plain_strings(v, f"{path}[{i}]")]
    return [(path, value)] if isinstance(value, str) else []


@pytest.mark.parametrize("variant", ["efs-prod", "fsx-prod"])
def test_the_hf_token_is_never_plain(variants, variant):
    rec, _ = variants[variant]
    leaks = [(r.name, p) for r in rec.resources for p, s in _plain_strings(r.inputs) if TOKEN in s]
    assert not leaks, leaks
    # It is there, as a secret, in exactly one place: the Secret's stringData.
    secret = rec.one(SECRET)
    assert rpc.is_rpc_secret(secret.inputs["stringData"])
    assert rpc.unwrap_rpc_secret(secret.inputs["stringData"]) == {"HF_TOKEN": TOKEN}
    assert {"data", "stringData"} <= set(secret.options["additional_secret_outputs"])
    holders = [r.name for r in rec.resources if TOKEN in json.dumps(r.inputs, default=str)]
    assert holders == [secret.name]
    # The synth document shows the secret as a secret.
    assert plain(secret.inputs)["stringData"] == {"<secret>": True}
    # The Job reads it from the Secret, never as a value.
    env = manifest(rec.one(JOB))["spec"]["template"]["spec"]["containers"][0]["env"]
    (hf,) = [e for e in env if e["name"] == "HF_TOKEN"]
    assert hf == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": manifest(secret)["metadata"]["name"], "key": "HF_TOKEN", "optional": False}}}


def test_a_plain_token_is_refused(prod_storage):
    with pytest.raises(UserError, match="secret Output"):
        _args(prod_storage, hf_token=TOKEN)


def test_no_secret_without_a_token(efs_ephemeral):
    rec, _ = efs_ephemeral
    assert not rec.of_type(SECRET)
    env = manifest(rec.one(JOB))["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "HF_TOKEN" not in {e["name"] for e in env}


# ---- the staging Job ---------------------------------------------------------------------------------------------


def test_staging_job(efs_prod, prod_storage):
    rec, comp = efs_prod
    res = rec.one(JOB)
    job = manifest(res)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert job["metadata"]["name"] == comp.staging_job_name and job["metadata"]["namespace"] == "gpu-serving"
    assert spec["activeDeadlineSeconds"] == staging_deadline_s(prod_storage.checkpoint_bytes, prod_storage.cold_start_target_s)
    assert spec["activeDeadlineSeconds"] == comp.staging_deadline_s
    assert 1 <= spec["backoffLimit"] <= 10
    assert {"action": "FailJob", "onExitCodes": {"containerName": "stage", "operator": "In", "values": [EXIT_SOURCE]}} in spec["podFailurePolicy"]["rules"]
    # On system nodes, with no tolerations: it never lands on (or waits for) a GPU node.
    assert pod["nodeSelector"] == {"gpu-serving/role": "system"}
    assert "tolerations" not in pod
    assert pod["restartPolicy"] == "Never"
    # The claim, read-write, at the mount path; the script's destination is the model path under it.
    (vol,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert vol["persistentVolumeClaim"] == {"claimName": "model-weights"}
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == vol["name"]]
    assert mount["mountPath"] == "/models" and not mount.get("readOnly")
    # The program: a file of the ConfigMap the pod mounts read-only, whose hash the pod carries.
    config_map = manifest(rec.one(CONFIG_MAP))
    (scripts,) = [v for v in pod["volumes"] if "configMap" in v]
    assert scripts["configMap"]["name"] == config_map["metadata"]["name"]
    assert {"name": scripts["name"], "mountPath": script_files.MOUNT_PATH, "readOnly": True} in container["volumeMounts"]
    assert container["command"][0] == "python3"
    mounted, program = container["command"][1].rsplit("/", 1)
    assert mounted == script_files.MOUNT_PATH and program in config_map["data"]
    assert config_map["data"][program] == (script_files.SCRIPTS_DIR / program).read_text()
    annotation = script_files.HASH_ANNOTATION
    assert spec["template"]["metadata"]["annotations"][annotation] == config_map["metadata"]["annotations"][annotation]
    assert "STAGING_SCRIPT" not in {e["name"] for e in container["env"]}
    args = container["args"]
    assert args[args.index("--source") + 1] == "hf://deepseek-ai/DeepSeek-V4-Pro"
    assert args[args.index("--dest") + 1] == comp.model_path == "/models/deepseek-ai/DeepSeek-V4-Pro"
    assert container["image"] == IMAGE
    # Modest requests; no GPUs, no EFA.
    requests = container["resources"]["requests"]
    assert set(requests) == {"cpu", "memory"} and "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    # Least privilege: the program as an unprivileged user with nothing added, no token, the runtime's seccomp.
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"] == {"runAsUser": STAGING_UID, "runAsGroup": STAGING_UID, "runAsNonRoot": True,
                                      "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    # ... after the one root step, which may only chown: it hands the destination to that user.
    (owner,) = pod["initContainers"]
    assert owner["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        "readOnlyRootFilesystem": True, "runAsUser": 0, "runAsNonRoot": False,
    }  # fmt: skip
    assert owner["image"] == container["image"] and owner["args"] == [comp.model_path, f"{STAGING_UID}:{STAGING_UID}"]
    mounted, script = owner["command"][1].rsplit("/", 1)
    assert owner["command"][0] == "sh" and mounted == script_files.MOUNT_PATH and script in config_map["data"]
    # Created after its storage exists, and not awaited: `pulumi up` moves on (python -m infra rollout follows it).
    assert job["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert not res.options.get("custom_timeouts")
    needs = {u.rsplit("::", 1)[-1] for u in res.options["depends_on"]}
    assert {"weights-pvc", "weights-efs-mt", "weights-hf-token", "weights-staging-sa", "weights-staging-scripts", "weights-staging-egress"} <= needs
    # Its egress: HTTPS to the hub, and nothing else (no VPC CIDR given: no exception; no Pod Identity for hf).
    netpol = manifest(rec.one(NETWORK_POLICY))
    assert netpol["spec"]["podSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
    assert netpol["spec"]["policyTypes"] == ["Egress"]
    assert netpol["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]}]


def test_s3_staging_reads_through_pod_identity(s3_ephemeral):
    rec, comp = s3_ephemeral
    role = plain(rec.one("aws:iam/role:Role").inputs)
    trust = json.loads(role["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(trust["Statement"][0]["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
    policy = json.loads(plain(rec.one("aws:iam/rolePolicy:RolePolicy").inputs)["policy"])
    actions = {s["Action"] for s in policy["Statement"]}
    assert actions == {"s3:ListBucket", "s3:GetObject"}, "read-only"
    (listing,) = [s for s in policy["Statement"] if s["Action"] == "s3:ListBucket"]
    assert listing["Resource"] == "arn:aws:s3:::ml-weights-bucket"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["deepseek/v4-pro/*"]}}, "lists only the prefix"
    (get,) = [s for s in policy["Statement"] if s["Action"] == "s3:GetObject"]
    assert get["Resource"] == "arn:aws:s3:::ml-weights-bucket/deepseek/v4-pro/*"
    assoc = plain(rec.one("aws:eks/podIdentityAssociation:PodIdentityAssociation").inputs)
    job = manifest(rec.one(JOB))
    pod = job["spec"]["template"]["spec"]
    assert (assoc["namespace"], assoc["serviceAccount"]) == (job["metadata"]["namespace"], pod["serviceAccountName"])
    assert assoc["clusterName"] == "gpu-serving-test"
    assert "weights-staging-identity" in {u.rsplit("::", 1)[-1] for u in rec.one(JOB).options["depends_on"]}
    (container,) = pod["containers"]
    assert container["command"] == ["python3", f"{script_files.MOUNT_PATH}/stage_weights.py"]  # nothing installed at run time
    assert container["image"] == f"123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving-test/vllm:{STAGING_TAG}"
    (scripts,) = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
    assert scripts == manifest(rec.one(CONFIG_MAP))["metadata"]["name"]
    # No service-account token: EKS Pod Identity injects its own; the pod may reach its agent and HTTPS outside the VPC.
    assert pod["automountServiceAccountToken"] is False
    egress = manifest(rec.one(NETWORK_POLICY))["spec"]["egress"]
    assert egress == [
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/16"]}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}], "ports": [{"protocol": "TCP", "port": 80}]},
    ]
    args = container["args"]
    assert args[args.index("--source") + 1] == "s3://ml-weights-bucket/deepseek/v4-pro"
    assert comp.marker_path == f"/models/ml-weights-bucket/deepseek/v4-pro/{MARKER_NAME}"
    assert not rec.of_type(SECRET)


def test_job_name_follows_the_checkpoint(prod_storage):
    def name(**kw):
        _, comp = _record(lambda: _args(prod_storage, production=False, **kw))
        return comp.staging_job_name

    base = name()
    assert base == name(), "stable"
    assert base != name(checkpoint="deepseek-ai/DeepSeek-V4-Pro@a1b2c3")
    assert base != name(staging_image=IMAGE + "-2")


def test_a_new_staging_run_replaces_a_failed_job_and_nothing_else(prod_storage):
    """After its deadline a failed Job stays failed and an unchanged `pulumi up` sees no diff: raising
    stagingRun gives the Job a new name, so Pulumi replaces it (the new one resumes the partials)."""

    def objects(run):
        rec, comp = _record(lambda: _args(prod_storage, production=False, staging_run=run))
        return comp.staging_job_name, {(r.type, r.name): manifest(r) for r in k8s_objects(rec)}

    (first, before), (second, after) = objects(0), objects(1)
    assert first != second and second.startswith("model-weights-stage-") and len(second) <= 63
    assert objects(1)[0] == second, "the same generation keeps its name"
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {(JOB, "weights-staging")}
    job_before, job_after = before[(JOB, "weights-staging")], after[(JOB, "weights-staging")]
    assert job_after["spec"] == job_before["spec"] and job_after["metadata"]["name"] == second


def test_the_stack_names_the_job_by_its_staging_run(tmp_path):
    """`gpu-serving:storage.stagingRun` reaches the Job's name through the real program."""
    import yaml

    from infra.preview.synth import synthesize

    repo = Path(__file__).resolve().parent.parent
    root = tmp_path / "project"
    root.mkdir()
    for name in ("__main__.py", "Pulumi.yaml"):
        (root / name).symlink_to(repo / name)
    cfg = yaml.safe_load((repo / "Pulumi.test.yaml").read_text())

    def job_name(run):
        cfg["config"]["gpu-serving:storage"] = {"stagingRun": run}
        (root / "Pulumi.test.yaml").write_text(yaml.safe_dump(cfg))
        (job,) = [r for r in synthesize("test", root)["resources"] if r["type"] == JOB and r["name"].endswith("-weights-staging")]
        return job["inputs"]["metadata"]["name"]

    assert job_name(0) != job_name(1)


def test_a_changed_program_makes_a_new_job(prod_storage, tmp_path, monkeypatch):
    """Edit the staging program: the Job gets a new name and its pod a new annotation (a Job's template is immutable)."""

    def job():
        rec, comp = _record(lambda: _args(prod_storage, production=False))
        return comp.staging_job_name, manifest(rec.one(JOB))["spec"]["template"]["metadata"]["annotations"]

    before = job()
    edited = tmp_path / "scripts"
    edited.mkdir()
    for path in script_files.SCRIPTS_DIR.iterdir():
        if path.is_file():
            (edited / path.name).write_text(path.read_text())
    program = edited / "stage_weights.py"
    program.write_text(program.read_text() + "\n# edited\n")
    monkeypatch.setattr(script_files, "SCRIPTS_DIR", edited)
    script_files.read.cache_clear()
    try:
        after = job()
    finally:
        script_files.read.cache_clear()
    assert after[0] != before[0] and after[0].startswith("model-weights-stage-")
    assert after[1][script_files.HASH_ANNOTATION] != before[1][script_files.HASH_ANNOTATION]


# ---- what the serving pods use ------------------------------------------------------------------------------------


def test_serving_side_outputs(efs_prod):
    _, comp = efs_prod
    assert comp.marker_path == f"{comp.model_path}/{MARKER_NAME}"
    assert comp.read_throughput_bytes_per_s == efs_read_throughput_bytes_per_s("us-east-1")


def test_outputs_are_registered(efs_prod):
    rec, _ = efs_prod
    component = rec.one("gpu-serving:storage:ModelStorage")
    assert component.urn.endswith("::weights")
    children = [r for r in rec.resources if r.parent == component.urn]
    assert len(children) == len(rec.resources) - 2  # everything but the stack and the component


# ---- AWS enums ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["efs-prod", "fsx-prod"])
def test_aws_enum_values_are_in_botocore(variants, variant):
    rec, _ = variants[variant]
    checks = {
        EFS_FS: [("throughputMode", EFS_MODEL, "ThroughputMode"), ("performanceMode", EFS_MODEL, "PerformanceMode")],
        FSX_FS: [
            ("deploymentType", FSX_MODEL, "LustreDeploymentType"),
            ("storageType", FSX_MODEL, "StorageType"),
            ("dataCompressionType", FSX_MODEL, "DataCompressionType"),
        ],
    }
    seen = 0
    for typ, fields in checks.items():
        for res in rec.of_type(typ):
            for key, model, shape in fields:
                assert res.inputs[key] in model.shape_for(shape).enum, (res.name, key, res.inputs[key])
                seen += 1
            for policy in res.inputs.get("lifecyclePolicies") or []:
                assert policy["transitionToPrimaryStorageClass"] in EFS_MODEL.shape_for("TransitionToPrimaryStorageClassRules").enum
    assert seen >= 2


# ---- argument checks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(kind="ebs"), "kind"),
        (dict(source="s3", checkpoint="s3://bucket-name/p"), "cluster_name"),
        (dict(checkpoint="not-a-repo"), "org/name"),
        (dict(client_security_group_ids=[]), "client_security_group_ids"),
        (dict(namespace="Bad_NS"), "namespace"),
        (dict(mount_path="relative"), "mount_path"),
        (dict(mount_path=script_files.MOUNT_PATH), "mount_path"),
        (dict(staging_image="python"), "pinned"),
        (dict(staging_image=pulumi.Output.from_input("registry/staging:tag")), "staging_image_id"),
        (dict(source="s3", checkpoint="s3://bucket-name/p", cluster_name="c", hf_token=pulumi.Output.secret("x")), "hf_token"),
    ],
)
def test_bad_arguments_say_what_is_wrong(prod_storage, overrides, message):
    with pytest.raises(UserError, match=message):
        _args(prod_storage, **overrides)
