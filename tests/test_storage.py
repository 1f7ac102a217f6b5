"""Model-weight storage: FSx sizing (pure), and the ModelStorage component under the recording engine.

The component runs under `infra.recording.record` (mocks, preview off); every
assertion is on what reached the engine: inputs and resource options. Every
Kubernetes object is rebuilt as a manifest from its recorded inputs and
validated with kubernetes-validate (strict) against Kubernetes 1.33; AWS enum
values are checked against botocore's efs and fsx service models, and the FSx
sizing rules against the text of botocore's fsx model.

The EFS file system policy is read back from the recorded JSON and evaluated
(`iam_allows`, a small evaluator of the statements' Effect, Principal,
Action and the Bool / StringEquals / StringNotEquals conditions it uses, with
IAM's rule for absent keys: IAM user guide, "Condition operators") for every
client a node could be: through either access point or none, with or without
TLS and IAM. Its actions are checked against botocore's efs model: `*`, or an
operation of the model, or one of the three NFS client actions, which are
permissions without an API operation (the model has none of them, checked
here; the EFS user guide's "EFS actions for clients" and the Service
Authorization Reference list them).
"""

from __future__ import annotations

import hashlib
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
from infra.aws import efs_access
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
from tests import yaml_text
from tests.synthesized import repo_stack

K8S_VERSION = "1.33.0"
TOKEN = "hf_NeverInPlainText0123456789"
GPU_SUBNET = "subnet-0gpu"
CLIENT_SGS = ["sg-0cluster", "sg-0efa"]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving-vllm:0.34.0-ray2.60.0"

EFS_FS = "aws:efs/fileSystem:FileSystem"
EFS_MT = "aws:efs/mountTarget:MountTarget"
EFS_AP = "aws:efs/accessPoint:AccessPoint"
EFS_POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"
NODE_ROLE = "arn:aws:iam::123456789012:role/gpu-serving-prod-nodes"
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
        mount_role_arn=NODE_ROLE,
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
def prod_doc():
    """The prod stack's synthesis (the real program, its config)."""
    return repo_stack("prod")


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


# ---- who may mount and write (EFS) ---------------------------------------------------------------------


def _policy(rec) -> dict:
    return json.loads(plain(rec.one(EFS_POLICY).inputs)["policy"])


def _matches(condition: dict, request: dict) -> bool:
    """IAM's condition operators the policy uses, with IAM's rule for an absent key (IAM user guide, "Condition
    operators": the condition is false, except for a negated operator, where it is true)."""
    for operator, keys in condition.items():
        for key, wanted in keys.items():
            values = wanted if isinstance(wanted, list) else [wanted]
            if operator == "Bool":
                ok = key in request and str(request[key]).lower() in [str(v).lower() for v in values]
            elif operator == "StringEquals":
                ok = key in request and request[key] in values
            elif operator == "StringNotEquals":
                ok = key not in request or request[key] not in values
            else:
                raise AssertionError(f"operator {operator} is not modelled")
            if not ok:
                return False
    return True


def iam_allows(policy: dict, *, principal: str | None, action: str, request: dict, identity_allows: bool = False) -> bool:
    """Whether EFS grants `action`: an explicit deny wins; else an allow in the file system policy or, for a
    principal, in its identity policies (`identity_allows`: EFS user guide, "an allow in either ... allows")."""
    def applies(st: dict) -> bool:
        who = st["Principal"]["AWS"]
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        return (who == "*" or who == principal) and ("*" in actions or action in actions) and _matches(st.get("Condition", {}), request)

    statements = policy["Statement"]
    if any(st["Effect"] == "Deny" and applies(st) for st in statements):
        return False
    return identity_allows and principal is not None or any(st["Effect"] == "Allow" and applies(st) for st in statements)


def test_efs_access_points(efs_prod):
    rec, _ = efs_prod
    aps = {r.name: plain(r.inputs) for r in rec.of_type(EFS_AP)}
    assert set(aps) == {"weights-efs-ap-serving", "weights-efs-ap-staging"}
    fs_id = recording.placeholder("id", rec.one(EFS_FS).name)
    path = EFS_MODEL.shape_for("Path").metadata
    uid = EFS_MODEL.shape_for("Uid").metadata
    assert all(ap["fileSystemId"] == fs_id for ap in aps.values())
    # Serving: at the root (an access point cannot change, and running stacks hold /<org>/<name>), as `nobody`, in the
    # checkpoint's group; nothing it could own. The root exists: no creation info.
    serving = aps["weights-efs-ap-serving"]
    assert serving["rootDirectory"] == {"path": "/"} and re.fullmatch(path["pattern"], "/")
    assert serving["posixUser"] == {"uid": 65534, "gid": 65534, "secondaryGids": [STAGING_UID]}
    assert all(uid["min"] <= v <= uid["max"] for v in (65534, STAGING_UID))
    # Staging: rooted at the checkpoint's directory, which EFS creates (when missing) owned by the staging user, mode
    # 0755, and the staging user enforced on every request: no root anywhere (infra/aws/efs_access.py).
    staging = aps["weights-efs-ap-staging"]
    assert staging["posixUser"] == {"uid": STAGING_UID, "gid": STAGING_UID} and STAGING_UID != 0
    assert staging["rootDirectory"] == {
        "path": "/deepseek-ai/DeepSeek-V4-Pro",
        "creationInfo": {"ownerUid": STAGING_UID, "ownerGid": STAGING_UID, "permissions": "0755"},
    }
    root = staging["rootDirectory"]
    assert re.fullmatch(path["pattern"], root["path"]) and len(root["path"]) <= path["max"]
    creation = EFS_MODEL.shape_for("CreationInfo")
    assert set(creation.required_members) == {"OwnerUid", "OwnerGid", "Permissions"}
    assert re.fullmatch(creation.members["Permissions"].metadata["pattern"], root["creationInfo"]["permissions"])
    # What the serving door sees of it: the same directory under the mount, world-readable (0755, and the program's
    # umask 022 for what it writes: tests/test_staging.py).
    assert "/models" + root["path"] == efs_prod[1].model_path
    assert set(EFS_MODEL.shape_for("CreateAccessPointRequest").members) >= {"FileSystemId", "PosixUser", "RootDirectory"}


@pytest.mark.parametrize(
    "checkpoint,source,root,below",
    [
        ("deepseek-ai/DeepSeek-V4-Pro", "hf", "/deepseek-ai/DeepSeek-V4-Pro", ""),
        ("deepseek-ai/DeepSeek-V4-Pro@0123456789abcdef0123456789abcdef01234567", "hf", "/deepseek-ai/DeepSeek-V4-Pro", ""),
        ("s3://ml-weights-bucket/deepseek/v4-pro/", "s3", "/ml-weights-bucket/deepseek/v4-pro", ""),
        # Deeper than an access point's four levels: the first four, the rest written by the Job below them.
        ("s3://ml-weights-bucket/a/b/c/d/e", "s3", "/ml-weights-bucket/a/b/c", "d/e"),
        # A level EFS refuses (a leading dot, a `$`): the root stops before it.
        ("s3://ml-weights-bucket/team/.hidden/m", "s3", "/ml-weights-bucket/team", ".hidden/m"),
        ("s3://ml-weights-bucket/a$b/m", "s3", "/ml-weights-bucket", "a$b/m"),
        # Over 100 characters: the levels that fit.
        ("s3://ml-weights-bucket/" + "x" * 90 + "/m", "s3", "/ml-weights-bucket", "x" * 90 + "/m"),
    ],
)
def test_the_staging_root_is_an_access_point_path(checkpoint, source, root, below):
    from infra.k8s import staging

    path = EFS_MODEL.shape_for("Path").metadata
    assert staging.efs_staging_root(checkpoint, source) == (root, below)
    assert re.fullmatch(path["pattern"], root) and len(root) <= path["max"]
    # The Job's destination under its mount is the checkpoint's directory the serving pods read.
    dest = staging.efs_staging_dest("/models", checkpoint, source)
    assert dest == ("/models/" + below if below else "/models")
    assert staging.model_path("/models", checkpoint, source) == "/models" + root + ("/" + below if below else "")


def test_efs_file_system_policy_statements(efs_prod):
    rec, _ = efs_prod
    inputs = plain(rec.one(EFS_POLICY).inputs)
    assert inputs["fileSystemId"] == recording.placeholder("id", rec.one(EFS_FS).name)
    assert inputs["bypassPolicyLockoutSafetyCheck"] is False
    policy = _policy(rec)
    fs_arn = recording.placeholder("arn", rec.one(EFS_FS).name)
    serving, staging = (recording.placeholder("arn", f"weights-efs-ap-{role}") for role in ("serving", "staging"))
    by_sid = {st["Sid"]: st for st in policy["Statement"]}
    assert all(st["Resource"] == fs_arn for st in policy["Statement"])
    # Refuse clients without TLS.
    assert by_sid["DenyWithoutTls"] == {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
                                        "Resource": fs_arn, "Condition": {"Bool": {"aws:SecureTransport": "false"}}}  # fmt: skip
    # Grants: the node role only, over a mount target, through one access point each; serving reads, staging writes.
    allows = [st for st in policy["Statement"] if st["Effect"] == "Allow"]
    assert {st["Sid"] for st in allows} == {"ServingReads", "StagingWrites"}
    for st in allows:
        assert st["Principal"] == {"AWS": NODE_ROLE}
        assert st["Condition"]["Bool"] == {"elasticfilesystem:AccessedViaMountTarget": "true"}
    assert by_sid["ServingReads"]["Action"] == ["elasticfilesystem:ClientMount"]
    assert by_sid["ServingReads"]["Condition"]["StringEquals"] == {"elasticfilesystem:AccessPointArn": serving}
    assert by_sid["StagingWrites"]["Condition"]["StringEquals"] == {"elasticfilesystem:AccessPointArn": staging}
    assert set(by_sid["StagingWrites"]["Action"]) == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}
    # Root for no one: both access points enforce a non-root identity, and no staging step runs as root.
    assert by_sid["DenyRootAccess"] == {"Sid": "DenyRootAccess", "Effect": "Deny", "Principal": {"AWS": "*"},
                                        "Action": ["elasticfilesystem:ClientRootAccess"], "Resource": fs_arn}  # fmt: skip
    assert not any("elasticfilesystem:ClientRootAccess" in st["Action"] for st in allows)


@pytest.mark.parametrize("variant", ["efs-prod", "efs-ephemeral"])
def test_the_file_system_policy_decides_who_may_do_what(variants, variant):
    """Every client a node could be, evaluated against the recorded policy."""
    rec, _ = variants[variant]
    policy = _policy(rec)
    serving, staging = (recording.placeholder("arn", f"weights-efs-ap-{role}") for role in ("serving", "staging"))
    mount, write, root = "elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "elasticfilesystem:ClientRootAccess"

    def can(action, *, ap=None, tls=True, mount_target=True, principal=NODE_ROLE, identity_allows=False):
        request = {"aws:SecureTransport": tls, "elasticfilesystem:AccessedViaMountTarget": mount_target}
        if ap:
            request["elasticfilesystem:AccessPointArn"] = ap
        return iam_allows(policy, principal=principal, action=action, request=request, identity_allows=identity_allows)

    # The serving pods' mount (the node role, iam, tls, the serving access point): read, nothing more.
    assert can(mount, ap=serving) and not can(write, ap=serving) and not can(root, ap=serving)
    # The staging Job's mount: read and write, as the staging user the access point enforces; never root.
    assert can(mount, ap=staging) and can(write, ap=staging) and not can(root, ap=staging)
    assert not any(can(root, ap=ap, identity_allows=True) for ap in (serving, staging, None))
    # Without TLS, nothing, through either door; nor for any other action.
    for ap in (serving, staging):
        assert not any(can(a, ap=ap, tls=False) for a in (mount, write, root))
    assert not can("elasticfilesystem:DescribeMountTargets", tls=False)
    # Without IAM (an anonymous NFS client), nothing: the policy grants no one but the node role.
    for ap in (serving, staging, None):
        assert not can(mount, ap=ap, principal=None)
    # Another role: nothing. The bare file system, without an access point: nothing, even for the node role.
    assert not can(mount, ap=serving, principal="arn:aws:iam::123456789012:role/someone-else")
    assert not any(can(a) for a in (mount, write, root))
    # Not over a mount target: no grant.
    assert not can(mount, ap=serving, mount_target=False) and not can(write, ap=staging, mount_target=False)
    # Even with an EFS client policy on the node role (AmazonElasticFileSystemClientFullAccess), the denies hold:
    # no write or root through the serving door, nothing without an access point or TLS.
    assert not can(write, ap=serving, identity_allows=True) and not can(root, ap=serving, identity_allows=True)
    assert not can(mount, identity_allows=True) and not can(write, identity_allows=True)
    assert not can(mount, ap=staging, tls=False, identity_allows=True)


def test_the_policy_names_what_botocore_and_the_efs_guide_know(efs_prod):
    """Actions: `*`, an operation of botocore's efs model, or an NFS client action. botocore lists no Client*
    operation (checked here): they are permissions only, as the EFS user guide ("EFS actions for clients") and the
    Service Authorization Reference say. The resource's inputs are PutFileSystemPolicy's members."""
    rec, _ = efs_prod
    policy = _policy(rec)
    operations = set(EFS_MODEL.operation_names)
    assert not {a.split(":", 1)[1] for a in efs_access.CLIENT_ACTIONS} & operations
    assert efs_access.CLIENT_ACTIONS == ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "elasticfilesystem:ClientRootAccess")
    keys = set()
    for st in policy["Statement"]:
        for action in st["Action"] if isinstance(st["Action"], list) else [st["Action"]]:
            assert action == "*" or action in efs_access.CLIENT_ACTIONS or (
                action.startswith("elasticfilesystem:") and action.split(":", 1)[1] in operations
            ), action
        for operator in st.get("Condition", {}).values():
            keys |= set(operator)
    # The condition keys EFS evaluates for NFS clients (EFS user guide, "EFS condition keys for clients").
    assert keys == {"aws:SecureTransport", "elasticfilesystem:AccessPointArn", "elasticfilesystem:AccessedViaMountTarget"}
    put = EFS_MODEL.operation_model("PutFileSystemPolicy").input_shape.members
    assert {"FileSystemId", "Policy", "BypassPolicyLockoutSafetyCheck"} <= set(put)
    text = plain(rec.one(EFS_POLICY).inputs)["policy"]
    assert len(text) <= EFS_MODEL.shape_for("Policy").metadata["max"]
    # The access point ARNs the conditions name have the shape botocore gives them.
    arn = EFS_MODEL.shape_for("AccessPointArn").metadata["pattern"]
    assert re.fullmatch(arn, "arn:aws:elasticfilesystem:us-east-1:123456789012:access-point/fsap-0123456789abcdef0")
    # Created once the access points exist (their ARNs are in it), and before the volumes that mount through them.
    needs = {u.rsplit("::", 1)[-1] for u in rec.one(EFS_POLICY).options["depends_on"]}
    assert {"weights-efs", "weights-efs-ap-serving", "weights-efs-ap-staging"} <= needs
    for pv in rec.of_type(PV):
        assert "weights-efs-policy" in {u.rsplit("::", 1)[-1] for u in pv.options["depends_on"]}


def test_the_mount_identity_is_the_node_role(prod_doc):
    """The EFS CSI node plugin mounts with the instance profile: the stack gives Pod Identity to the driver's
    controller only, and the file system policy grants the role every node group uses."""
    from components import cluster

    assert [d.service_account for d in cluster.csi_drivers(False) if d.addon == "aws-efs-csi-driver"] == ["efs-csi-controller-sa"]
    associations = [r for r in prod_doc["resources"] if r["type"] == "aws:eks/podIdentityAssociation:PodIdentityAssociation"]
    assert "efs-csi-node-sa" not in {a["inputs"]["serviceAccount"] for a in associations}
    (role,) = [r for r in prod_doc["resources"] if r["type"] == "aws:iam/role:Role" and r["name"].endswith("-node-role")]
    node_role = recording.placeholder("arn", role["name"])
    groups = [r for r in prod_doc["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup"]
    assert len(groups) >= 2 and {g["inputs"]["nodeRoleArn"] for g in groups} == {node_role}  # system and GPU: one role
    (policy,) = [r for r in prod_doc["resources"] if r["type"] == EFS_POLICY]
    grants = [st for st in json.loads(policy["inputs"]["policy"])["Statement"] if st["Effect"] == "Allow"]
    assert {st["Principal"]["AWS"] for st in grants} == {node_role}


def test_the_serving_pods_mount_the_read_only_claim(prod_doc):
    (rc,) = [r for r in prod_doc["resources"] if r["type"] == "kubernetes:ray.io/v1:RayCluster"]
    spec = rc["inputs"]["spec"]
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec.get("workerGroupSpecs", []))]
    for t in templates:
        claims = [v["persistentVolumeClaim"] for v in t["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [{"claimName": "model-weights-serving", "readOnly": True}]
    (job,) = [r for r in prod_doc["resources"] if r["type"] == JOB and r["name"].endswith("-weights-staging")]
    claims = [v["persistentVolumeClaim"] for v in job["inputs"]["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"claimName": next(r["inputs"]["metadata"]["name"] for r in prod_doc["resources"]
                                         if r["type"] == PVC and r["name"].endswith("-weights-staging-pvc"))}]  # fmt: skip
    assert claims[0]["claimName"].startswith("model-weights-staging-")


def test_a_running_stack_replaces_its_volume_and_claim_and_the_diff_says_so(prod_doc):
    """The prod synthesis against what a running prod stack had before the access points (its one volume and
    claim on the bare file system, protected; rebuilt here from today's): the serving pair takes over their URNs,
    is replaced with protection switched off in the same update (which Pulumi allows), and the diff calls out
    both; nothing protected is deleted."""
    import copy

    from infra.preview.changes import RESTARTS_SERVING, STAGES_AGAIN, effects
    from infra.preview.diff import diff, render_markdown

    head = prod_doc
    base = copy.deepcopy(head)
    efs_only = {EFS_AP, EFS_POLICY}
    base["resources"] = [r for r in base["resources"] if r["type"] not in efs_only and not r["name"].endswith(("-weights-staging-pv", "-weights-staging-pvc"))]
    fs = next(r for r in base["resources"] if r["type"] == EFS_FS)
    for r in base["resources"]:
        if r["type"] == PV and r["name"].endswith("-weights-pv"):
            r["inputs"]["metadata"]["name"] = "gpu-serving-model-weights"
            r["inputs"]["spec"]["claimRef"]["name"] = "model-weights"
            r["inputs"]["spec"]["csi"] = {"driver": EFS_CSI_DRIVER, "volumeHandle": recording.placeholder("id", fs["name"]),
                                          "volumeAttributes": {"mounttargetip": r["inputs"]["spec"]["csi"]["volumeAttributes"]["mounttargetip"]}}  # fmt: skip
            del r["inputs"]["spec"]["mountOptions"]
            r["options"].update(protect=True, retain_on_delete=True)
        if r["type"] == PVC and r["name"].endswith("-weights-pvc"):
            r["inputs"]["metadata"]["name"] = "model-weights"
            r["inputs"]["spec"]["volumeName"] = "gpu-serving-model-weights"
            r["options"]["protect"] = True
        # Its pods mounted that claim; its staging Job had another name.
        if r["type"] in ("kubernetes:ray.io/v1:RayCluster", JOB):
            text = re.sub(r'"claimName": "model-weights-(serving|staging)"', '"claimName": "model-weights"', json.dumps(r["inputs"]))
            r["inputs"] = json.loads(text)
            if r["type"] == JOB and r["name"].endswith("-weights-staging"):
                r["inputs"]["metadata"]["name"] = "model-weights-stage-00000000"
    d = diff(base, head)
    replaced = {c.name: c for c in d.changed if c.replaced}
    pv_name, pvc_name = (next(r["name"] for r in head["resources"] if r["type"] == t and r["name"].endswith(s))
                         for t, s in ((PV, "-weights-pv"), (PVC, "-weights-pvc")))  # fmt: skip
    assert set(replaced) >= {pv_name, pvc_name}
    assert "spec.csi" in replaced[pv_name].replaced_by and "metadata.name" in replaced[pvc_name].replaced_by
    text = render_markdown(d)
    for name in (pv_name, pvc_name):
        assert "**Replaces PersistentVolume" in text and f"`{name}`" in text
        assert any("Protection switched off" in c.text and name in c.text for c in d.callouts)
    assert not any("Deletes protected" in c.text for c in d.callouts)
    # The serving claim's callout says the serving pods go with it (the RayCluster mounts it).
    assert any(pvc_name in c.text and "KubeRay recreates every serving pod" in c.text for c in d.callouts)
    assert {r["type"] for r in d.added} >= efs_only
    # What the README's table would say: the serving pods restart on the new claim (KubeRay recreates them), a new
    # staging Job (which finds every file complete), and nothing protected deleted, no new file system.
    assert effects(d, head) == (RESTARTS_SERVING, STAGES_AGAIN)


def _staged_by_a_root_init_container(head: dict) -> dict:
    """What a running EFS prod stack had before the staging access point took over the chown: rebuilt from `head`,
    field by field as the previous program wrote them (staging access point at `/`, no POSIX user, no creation info;
    ClientRootAccess for the staging door; the staging volume and claim `<ns>-model-weights-staging`,
    `model-weights-staging`; the Job's root init container, its destination the model path under the file system's
    root, its ConfigMap carrying staging_owner.sh; the namespace at baseline)."""
    import copy

    from infra.k8s import staging

    base = copy.deepcopy(head)
    by_name = {r["name"]: r for r in base["resources"]}
    prefix = "gpu-serving-prod-weights"
    ap = by_name[f"{prefix}-efs-ap-staging"]["inputs"]
    del ap["posixUser"]
    ap["rootDirectory"] = {"path": "/"}
    policy = json.loads(by_name[f"{prefix}-efs-policy"]["inputs"]["policy"])
    root = "elasticfilesystem:ClientRootAccess"
    policy["Statement"] = [st for st in policy["Statement"] if st["Sid"] != "DenyRootAccess"]
    for st in policy["Statement"]:
        if st["Sid"] in ("DenyWritesOutsideStaging", "StagingWrites"):
            st["Action"] = st["Action"] + [root]
    by_name[f"{prefix}-efs-policy"]["inputs"]["policy"] = json.dumps(policy, sort_keys=True)
    pv, pvc = by_name[f"{prefix}-staging-pv"]["inputs"], by_name[f"{prefix}-staging-pvc"]["inputs"]
    pv["metadata"]["name"] = pvc["spec"]["volumeName"] = "gpu-serving-model-weights-staging"
    pv["spec"]["claimRef"]["name"] = pvc["metadata"]["name"] = "model-weights-staging"
    job = by_name[f"{prefix}-staging"]["inputs"]
    job["metadata"]["name"] = "model-weights-stage-00000000"
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    model = staging.model_path("/models", "deepseek-ai/DeepSeek-V4-Pro", "hf")
    container["args"][container["args"].index("--dest") + 1] = model
    pod["initContainers"] = [staging.owner_container(container["image"], model, "/models")]
    for v in pod["volumes"]:
        if "persistentVolumeClaim" in v:
            v["persistentVolumeClaim"]["claimName"] = "model-weights-staging"
    scripts = by_name[f"{prefix}-staging-scripts"]["inputs"]
    scripts["data"]["staging_owner.sh"] = (script_files.SCRIPTS_DIR / "staging_owner.sh").read_text()
    (ns,) = [r for r in base["resources"] if r["type"] == "kubernetes:core/v1:Namespace" and r["name"].endswith("-serving")]
    ns["inputs"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"
    return base


def test_day_two_the_staging_access_point_takes_over_the_chown_and_the_diff_says_so(prod_doc):
    """The prod synthesis against a running prod stack staged by the root init container (rebuilt above): the staging
    access point is replaced (root_directory and posix_user are ForceNew), and with it the staging volume and claim,
    under new names, created before the old ones go; the new Job finds every file complete (the checkpoint's directory
    exists and is the staging user's, so EFS leaves it alone: tests/test_staging.py plays it). Nothing of serving moves,
    the file system is not replaced, nothing protected is touched."""
    from infra.preview.changes import STAGES_AGAIN, effects
    from infra.preview.diff import EFS_ACCESS_POINT, FORCE_NEW, diff, render_markdown

    head = prod_doc
    base = _staged_by_a_root_init_container(head)
    d = diff(base, head)
    prefix = "gpu-serving-prod-weights"
    replaced = {c.name: c.replaced_by for c in d.changed if c.replaced}
    assert replaced == {
        f"{prefix}-efs-ap-staging": ["posixUser", "rootDirectory"],
        # Its handle names the access point's id, a placeholder here that a real update changes too (spec.csi).
        f"{prefix}-staging-pv": ["metadata.name"],
        f"{prefix}-staging-pvc": ["metadata.name", "spec.volumeName"],
    }
    # What changes in place: the policy (no ClientRootAccess), the ConfigMap (the program alone), the namespace's level,
    # and the Job, a new one by name.
    changed = {c.name: [f.path for f in c.fields] for c in d.changed}
    assert set(changed) == set(replaced) | {f"{prefix}-efs-policy", f"{prefix}-staging-scripts", f"{prefix}-staging", "gpu-serving-prod-serving"}
    assert changed["gpu-serving-prod-serving"] == ["inputs.metadata.labels[\"pod-security.kubernetes.io/enforce\"]"]
    assert "inputs.metadata.name" in changed[f"{prefix}-staging"]
    # The weights' file system, the serving access point, volume, claim and RayCluster: untouched.
    untouched = {f"{prefix}-efs", f"{prefix}-efs-ap-serving", f"{prefix}-pv", f"{prefix}-pvc"}
    assert not untouched & set(changed)
    assert not [c for c in d.changed if c.type == "kubernetes:ray.io/v1:RayCluster"]
    assert not d.added and not d.removed
    # What the PR comment says, and what the changes table would: a new staging Job, nothing else.
    md = render_markdown(d)
    assert f"**Replaces EFS access point `{prefix}-efs-ap-staging`**" in md and "no file is touched" in md
    assert f"**Replaces PersistentVolume `{prefix}-staging-pv`**" in md
    assert f"**Replaces PersistentVolumeClaim `{prefix}-staging-pvc`**" in md
    assert "Replaces EFS file system" not in md and "Protection switched off" not in md and "Deletes protected" not in md
    # The reviewer is told who mounts the replaced claim: the staging Job, not the serving pods.
    assert f"Mounted by Job `{prefix}-staging`, not by the serving pods" in md and "recreates every serving pod" not in md
    assert effects(d, head) == (STAGES_AGAIN,)
    # The provider's ForceNew fields, as the Terraform schema pulumi-aws bridges has them, exist on the Pulumi resource.
    import inspect

    import pulumi_aws

    args = set(inspect.signature(pulumi_aws.efs.AccessPoint._internal_init).parameters)
    assert {re.sub(r"(?<=[a-z])(?=[A-Z])", "_", f).lower() for f in FORCE_NEW[EFS_ACCESS_POINT]} <= args


@pytest.mark.parametrize("variant,expected", [("efs-prod", True), ("efs-ephemeral", False), ("fsx-prod", True), ("s3-fsx-ephemeral", False)])
def test_protection_follows_production(variants, variant, expected):
    rec, _ = variants[variant]
    (fs,) = rec.of_type(EFS_FS) + rec.of_type(FSX_FS)
    assert fs.options["protect"] is expected and fs.options["retain_on_delete"] is expected
    # Nothing else is protected: the rest is cheap to recreate. The volumes and claims hold no data (Retain), so a
    # running stack can replace them (the access points' volumes) without `pulumi state unprotect`.
    others = [r.name for r in rec.resources if r.custom and r is not fs and (r.options["protect"] or r.options["retain_on_delete"])]
    assert not others
    for pv in rec.of_type(PV):
        assert manifest(pv)["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


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
    for pv in rec.of_type(PV):
        assert plain(pv.inputs)["spec"]["capacity"] == {"storage": f"{sizing.storage_capacity_gib}Gi"}


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


def _pairs(rec) -> dict[str, tuple[dict, dict]]:
    """(volume, claim) manifests by claim name."""
    pvs = {manifest(r)["spec"]["claimRef"]["name"]: manifest(r) for r in rec.of_type(PV)}
    pvcs = {manifest(r)["metadata"]["name"]: manifest(r) for r in rec.of_type(PVC)}
    assert set(pvs) == set(pvcs)
    return {name: (pvs[name], pvcs[name]) for name in pvs}


@pytest.mark.parametrize("variant", ["efs-prod", "fsx-prod"])
def test_static_binding(variants, variant):
    rec, comp = variants[variant]
    pairs = _pairs(rec)
    # The same serving claim for either kind: a change of kind leaves the serving pods' claim alone. On EFS the staging
    # claim is named after its access point's root (the checkpoint's directory), which it follows.
    staging = "model-weights-staging" + ("-" + hashlib.sha256(b"/deepseek-ai/DeepSeek-V4-Pro").hexdigest()[:8] if variant.startswith("efs") else "")
    assert set(pairs) == {"model-weights-serving", staging} == {comp.pvc_name, comp.staging_pvc_name}
    for name, (pv, pvc) in pairs.items():
        assert pv["spec"]["storageClassName"] == "" == pvc["spec"]["storageClassName"]
        assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] == f"gpu-serving-{name}"
        assert pv["spec"]["claimRef"]["name"] == pvc["metadata"]["name"] == name
        assert pv["spec"]["claimRef"]["namespace"] == pvc["metadata"]["namespace"] == "gpu-serving"
        assert pv["spec"]["accessModes"] == ["ReadWriteMany"] == pvc["spec"]["accessModes"]
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        assert pv["spec"]["capacity"]["storage"] == pvc["spec"]["resources"]["requests"]["storage"]
    assert not [r for r in rec.resources if r.type == "kubernetes:storage.k8s.io/v1:StorageClass"]
    # The serving claim keeps the Pulumi names of the one volume and claim a stack had before the access points.
    serving_pv = next(r for r in rec.of_type(PV) if manifest(r)["spec"]["claimRef"]["name"] == comp.pvc_name)
    serving_pvc = next(r for r in rec.of_type(PVC) if manifest(r)["metadata"]["name"] == comp.pvc_name)
    assert (serving_pv.name, serving_pvc.name) == ("weights-pv", "weights-pvc")
    fs = (rec.of_type(EFS_FS) + rec.of_type(FSX_FS))[0]
    fs_id = recording.placeholder("id", fs.name)
    for pv, _ in pairs.values():
        assert pv["spec"]["csi"]["volumeHandle"].split("::")[0] == fs_id


def test_efs_volumes_go_through_the_access_points(efs_prod):
    rec, comp = efs_prod
    pairs = _pairs(rec)
    fs_id = recording.placeholder("id", rec.one(EFS_FS).name)
    aps = {r.name.rsplit("-", 1)[-1]: recording.placeholder("id", r.name) for r in rec.of_type(EFS_AP)}
    for role, claim in (("serving", comp.pvc_name), ("staging", comp.staging_pvc_name)):
        pv, _ = pairs[claim]
        csi = pv["spec"]["csi"]
        assert csi["driver"] == EFS_CSI_DRIVER
        # fs-xxx::fsap-xxx: the file system through the access point, no subpath (aws-efs-csi-driver node.go, parseVolumeId).
        assert csi["volumeHandle"] == f"{fs_id}::{aps[role]}"
        # The driver accepts no other attribute (node.go, NodePublishVolume; keys compared lower-cased).
        assert {k.lower() for k in csi["volumeAttributes"]} <= {"encryptintransit", "mounttargetip", "mounttargetipmap", "crossaccount"}
        assert csi["volumeAttributes"] == {"encryptInTransit": "true", "mounttargetip": "10.0.0.17"}
        # `iam`: the node plugin signs the mount (the policy grants no anonymous client); serving mounts read-only.
        assert pv["spec"]["mountOptions"] == (["iam", "ro"] if role == "serving" else ["iam"])
        assert "tls" not in pv["spec"]["mountOptions"]  # deprecated as a mount option by the driver; encryptInTransit says it


def test_fsx_volume_attributes(fsx_prod):
    rec, comp = fsx_prod
    pairs = _pairs(rec)
    for claim, (pv, _) in pairs.items():
        csi = pv["spec"]["csi"]
        assert csi["driver"] == FSX_CSI_DRIVER
        assert csi["volumeHandle"] == recording.placeholder("id", "weights-fsx")
        assert csi["volumeAttributes"] == {"dnsname": "<id:weights-fsx>.fsx.us-east-1.amazonaws.com", "mountname": "abcdefgh"}
    # FSx for Lustre has no access points and no IAM client authorization (module doc): two views of the file
    # system, the serving one mounted read-only.
    assert pairs[comp.pvc_name][0]["spec"]["mountOptions"] == ["flock", "ro"]
    assert pairs[comp.staging_pvc_name][0]["spec"]["mountOptions"] == ["flock"]
    assert not rec.of_type(EFS_AP) and not rec.of_type(EFS_POLICY)


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
    # The claim, read-write, at the mount path: the staging access point's root, the checkpoint's directory, is the
    # script's destination (the serving pods read it at the model path).
    (vol,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert vol["persistentVolumeClaim"] == {"claimName": comp.staging_pvc_name}
    assert comp.staging_pvc_name.startswith("model-weights-staging-")
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
    assert args[args.index("--dest") + 1] == "/models" and comp.model_path == "/models/deepseek-ai/DeepSeek-V4-Pro"
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
    # ... and nothing else: no init container, no root (the access point hands it the directory), so the pod passes
    # Pod Security restricted; the ConfigMap carries the program alone.
    assert "initContainers" not in pod
    assert set(config_map["data"]) == {"stage_weights.py"}
    from policies import pod_security as pss

    assert pss.level(pod, spec["template"]["metadata"]) == "restricted"
    # Created after its storage exists, and not awaited: `pulumi up` moves on (python -m infra rollout follows it).
    assert job["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert not res.options.get("custom_timeouts")
    needs = {u.rsplit("::", 1)[-1] for u in res.options["depends_on"]}
    assert {"weights-staging-pvc", "weights-efs-mt", "weights-efs-policy", "weights-hf-token", "weights-staging-sa", "weights-staging-scripts",
            "weights-staging-egress"} <= needs  # fmt: skip
    assert "weights-pvc" not in needs  # the serving claim is not the Job's
    # Its egress: HTTPS to the hub, and nothing else (no VPC CIDR given: no exception; no Pod Identity for hf).
    netpol = manifest(rec.one(NETWORK_POLICY))
    assert netpol["spec"]["podSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
    assert netpol["spec"]["policyTypes"] == ["Egress"]
    assert netpol["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]}]


def test_fsx_staging_keeps_its_root_init_container(fsx_prod):
    """FSx for Lustre has no access points, and its CSI driver's fsGroupPolicy (ReadWriteOnceWithFSType) lets no
    kubelet chown a ReadWriteMany volume: the one root step stays, and with it Pod Security baseline."""
    from policies import pod_security as pss

    rec, comp = fsx_prod
    job = manifest(rec.one(JOB))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert comp.staging_pvc_name == "model-weights-staging"
    args = container["args"]
    assert args[args.index("--dest") + 1] == comp.model_path == "/models/deepseek-ai/DeepSeek-V4-Pro"
    config_map = manifest(rec.one(CONFIG_MAP))
    assert set(config_map["data"]) == {"stage_weights.py", "staging_owner.sh"}
    # The one root step, which may only chown: it hands the destination to the program's user.
    (owner,) = pod["initContainers"]
    assert owner["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        "readOnlyRootFilesystem": True, "runAsUser": 0, "runAsNonRoot": False,
    }  # fmt: skip
    assert owner["image"] == container["image"] and owner["args"] == [comp.model_path, f"{STAGING_UID}:{STAGING_UID}"]
    mounted, script = owner["command"][1].rsplit("/", 1)
    assert owner["command"][0] == "sh" and mounted == script_files.MOUNT_PATH and script in config_map["data"]
    assert pss.level(pod, job["spec"]["template"]["metadata"]) == "baseline"
    assert all("own-dest" in v for v in pss.restricted_violations(pod))
    # No access point on FSx, and no Job shares a name with the EFS one (the kind is part of it).
    assert not rec.of_type(EFS_AP)


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
    cfg = yaml_text.safe_load((repo / "Pulumi.test.yaml").read_text())

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
        (dict(mount_role_arn=None), "mount_role_arn"),
    ],
)
def test_bad_arguments_say_what_is_wrong(prod_storage, overrides, message):
    with pytest.raises(UserError, match=message):
        _args(prod_storage, **overrides)
