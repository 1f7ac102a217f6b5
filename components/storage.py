"""Model-weight storage: a shared file system, its volumes and claims, and the Job that fills it.

One `ModelStorage` component (`gpu-serving:storage:ModelStorage`) creates:

- the file system, in the GPU subnet:
  - `efs` (default): Amazon EFS, encrypted at rest, Elastic throughput,
    General Purpose mode, one mount target in the GPU subnet with its own
    security group that admits NFS (TCP 2049) from the given client security
    groups only; its lifecycle policy never moves files to Infrequent Access
    (a cold start reads every byte: IA would bill each read and slow it) and
    brings back, on first access, anything someone moved there; two access
    points and a file system policy ("Who may mount and write", below), the
    staging one rooted at the checkpoint's directory, which EFS creates for
    the staging user;
  - `fsx`: FSx for Lustre, PERSISTENT_2 on SSD, capacity and per-TiB throughput
    from `infra.planning.storage.fsx_lustre_sizing` (the checkpoint with the
    plan's margin, the plan's cold-start read rate), with a security group for
    Lustre (TCP 988 and 1018-1023) between the file servers and from/to the
    clients; no daily backups (the checkpoint's source is the backup);
  - in production (`production=True`) the file system is protected and retained
    on delete (`pulumi destroy` refuses, and even an unprotected delete leaves
    it in the account); in ephemeral stacks it is deleted with the stack;
- two static PersistentVolumes, `<pvc>-serving` (what the serving pods mount,
  `ro`) and `<pvc>-staging` (what the staging Job mounts, read-write), through
  the EFS CSI driver (`efs.csi.aws.com`) or the FSx CSI driver
  (`fsx.csi.aws.com`), ReadWriteMany, each reserved for its claim
  (`claimRef`), reclaim policy `Retain`:
  - EFS: one per access point, volumeHandle `<fs-id>::<fsap-id>` (the driver's `fileSystemID:subpath:
    accessPointID`, subpath empty: aws-efs-csi-driver pkg/driver/node.go,
    `parseVolumeId`; the driver then mounts with `accesspoint=<fsap-id>` and
    `tls`), `mounttargetip` = the mount target's address (so nodes in other
    zones, such as the system nodes that run the staging Job, can mount it
    without a mount target in their zone), `encryptInTransit: "true"` (the
    driver's default, stated), and mount option `iam` (docs/parameters.md:
    "Use the CSI Node Pod's IAM identity to authenticate with Amazon EFS").
    TLS is asked for through `encryptInTransit` and the access point, not a
    `tls` mount option, which the driver calls deprecated (node.go logs
    "Use of 'tls' under mountOptions is deprecated") while adding it itself.
    ReadOnlyMany is no way to say read-only here: the driver accepts only
    SINGLE_NODE_WRITER and MULTI_NODE_MULTI_WRITER (node.go,
    `volumeCapAccessModes`), so the serving volume is ReadWriteMany with the
    mount option `ro` (and the serving pods mount its claim `readOnly`, which
    the kubelet passes on as `ro` too);
  - FSx: two views of the whole file system (FSx for Lustre has no access
    points; below), `dnsname`/`mountname`, `flock` so the hub client's file
    locks work, and `ro` on the serving one (one volume handle, the file
    system's id, for both: the serving pods run on GPU nodes and the Job on
    system nodes, so no node mounts the two);
- the PersistentVolumeClaims in the serving namespace, each bound to its volume
  by name. Binding is static: `storageClassName: ""` on both, and no
  StorageClass (neither driver needs one for a pre-created volume). `pvc_name`
  (the component's) is the claim the serving pods mount, the same name for
  either kind of file system, so a change of kind leaves the serving pods
  alone; `staging_pvc_name` is the staging Job's, on EFS named after the
  staging access point's root directory too (`staging_claim_name`): a new
  checkpoint's access point is a new volume and claim under new names, created
  before the old ones go (a claim of the same name would have to be deleted
  first, and a running Job's pod holds it: pvc-protection);
- when a Hugging Face token is given, a Kubernetes Secret holding it (from the
  secret Output, so Pulumi encrypts it in state and never shows it);
- for an S3 source, an IAM role with read-only access to the prefix, given to
  the staging Job's service account through EKS Pod Identity;
- the staging pods' NetworkPolicy (infra/k8s/network_policies.py,
  `staging_policy`): HTTPS anywhere outside the VPC (the hub, S3) and, for an
  S3 source, the EKS Pod Identity agent; the namespace's default denies the
  rest. NFS and Lustre need no rule: the CSI node plugin mounts the volume on
  the node, in the host's network namespace;
- the staging Job (`infra/k8s/staging.py`): on a system node, mounts the staging
  claim read-write and runs `infra/k8s/scripts/stage_weights.py` from a ConfigMap
  (mounted read-only), which copies the checkpoint to `<mount>/<checkpoint>` (on
  EFS the mount is the checkpoint's directory itself, the staging access point's
  root; on FSx the file system's root, after a root init container handed the
  checkpoint's directory to the staging user: infra/k8s/staging.py, module doc),
  skipping complete files, checking sizes, and writing the completion marker
  the serving pods wait for. Its name changes with the program, the image,
  the arguments, the claim and its generation (`staging_run`); its deadline and
  retries come from the plan's checkpoint size and cold-start target. `pulumi up` does
  not wait for it (`pulumi.com/skipAwait`): staging takes hours for a large
  checkpoint, and an `up` that waited held the way in (the SSM tunnel) that
  long. The serving pods wait for the completion marker themselves
  (`wait_for_weights.sh`), and `python -m infra rollout` follows the Job's
  progress (the program's progress lines) and reports its failure. Every retry,
  and every new Job, resumes the partial downloads the last one left
  (stage_weights.py). A Job past its deadline has failed for good and a second
  `pulumi up` would find nothing changed (a preview cannot see a Job's status),
  so the way to run it again is to raise `gpu-serving:storage.stagingRun`: a
  new name, a new Job, and the failed one deleted after it.

Who may mount and write (EFS): infra/aws/efs_access.py says it all (which
identity mounts, the two access points, the file system policy, what that buys
and what it does not). In short: EFS's default policy let any client that
reached the mount target, so any node, rewrite the weights; now only the
nodes' role may mount, only through the access points, with TLS, and only
the staging access point may write. Both mounts present the same identity
(the node role, through the EFS CSI node plugin), so the access points and
the serving volume's `ro` are the separation.

FSx for Lustre has none of this. Lustre clients are not authenticated: there is
no IAM authorization and no access point, and the server trusts the client's
UIDs. What it offers: traffic is encrypted in transit from instance types that
support it (FSx for Lustre guide, "Encrypting data in transit": PERSISTENT and
SCRATCH_2 file systems, automatically), the security group limits Lustre to the
nodes, and root squash (`RootSquashConfiguration`), which is not set: it would
squash the staging Job's root init container too (its directory under the
root-owned `/`), unless its nodes' addresses were listed in `NoSquashNids`, and
it would still leave any non-root UID, the staging user's included, to every
node. So on FSx the separation is the serving volume's `ro` mount (and the
serving pods' `readOnly` claim) and file ownership: a pod cannot write, but a
node can rewrite the weights. And the staging Job keeps its root init container
(CAP_CHOWN), so an FSx stack's namespace enforces Pod Security `baseline`, an
EFS stack's `restricted` (infra/k8s/pod_security.py). docs/architecture.md and
docs/security.md say so.

Reclaim policy: always `Retain`. A static volume's `Delete` would make the
EFS CSI driver delete its access point (and, with the controller's
`delete-access-point-root-dir`, the access point's root directory: `/`, every
weight, for the serving one; the checkpoint's directory for the staging one), and the FSx CSI driver's DeleteVolume deletes the *file system*
named by the handle; whether the external provisioner acts on a statically
created volume depends on its version. With `Retain`, deleting a volume or a
claim never touches data; the file system's fate is Pulumi's alone (protected
and retained in production, deleted with an ephemeral stack). The volumes and
claims themselves hold no data, so they are not protected: they can be
replaced, as this change replaces them, without a `pulumi state unprotect`
(the policy pack checks their `Retain` instead, policies/rules.py).

What a running stack's next `pulumi up` does when it predates the access points, or
the staging access point's root and POSIX user: docs/operating.md, "Upgrading the
weights' volumes" (tests/test_storage.py checks both with the synth diff).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.pod_identity import PodIdentityNames, pod_identity
from components.protection import kept
from infra.aws.efs_access import ACCESS_POINT_ROOT, READER_UID, file_system_policy
from infra.aws.iam import partition_of, s3_read_policy
from infra.errors import UserError
from infra.k8s import network_policies, script_files
from infra.k8s.scheduling import system_node_selector
from infra.planning.memory import GiB
from infra.planning.serving import Storage
from infra.planning.storage import (
    FSX_DEPLOYMENT_TYPE,
    FSX_STORAGE_TYPE,
    FsxSizing,
    efs_read_throughput_bytes_per_s,
    fsx_lustre_sizing,
)
from infra.k8s.staging import (
    EFS_STAGING_ROOT_MODE,
    STAGING_UID,
    efs_staging_dest,
    efs_staging_root,
    job_name,
    marker_path,
    model_path,
    source_url,
    split_checkpoint,
    staging_args,
    staging_command,
    staging_config_map,
    staging_deadline_s,
    staging_job_spec,
    staging_pod_spec,
    staging_scripts,
    staging_scripts_hash,
)

TYPE = "gpu-serving:storage:ModelStorage"

# EFS (values checked against botocore's efs model in the tests).
EFS_THROUGHPUT_MODE = "elastic"
EFS_PERFORMANCE_MODE = "generalPurpose"
EFS_BACK_FROM_IA = "AFTER_1_ACCESS"  # TransitionToPrimaryStorageClass
NFS_PORT = 2049
# FSx for Lustre (FSx for Lustre user guide, "File system access control with Amazon VPC").
LUSTRE_PORTS = ((988, 988), (1018, 1023))
LUSTRE_VERSION = "2.15"

EFS_CSI_DRIVER = "efs.csi.aws.com"
FSX_CSI_DRIVER = "fsx.csi.aws.com"
RECLAIM_POLICY = "Retain"

# EFS CSI driver mount options (docs/parameters.md): `iam` signs the mount with the node plugin's identity.
EFS_IAM_MOUNT_OPTION = "iam"
READ_ONLY_MOUNT_OPTION = "ro"
# The claims' names: the configured one and a suffix (`claim_names`).
SERVING_CLAIM_SUFFIX = "-serving"
STAGING_CLAIM_SUFFIX = "-staging"
# The staging Job's await annotation: `pulumi up` creates it and moves on (module doc).
STAGING_AWAIT = {"pulumi.com/skipAwait": "true"}
# The staging Job's labels beside the shared ones; `python -m infra rollout` finds the Job by them.
STAGING_COMPONENT = {"app.kubernetes.io/component": "weight-staging"}
ACCESS_MODES = ["ReadWriteMany"]

Kind = Literal["efs", "fsx"]
Source = Literal["hf", "s3"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ModelStorageArgs:
    """What the weight storage needs. Validated when built (a `UserError` says what is wrong).

    `client_security_group_ids`: the security groups of every node that mounts
    the volume (the GPU nodes and the system nodes that run the staging Job;
    the EKS cluster security group covers both). `hf_token` must be a secret
    Output (`pulumi.Config().require_secret(...)`), never a plain string.
    `cluster_name` is needed for an S3 source (EKS Pod Identity). `staging_image`:
    a pinned image with Python 3 and the source's clients installed (`huggingface_hub`
    and `boto3`, images/staging/), running as a non-root user; nothing is installed
    when the Job runs. It may be an Output (the stack's ECR repository URL and the
    tag); then `staging_image_id` names its content (the tag), for the Job's name.
    `vpc_cidr`: the VPC's CIDR when known; the staging pods' HTTPS egress excludes it.
    `mount_role_arn` (EFS): the IAM role the EFS CSI driver's node plugin mounts with,
    the nodes' role (module doc, "Which identity mounts"); the file system policy grants it.
    """

    kind: Kind
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    client_security_group_ids: Sequence[pulumi.Input[str]]
    storage: Storage  # the plan's storage figures (Plan.deployment().storage)
    production: bool
    namespace: str
    checkpoint: str  # "org/name[@revision]" (hf) or "s3://bucket/prefix" (s3)
    source: Source
    staging_image: pulumi.Input[str]
    pvc_name: str = "model-weights"
    hf_token: Optional[pulumi.Output] = None
    mount_path: str = "/models"
    cluster_name: Optional[pulumi.Input[str]] = None
    region: Optional[str] = None  # for the IAM partition and EFS's regional read ceiling
    staging_image_id: Optional[str] = None
    vpc_cidr: Optional[str] = None
    staging_workers: int = 8
    staging_excludes: tuple[str, ...] = ()
    # The staging Job's generation (gpu-serving:storage.stagingRun): part of its name,
    # so raising it replaces a failed Job with a new one that resumes.
    staging_run: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    # The file system's KMS key (the stack's key); None: the service's AWS managed key. Create-only on EFS and FSx.
    kms_key_arn: Optional[pulumi.Input[str]] = None
    mount_role_arn: Optional[pulumi.Input[str]] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "client_security_group_ids", list(self.client_security_group_ids))
        object.__setattr__(self, "staging_excludes", tuple(self.staging_excludes))
        validate_storage_args(self)


def validate_storage_args(args: ModelStorageArgs) -> None:
    if args.kind not in ("efs", "fsx"):
        raise UserError(f"storage: kind {args.kind!r} must be 'efs' or 'fsx'")
    if args.source not in ("hf", "s3"):
        raise UserError(f"storage: checkpoint source {args.source!r} must be 'hf' or 's3'")
    try:
        split_checkpoint(args.checkpoint, args.source)
        if args.kind == "efs":
            efs_staging_root(args.checkpoint, args.source)
    except ValueError as exc:
        raise UserError(f"storage: {exc}") from None
    if not args.client_security_group_ids:
        raise UserError("storage: client_security_group_ids is empty; no node could mount the file system")
    if args.kind == "efs" and args.mount_role_arn is None:
        raise UserError(
            "storage: EFS needs mount_role_arn, the nodes' IAM role the EFS CSI driver mounts with: "
            "the file system policy grants it, and nobody else, access through the access points"
        )
    if not _DNS_LABEL.match(args.namespace) or len(args.namespace) > 63:
        raise UserError(f"storage: namespace {args.namespace!r} is not a DNS label")
    if not _DNS_LABEL.match(args.pvc_name) or len(args.pvc_name) > 48:
        raise UserError(f"storage: pvc_name {args.pvc_name!r} must be a DNS label of at most 48 characters")
    if not args.mount_path.startswith("/") or args.mount_path.rstrip("/") in ("", "/tmp", script_files.MOUNT_PATH):
        raise UserError(
            f"storage: mount_path {args.mount_path!r} must be an absolute path other than /, /tmp and {script_files.MOUNT_PATH}"
        )
    if isinstance(args.staging_image, str):
        image = args.staging_image
        if not image or ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
            raise UserError(f"storage: staging_image {image!r} must be pinned (a tag or a digest)")
    elif not args.staging_image_id:
        raise UserError("storage: a staging_image known only as an Output needs staging_image_id (its tag), for the Job's name")
    if isinstance(args.hf_token, str):
        raise UserError("storage: hf_token must be a secret Output (pulumi.Config().require_secret), not a plain string")
    if args.hf_token is not None and args.source != "hf":
        raise UserError("storage: hf_token is only used with a Hugging Face ('hf') checkpoint source")
    if args.source == "s3" and args.cluster_name is None:
        raise UserError("storage: an S3 source needs cluster_name (the staging Job reads S3 through EKS Pod Identity)")
    if args.staging_workers < 1:
        raise UserError("storage: staging_workers must be at least 1")
    if args.staging_run < 0:
        raise UserError("storage: staging_run must not be negative")
    figures: Storage = args.storage
    if figures.checkpoint_bytes <= 0 or figures.size_bytes < figures.checkpoint_bytes:
        raise UserError(f"storage: the plan's sizes are inconsistent ({figures})")


# ---- pure helpers (tested directly) -------------------------------------------------------


def staging_image_id(args: ModelStorageArgs) -> Optional[str]:
    """What names the staging image's content: the reference itself, or `staging_image_id` for an Output."""
    if isinstance(args.staging_image, str):
        return args.staging_image
    return args.staging_image_id


def pv_name(namespace: str, pvc_name: str) -> str:
    """The PersistentVolume's (cluster-wide) name: unique per namespace and claim."""
    return f"{namespace}-{pvc_name}"[:253]


def capacity_quantity(size_bytes: int) -> str:
    """A PV/PVC capacity in whole GiB (EFS ignores it; FSx's is the file system's size)."""
    return f"{-(-size_bytes // GiB)}Gi"


def claim_names(pvc_name: str) -> tuple[str, str]:
    """(the serving pods' claim, the staging Job's claim on FSx): on EFS one per access point, on FSx two views
    of the file system; the serving one the same for both kinds, so a change of kind leaves the serving pods'
    claim alone. On EFS the staging claim is `staging_claim_name`."""
    return f"{pvc_name}{SERVING_CLAIM_SUFFIX}", f"{pvc_name}{STAGING_CLAIM_SUFFIX}"


def staging_claim_name(pvc_name: str, kind: Kind, checkpoint: str, source: str) -> str:
    """The staging Job's claim. On EFS `<pvc>-staging-<8 hex digits of the staging access point's root>`: the
    access point follows the checkpoint (infra/aws/efs_access.py), and so do its volume and claim, under new
    names (module doc: created before the old ones go). On FSx `<pvc>-staging`, one view of the file system."""
    base = claim_names(pvc_name)[1]
    if kind != "efs":
        return base
    root, _ = efs_staging_root(checkpoint, source)
    return f"{base}-{hashlib.sha256(root.encode()).hexdigest()[:8]}"


def staging_posix_user() -> dict[str, Any]:
    """The staging access point's POSIX identity: the staging program's user and group (infra/aws/efs_access.py)."""
    return {"uid": STAGING_UID, "gid": STAGING_UID}


def staging_root_directory(checkpoint: str, source: str) -> dict[str, Any]:
    """The staging access point's root: the checkpoint's directory, created (when missing) for the staging user,
    mode 0755 (EFS user guide, "Creating the root directory for an access point"; infra/k8s/staging.py)."""
    root, _ = efs_staging_root(checkpoint, source)
    creation = {"owner_uid": STAGING_UID, "owner_gid": STAGING_UID, "permissions": EFS_STAGING_ROOT_MODE}
    return {"path": root, "creation_info": creation}


def efs_volume_handle(file_system_id: pulumi.Input[str], access_point_id: pulumi.Input[str]) -> pulumi.Output[str]:
    """`<fs-id>::<fsap-id>`: the file system through an access point, no subpath (node.go, `parseVolumeId`)."""
    return pulumi.Output.concat(file_system_id, "::", access_point_id)


def efs_volume_source(volume_handle: pulumi.Input[str], mount_target_ip: pulumi.Input[str]) -> dict[str, Any]:
    # The EFS CSI driver accepts only encryptInTransit, mounttargetip, mounttargetipmap and
    # crossaccount as volume attributes (pkg/driver/node.go, NodePublishVolume; keys compared
    # lower-cased); TLS is its default, stated here because the file system policy refuses a mount without it.
    return {
        "driver": EFS_CSI_DRIVER,
        "volumeHandle": volume_handle,
        "volumeAttributes": {"encryptInTransit": "true", "mounttargetip": mount_target_ip},
    }


def efs_mount_options(read_only: bool) -> list[str]:
    """`iam` (the file system policy grants the node role, and no anonymous client), and `ro` for the serving volume."""
    return [EFS_IAM_MOUNT_OPTION, READ_ONLY_MOUNT_OPTION] if read_only else [EFS_IAM_MOUNT_OPTION]


def serving_posix_user() -> dict[str, Any]:
    """The serving access point's POSIX identity (infra/aws/efs_access.py): `nobody`, in the checkpoint's group."""
    return {"uid": READER_UID, "gid": READER_UID, "secondary_gids": [STAGING_UID]}


def fsx_volume_source(
    file_system_id: pulumi.Input[str], dns_name: pulumi.Input[str], mount_name: pulumi.Input[str]
) -> dict[str, Any]:
    # aws-fsx-csi-driver examples/kubernetes/static_provisioning/specs/pv.yaml.
    return {"driver": FSX_CSI_DRIVER, "volumeHandle": file_system_id, "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name}}


def persistent_volume_spec(
    csi: dict[str, Any], *, size_bytes: int, namespace: str, pvc_name: str, mount_options: Sequence[str] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": capacity_quantity(size_bytes)},
        "accessModes": list(ACCESS_MODES),
        "volumeMode": "Filesystem",
        "persistentVolumeReclaimPolicy": RECLAIM_POLICY,
        "storageClassName": "",
        # Reserved for our claim: no other claim can bind it first.
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": pvc_name},
        "csi": csi,
    }
    if mount_options:
        spec["mountOptions"] = list(mount_options)
    return spec


def persistent_volume_claim_spec(*, size_bytes: int, volume_name: str) -> dict[str, Any]:
    return {
        "accessModes": list(ACCESS_MODES),
        "volumeMode": "Filesystem",
        "storageClassName": "",
        "volumeName": volume_name,
        "resources": {"requests": {"storage": capacity_quantity(size_bytes)}},
    }


def s3_bucket_and_prefix(checkpoint: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix), validated as the staging program reads it."""
    directory, _ = split_checkpoint(checkpoint, "s3")
    bucket, _, prefix = directory.partition("/")
    return bucket, prefix


def read_throughput_bytes_per_s(kind: Kind, sizing: Optional[FsxSizing], region: Optional[str]) -> int:
    """What the file system can serve to all nodes together."""
    if kind == "fsx":
        assert sizing is not None
        return sizing.throughput_bytes_per_s
    return efs_read_throughput_bytes_per_s(region)


# ---- the component --------------------------------------------------------------------------


class ModelStorage(pulumi.ComponentResource):
    """The weights' file system, volumes, claims and staging Job (see the module docstring)."""

    file_system_id: pulumi.Output[str]
    pvc_name: str  # the claim the serving pods mount (read-only)
    staging_pvc_name: str  # the claim the staging Job mounts (read-write)
    staging_job_name: str
    marker_path: str
    model_path: str
    mount_path: str
    read_throughput_bytes_per_s: int
    fsx_sizing: Optional[FsxSizing]
    staging_deadline_s: int
    staging_scripts: k8s.core.v1.ConfigMap

    def __init__(self, name: str, args: ModelStorageArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.args = args
        child = pulumi.ResourceOptions(parent=self)
        keep = pulumi.ResourceOptions.merge(child, kept(args.production))  # what holds the weights
        tags = dict(args.tags)
        figures: Storage = args.storage

        # -- the file system ---------------------------------------------------------------
        # `volumes`: (volume source, mount options) of the serving volume, and of the staging one on EFS.
        self.fsx_sizing = None
        self.mount_target: Optional[aws.efs.MountTarget] = None
        self.access_points: dict[str, aws.efs.AccessPoint] = {}
        self.file_system_policy: Optional[aws.efs.FileSystemPolicy] = None
        if args.kind == "efs":
            volumes, fs_ready = self._efs(name, args, tags, child, keep)
            capacity_bytes = figures.size_bytes
        else:
            volumes, fs_ready = self._fsx(name, args, figures, tags, child, keep)
            assert self.fsx_sizing is not None
            capacity_bytes = self.fsx_sizing.storage_capacity_gib * GiB
        self.read_throughput_bytes_per_s = read_throughput_bytes_per_s(args.kind, self.fsx_sizing, args.region)

        # -- volumes and claims ---------------------------------------------------------------------
        # The serving pair keeps the Pulumi names of the one volume and claim a stack had before the access
        # points: a running stack replaces them (module doc, "A running stack"), a new one just creates them.
        labels = {"app.kubernetes.io/name": "model-weights", "app.kubernetes.io/part-of": "gpu-serving"}
        self.pvc_name = claim_names(args.pvc_name)[0]
        self.staging_pvc_name = staging_claim_name(args.pvc_name, args.kind, args.checkpoint, args.source)
        volume_args = dict(capacity_bytes=capacity_bytes, namespace=args.namespace, labels=labels, depends_on=fs_ready, child=child)
        self.persistent_volume, self.persistent_volume_claim = self._volume(
            f"{name}-pv", f"{name}-pvc", self.pvc_name, *volumes["serving"], **volume_args
        )
        self.staging_persistent_volume, self.staging_persistent_volume_claim = self._volume(
            f"{name}-staging-pv", f"{name}-staging-pvc", self.staging_pvc_name, *volumes["staging"], **volume_args
        )

        # -- credentials for the staging Job ------------------------------------------------------
        staging_deps: list[pulumi.Resource] = [self.staging_persistent_volume_claim, *fs_ready]
        service_account = f"{args.pvc_name}-staging"
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-staging-sa",
            metadata={"name": service_account, "namespace": args.namespace, "labels": labels},
            opts=child,
        )
        staging_deps.append(self.service_account)
        secret_name: Optional[str] = None
        self.hf_token_secret: Optional[k8s.core.v1.Secret] = None
        if args.hf_token is not None:
            secret_name = f"{args.pvc_name}-hf-token"
            self.hf_token_secret = k8s.core.v1.Secret(
                f"{name}-hf-token",
                metadata={"name": secret_name, "namespace": args.namespace, "labels": labels},
                type="Opaque",
                # Output.secret: encrypted in state, hidden in previews, whatever the caller passed.
                string_data={"HF_TOKEN": pulumi.Output.secret(args.hf_token)},
                opts=child,
            )
            staging_deps.append(self.hf_token_secret)
        if args.source == "s3":
            staging_deps.append(self._s3_access(name, args, service_account, tags, child))

        # -- the staging Job ---------------------------------------------------------------------------
        self.mount_path = args.mount_path.rstrip("/")
        self.model_path = model_path(self.mount_path, args.checkpoint, args.source)
        self.marker_path = marker_path(self.mount_path, args.checkpoint, args.source)
        self.staging_deadline_s = staging_deadline_s(figures.checkpoint_bytes, figures.cold_start_target_s)
        command = staging_command()
        # FSx: the root init container hands the checkpoint's directory over; EFS: the access point did (module doc).
        owner_step = args.kind == "fsx"
        scripts_run = staging_scripts(owner_step)
        # Where the program writes: on EFS the staging volume is the checkpoint's directory (or its first levels).
        dest = self.model_path if owner_step else efs_staging_dest(self.mount_path, args.checkpoint, args.source)
        job_args = staging_args(source_url(args.checkpoint, args.source), dest, args.staging_workers, args.staging_excludes)
        # The file system's kind is part of what the Job writes to: a stack moved to another kind has a new,
        # empty file system, which a Job of the same name (already complete) would never fill.
        # So is its claim (a Job's pod template is immutable): the staging claim (module doc, "A running stack")
        # is a new Job.
        self.staging_job_name = job_name(
            args.pvc_name, staging_scripts_hash(scripts_run), str(staging_image_id(args)), *command, *job_args, f"run {args.staging_run}",
            *(() if args.kind == "efs" else (f"file system {args.kind}",)),
            f"claim {self.staging_pvc_name}",
        )
        # The program, mounted read-only into the Job's pod (created before the Job).
        scripts = staging_config_map(f"{args.pvc_name}-staging-scripts", args.namespace, labels, scripts_run)
        self.staging_scripts = k8s.core.v1.ConfigMap(
            f"{name}-staging-scripts", metadata=scripts["metadata"], data=scripts["data"], opts=child
        )
        staging_deps.append(self.staging_scripts)
        pod_spec = staging_pod_spec(
            image=args.staging_image,
            command=command,
            args=job_args,
            pvc_name=self.staging_pvc_name,
            mount_path=self.mount_path,
            dest=dest,
            service_account=service_account,
            hf_token_secret=secret_name,
            scripts_config_map=scripts["metadata"]["name"],
            node_selector=system_node_selector(),
            owner_step=owner_step,
        )
        job_labels = {**labels, **STAGING_COMPONENT}
        # What the staging pods may reach (infra/k8s/network_policies.py), in place before the Job.
        egress = network_policies.staging_policy(
            f"{args.pvc_name}-staging",
            args.namespace,
            job_labels,
            vpc_cidr=args.vpc_cidr,
            pod_identity=args.source == "s3",
            labels=labels,
        )
        self.staging_network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-staging-egress", metadata=egress["metadata"], spec=egress["spec"], opts=child
        )
        staging_deps.append(self.staging_network_policy)
        annotations = {
            "gpu-serving/checkpoint": args.checkpoint,
            "gpu-serving/marker": self.marker_path,
            # Created, not awaited (module doc): pulumi-kubernetes skips the Job's completion wait
            # (provider/pkg/await/awaiters.go) and, for a Job, its deletion wait too
            # (provider/pkg/metadata/overrides.go, allowsSkipAwaitWithDelete). Harmless here: a
            # new Job has a new name (job_name), so it never waits on the old one's tombstone,
            # and the claim it mounts is only deleted once its pods are gone (pvc-protection).
            **STAGING_AWAIT,
        }
        self.staging_job = k8s.batch.v1.Job(
            f"{name}-staging",
            metadata={"name": self.staging_job_name, "namespace": args.namespace, "labels": job_labels, "annotations": annotations},
            spec=staging_job_spec(pod_spec, deadline_s=self.staging_deadline_s, labels=job_labels, scripts=scripts_run),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=staging_deps)),
        )

        # -- outputs ------------------------------------------------------------------------------------
        self.register_outputs(
            {
                "file_system_id": self.file_system_id,
                "pvc_name": self.pvc_name,
                "staging_pvc_name": self.staging_pvc_name,
                "staging_job_name": self.staging_job_name,
                "marker_path": self.marker_path,
                "model_path": self.model_path,
                "read_throughput_bytes_per_s": self.read_throughput_bytes_per_s,
            }
        )

    # -- volumes ---------------------------------------------------------------------------------------

    def _volume(self, pv_resource: str, pvc_resource: str, claim: str, csi: dict[str, Any], mount_options: Sequence[str], *,
                capacity_bytes: int, namespace: str, labels: dict[str, str], depends_on: Sequence[pulumi.Resource],
                child: pulumi.ResourceOptions) -> tuple[k8s.core.v1.PersistentVolume, k8s.core.v1.PersistentVolumeClaim]:  # fmt: skip
        """A static volume and its claim. Not protected: they hold no data (`Retain`; module doc, "Reclaim policy")."""
        volume_name = pv_name(namespace, claim)
        pv = k8s.core.v1.PersistentVolume(
            pv_resource,
            metadata={"name": volume_name, "labels": labels},
            spec=persistent_volume_spec(
                csi, size_bytes=capacity_bytes, namespace=namespace, pvc_name=claim, mount_options=mount_options
            ),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(depends_on))),
        )
        pvc = k8s.core.v1.PersistentVolumeClaim(
            pvc_resource,
            metadata={"name": claim, "namespace": namespace, "labels": labels},
            spec=persistent_volume_claim_spec(size_bytes=capacity_bytes, volume_name=volume_name),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[pv])),
        )
        return pv, pvc

    # -- file systems -----------------------------------------------------------------------------------

    def _efs(self, name, args: ModelStorageArgs, tags, child, keep):
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-efs-sg",
            vpc_id=args.vpc_id,
            description="Model weights on EFS: NFS from the cluster's nodes only",
            tags={**tags, "Name": f"{name}-efs"},
            opts=child,
        )
        for i, client in enumerate(args.client_security_group_ids):
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-efs-nfs-from-{i}",
                security_group_id=self.security_group.id,
                referenced_security_group_id=client,
                ip_protocol="tcp",
                from_port=NFS_PORT,
                to_port=NFS_PORT,
                description="NFS from cluster nodes",
                opts=child,
            )
        self.file_system = aws.efs.FileSystem(
            f"{name}-efs",
            encrypted=True,
            kms_key_id=args.kms_key_arn,
            performance_mode=EFS_PERFORMANCE_MODE,
            throughput_mode=EFS_THROUGHPUT_MODE,
            # No TransitionToIA/ToArchive: the weights stay in Standard storage.
            lifecycle_policies=[aws.efs.FileSystemLifecyclePolicyArgs(transition_to_primary_storage_class=EFS_BACK_FROM_IA)],
            tags={**tags, "Name": f"{name}-weights"},
            opts=keep,
        )
        self.mount_target = aws.efs.MountTarget(
            f"{name}-efs-mt",
            file_system_id=self.file_system.id,
            subnet_id=args.subnet_id,
            security_groups=[self.security_group.id],
            opts=child,
        )
        self.file_system_id = self.file_system.id
        # The two doors (infra/aws/efs_access.py): serving at the root with an identity that owns nothing; staging at the
        # checkpoint's directory, which EFS creates for the staging user it enforces (no root step, no ClientRootAccess).
        serving_user = serving_posix_user()
        self.access_points["serving"] = aws.efs.AccessPoint(
            f"{name}-efs-ap-serving",
            file_system_id=self.file_system.id,
            posix_user=aws.efs.AccessPointPosixUserArgs(**serving_user),
            root_directory=aws.efs.AccessPointRootDirectoryArgs(path=ACCESS_POINT_ROOT),
            tags={**tags, "Name": f"{name}-weights-serving"},
            opts=child,
        )
        staging_root = staging_root_directory(args.checkpoint, args.source)
        self.access_points["staging"] = aws.efs.AccessPoint(
            f"{name}-efs-ap-staging",
            file_system_id=self.file_system.id,
            posix_user=aws.efs.AccessPointPosixUserArgs(**staging_posix_user()),
            root_directory=aws.efs.AccessPointRootDirectoryArgs(
                path=staging_root["path"],
                creation_info=aws.efs.AccessPointRootDirectoryCreationInfoArgs(**staging_root["creation_info"]),
            ),
            tags={**tags, "Name": f"{name}-weights-staging"},
            opts=child,
        )
        serving, staging = self.access_points["serving"], self.access_points["staging"]
        policy = pulumi.Output.all(self.file_system.arn, args.mount_role_arn, serving.arn, staging.arn).apply(
            lambda a: json.dumps(file_system_policy(*a), sort_keys=True)
        )
        self.file_system_policy = aws.efs.FileSystemPolicy(
            f"{name}-efs-policy",
            file_system_id=self.file_system.id,
            policy=policy,
            # The lockout check stays on: the policy denies the API only without TLS, which no API call lacks.
            bypass_policy_lockout_safety_check=False,
            opts=child,
        )
        volumes = {
            role: (
                efs_volume_source(efs_volume_handle(self.file_system.id, ap.id), self.mount_target.ip_address),
                efs_mount_options(read_only=role == "serving"),
            )
            for role, ap in self.access_points.items()
        }
        # The volumes exist once the policy does: every mount through them meets the final policy.
        return volumes, [self.mount_target, self.file_system_policy]

    def _fsx(self, name, args: ModelStorageArgs, figures: Storage, tags, child, keep):
        sizing = fsx_lustre_sizing(figures.checkpoint_bytes, figures.required_read_bytes_per_s)
        self.fsx_sizing = sizing
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-fsx-sg",
            vpc_id=args.vpc_id,
            description="Model weights on FSx for Lustre: Lustre between file servers and with cluster nodes",
            tags={**tags, "Name": f"{name}-fsx"},
            opts=child,
        )
        sg = self.security_group.id
        peers: list[tuple[str, pulumi.Input[str]]] = [("self", sg)] + [
            (str(i), client) for i, client in enumerate(args.client_security_group_ids)
        ]
        for slug, peer in peers:
            for low, high in LUSTRE_PORTS:
                ports = f"{low}" if low == high else f"{low}-{high}"
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-fsx-in-{slug}-{ports}",
                    security_group_id=sg,
                    referenced_security_group_id=peer,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    description=f"Lustre {ports} from {'the file servers' if slug == 'self' else 'cluster nodes'}",
                    opts=child,
                )
                aws.vpc.SecurityGroupEgressRule(
                    f"{name}-fsx-out-{slug}-{ports}",
                    security_group_id=sg,
                    referenced_security_group_id=peer,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    description=f"Lustre {ports} to {'the file servers' if slug == 'self' else 'cluster nodes'}",
                    opts=child,
                )
                if slug != "self":
                    # Lustre servers also open connections to clients (LNet on 988/1018-1023).
                    aws.vpc.SecurityGroupIngressRule(
                        f"{name}-fsx-client-{slug}-{ports}",
                        security_group_id=peer,
                        referenced_security_group_id=sg,
                        ip_protocol="tcp",
                        from_port=low,
                        to_port=high,
                        description=f"Lustre {ports} from the model-weight file servers",
                        opts=child,
                    )
        self.file_system = aws.fsx.LustreFileSystem(
            f"{name}-fsx",
            deployment_type=FSX_DEPLOYMENT_TYPE,
            storage_type=FSX_STORAGE_TYPE,
            storage_capacity=sizing.storage_capacity_gib,
            per_unit_storage_throughput=sizing.per_unit_storage_throughput_mbps,
            subnet_ids=args.subnet_id,
            security_group_ids=[sg],
            file_system_type_version=LUSTRE_VERSION,
            kms_key_id=args.kms_key_arn,  # PERSISTENT deployments take one (FSx API, CreateFileSystem KmsKeyId)
            data_compression_type="NONE",  # safetensors of quantised weights barely compress
            # The checkpoint's source (the hub or S3) is its backup.
            automatic_backup_retention_days=0,
            skip_final_backup=True,
            tags={**tags, "Name": f"{name}-weights"},
            opts=keep,
        )
        self.file_system_id = self.file_system.id
        csi = fsx_volume_source(self.file_system.id, self.file_system.dns_name, self.file_system.mount_name)
        # Two views of the one file system (FSx for Lustre has no access points, module doc): the serving one `ro`;
        # `flock` for the hub client's locks.
        return {"serving": (csi, ["flock", READ_ONLY_MOUNT_OPTION]), "staging": (csi, ["flock"])}, [self.file_system]

    def _s3_access(self, name, args: ModelStorageArgs, service_account: str, tags, child) -> pulumi.Resource:
        partition = partition_of(args.region) if args.region else "aws"
        return pod_identity(
            PodIdentityNames(f"{name}-staging-role", f"{name}-staging-s3-read", f"{name}-staging-identity"),
            cluster_name=args.cluster_name, namespace=args.namespace, service_account=service_account,
            description=f"Weight staging: read {args.checkpoint}",
            policy=s3_read_policy(partition, *s3_bucket_and_prefix(args.checkpoint)), tags=tags, opts=child,
        )  # fmt: skip
