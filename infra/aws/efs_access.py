"""Who may mount and write the model weights on EFS: the access points and the file system policy.

Pure (no Pulumi, no AWS calls): components/storage.py creates the access points
and the policy from these, and tests/test_storage.py evaluates the policy it
records for every client a node could be.

EFS's default file system policy grants full access to any client that reaches
a mount target (EFS user guide, "Using IAM to control access to file systems",
"Default EFS file system policy"), and the mount target admits every node (the
cluster and EFA security groups), so every node, and anything that can run on
one, could rewrite the weights. Now:

- Which identity mounts. With `iam`, the EFS CSI driver's node plugin
  (the `efs-csi-node` DaemonSet, `hostNetwork: true`, service account
  `efs-csi-node-sa`) runs efs-utils' mount helper on the node, which signs the
  mount with the first credentials it finds (efs-utils
  src/efs_utils_common/aws_credentials.py, `get_aws_security_credentials`:
  an ECS credentials URI, an `awsprofile`, EKS Pod Identity, IRSA, then the
  instance profile through IMDS). Not the workload pod's: the CSI request
  carries no pod identity, and the driver's docs say the node pod's. The stack
  gives Pod Identity to the EFS CSI *controller*'s service account only
  (components/cluster.py, `EFS_CSI`), so the node plugin falls through to the
  instance profile: the node role (`ModelStorageArgs.mount_role_arn`). Every
  node group uses that one role, and the serving pods (GPU nodes) and the staging Job (system
  nodes) are mounted by the same DaemonSet: **both mounts necessarily present
  the same IAM identity**. IAM cannot tell serving from staging; the access
  points can.
- Two access points, each enforcing a POSIX identity (so AWS Security Hub's
  EFS.4, "access points should enforce a user identity", passes for both):
  `serving`, rooted at the file system's root (`/`), enforces an identity
  that owns nothing, `nobody` (`READER_UID`, group `READER_UID`, secondary
  group the staging user's group, so a checkpoint staged with a tighter umask
  stays readable), so even a write the policy let through would meet files it
  does not own; `staging` is rooted at the checkpoint's directory
  (`/<org>/<name>`: infra/k8s/staging.py, `efs_staging_root`), enforces the
  staging user (`STAGING_UID`, its group) and, when that directory does not
  exist at mount time, has EFS create it owned by that user, mode 0755
  (`creation_info`; EFS user guide, "Creating the root directory for an
  access point"; an existing one keeps its owner and mode, and a stack staged
  before this has it owned by the staging user already, the old init
  container's chown). So the staging Job needs no root: no init container, no
  ClientRootAccess for anyone. Why the serving root stays `/`: an access point
  cannot change (EFS has no UpdateAccessPoint; its root directory and POSIX
  user are set at creation: every field but the tags is ForceNew in the
  Terraform provider pulumi-aws bridges, internal/service/efs/access_point.go),
  and a PersistentVolume's source is immutable, so a serving root that
  followed the checkpoint would replace the serving access point, volume and
  claim, in use, on every change of model. The staging access point does
  follow the checkpoint: a new checkpoint replaces it, the staging volume and
  claim (under new names, components/storage.py) and the Job, none of which
  the serving pods mount. The Path of an access point allows four levels and
  100 characters at most (botocore efs `Path`), fewer than an S3 prefix may
  have: then the root is the checkpoint's first four levels and the Job
  writes below it.
- The file system policy (`file_system_policy`): denies every request without
  TLS (`aws:SecureTransport` false; the user guide's in-transit example);
  denies `ClientMount`, `ClientWrite` and `ClientRootAccess` to anyone not
  coming through one of the two access points (`elasticfilesystem:AccessPointArn`;
  a negated condition is true when the key is absent, IAM user guide,
  "Condition operators", so a mount of the bare file system is refused);
  denies `ClientWrite` through anything but the staging access point, and
  `ClientRootAccess` to everyone (no mount needs root: both access points
  enforce a non-root identity); allows the node role `ClientMount` through the
  serving access point and `ClientMount` and `ClientWrite` through the staging
  one, each only over a mount target (`elasticfilesystem:AccessedViaMountTarget`).
  Nothing is granted to an anonymous client, so a mount without `iam` is
  refused. The denies hold even if someone attaches an EFS client policy
  (AmazonElasticFileSystemClientFullAccess) to the node role, since an allow
  in either an identity or the file system policy would otherwise do.
- What that buys, and what it does not. The serving door is read-only at the
  server (no ClientWrite through it, whatever the client asks), in the kernel
  (`ro`) and by ownership. The staging door is open to the node role, so
  anything holding the node role's credentials can mount it read-write:
  processes on a node's host network (IMDS is IMDSv2 with a hop limit of 1, so
  ordinary pods cannot reach the instance profile), or anyone able to create a
  PersistentVolume (cluster-scoped) or a pod in the serving namespace that
  names the staging claim. The EFS CSI driver declares no `Ephemeral` volume
  lifecycle mode, so a pod cannot mount EFS inline. Closing the rest needs two
  identities: the GPU node group on a role of its own (its `node_role_arn` is
  a create-only field: the GPU nodes would be replaced), and the staging claim
  in a namespace of its own. Should the EFS CSI node service account ever be
  given Pod Identity or IRSA (the driver's docs suggest it for S3 Files), the
  mounts would present that role instead and be refused until the policy
  names it. The file system policy names the node role by ARN, and a role
  deleted and created again under the same name is locked out until the
  policy is written again (EFS user guide, "Resource-based policy examples");
  Pulumi names the node role with a random suffix, so a new role is a new ARN
  and a new policy.
"""

from __future__ import annotations

# The NFS client actions and their condition keys: EFS user guide, "Using IAM to control access to file
# systems" ("EFS actions for clients", "EFS condition keys for clients"); the same three actions the Service
# Authorization Reference lists for `elasticfilesystem`, and the AWS managed client policies grant
# (AmazonElasticFileSystemClientFullAccess). They are permissions, not API operations, so botocore's efs
# model has none of them (the tests check that, and that every other action the stack names is one of its
# operations).
CLIENT_MOUNT = "elasticfilesystem:ClientMount"  # read-only access
CLIENT_WRITE = "elasticfilesystem:ClientWrite"
CLIENT_ROOT_ACCESS = "elasticfilesystem:ClientRootAccess"
CLIENT_ACTIONS = (CLIENT_MOUNT, CLIENT_WRITE, CLIENT_ROOT_ACCESS)
SECURE_TRANSPORT = "aws:SecureTransport"
ACCESSED_VIA_MOUNT_TARGET = "elasticfilesystem:AccessedViaMountTarget"
ACCESS_POINT_ARN = "elasticfilesystem:AccessPointArn"
# The serving access point exposes the file system's root (module doc: why not the checkpoint's directory).
ACCESS_POINT_ROOT = "/"
# The serving access point's POSIX user: `nobody`, which owns nothing on the volume; its secondary group is
# the staging user's group, the checkpoint's group.
READER_UID = 65534


def file_system_policy(file_system_arn: str, mount_role_arn: str, serving_access_point_arn: str, staging_access_point_arn: str) -> dict:
    """The EFS file system policy (module doc): TLS always, the two access points only, reads through the
    serving one, writes through the staging one, root through none, for the nodes' role over a mount target."""
    via_mount_target = {"Bool": {ACCESSED_VIA_MOUNT_TARGET: "true"}}
    both = sorted([serving_access_point_arn, staging_access_point_arn])
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "DenyWithoutTls",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": "*",
                "Resource": file_system_arn,
                "Condition": {"Bool": {SECURE_TRANSPORT: "false"}},
            },
            {
                "Sid": "DenyOutsideTheAccessPoints",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": list(CLIENT_ACTIONS),
                "Resource": file_system_arn,
                "Condition": {"StringNotEquals": {ACCESS_POINT_ARN: both}},
            },
            {
                "Sid": "DenyWritesOutsideStaging",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": [CLIENT_WRITE],
                "Resource": file_system_arn,
                "Condition": {"StringNotEquals": {ACCESS_POINT_ARN: staging_access_point_arn}},
            },
            {
                # Both access points enforce a non-root identity (module doc): no mount needs root.
                "Sid": "DenyRootAccess",
                "Effect": "Deny",
                "Principal": {"AWS": "*"},
                "Action": [CLIENT_ROOT_ACCESS],
                "Resource": file_system_arn,
            },
            {
                "Sid": "ServingReads",
                "Effect": "Allow",
                "Principal": {"AWS": mount_role_arn},
                "Action": [CLIENT_MOUNT],
                "Resource": file_system_arn,
                "Condition": {**via_mount_target, "StringEquals": {ACCESS_POINT_ARN: serving_access_point_arn}},
            },
            {
                "Sid": "StagingWrites",
                "Effect": "Allow",
                "Principal": {"AWS": mount_role_arn},
                "Action": [CLIENT_MOUNT, CLIENT_WRITE],
                "Resource": file_system_arn,
                "Condition": {**via_mount_target, "StringEquals": {ACCESS_POINT_ARN: staging_access_point_arn}},
            },
        ],
    }
