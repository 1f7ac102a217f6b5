"""Weight staging: the Job that fills the model-weight volume, and where the weights live.

Pure: no Pulumi, no cloud. `components/storage.py` turns these pieces into
Kubernetes objects. The program the Job runs is `infra/k8s/scripts/stage_weights.py`
(what it does: its docstring), shipped in a ConfigMap (`staging_config_map`) and
run as `python3 /opt/gpu-serving/stage_weights.py --source ... --dest ...`; the
tests run that file for real on local directories. The serving pods wait for
its completion marker with `infra/k8s/scripts/wait_for_weights.sh`.

The Job retries (each retry resumes the partial downloads) within one deadline
for all of them, and fails at once when the program reports a source that
cannot be listed. After the deadline a new Job (a new generation in its name,
`gpu-serving:storage.stagingRun`) resumes where the failed one stopped.

The image is built from `images/staging/` (Python with huggingface_hub, boto3
and their dependencies, every wheel's hash pinned, installed at build time) and
pushed to the stack's ECR repository by `bin/build-image`, at a tag derived from
what it is built from (`staging_image_tag`); nothing is installed when the Job
runs. The program runs as an unprivileged user (`STAGING_UID`), and how it comes
to own the checkpoint's directory depends on the file system
(`efs_staging_root`):

- EFS: the volume it mounts read-write is the staging claim (components/storage.py),
  through the staging access point, the only way in that may write. That access
  point's root directory is the checkpoint's own directory (`efs_staging_root`:
  `/<org>/<name>`, or its first four levels), it enforces the POSIX identity
  `STAGING_UID:STAGING_UID`, and it creates its root directory owned by that
  identity, mode 0755 (`root_directory.creation_info`), when a client first
  mounts it and the directory does not exist (EFS user guide, "Creating the root
  directory for an access point": "If the root directory configured on the access
  point already exists before mount time, the existing permissions aren't
  overwritten"). So the pod mounts the checkpoint's directory itself, owned by the
  user it runs as: no init container, no root, no capability, Pod Security
  `restricted`. A stack staged before this (the root init container chowned
  `/<org>/<name>` to `STAGING_UID`, recursively) keeps that directory as it is, its
  owner already the staging user's: nothing is fetched again.
- FSx for Lustre has no access points: the pod mounts the whole file system,
  whose root directory is root's (mode 0755), and an init container (root,
  CAP_CHOWN only) first creates the checkpoint's directory and hands it to
  `STAGING_UID` (`staging_owner.sh`). The FSx CSI driver would not let the
  kubelet do it instead: its CSIDriver declares `fsGroupPolicy:
  ReadWriteOnceWithFSType` (aws-fsx-csi-driver v1.7.0, the add-on the stack
  pins: charts/aws-fsx-csi-driver/values.yaml, deploy/kubernetes/base/csidriver.yaml),
  under which the kubelet applies a pod's fsGroup only to a ReadWriteOnce volume
  with an fsType, and the staging volume is ReadWriteMany without one.

Security contexts: infra/k8s/pod_security.py; what the pod may reach:
infra/k8s/network_policies.py (`staging_policy`).
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
from pathlib import Path
from typing import Any, Optional

from infra.errors import UserError
from infra.k8s import pod_security, script_files
from infra.k8s.scheduling import system_node_selector
from infra.k8s.scripts import stage_weights
from infra.planning.cold_start_cost import STAGING_MIN_BYTES_PER_S


VOLUME_NAME = "model-weights"
STAGING_SCRIPT = "stage_weights.py"
OWNER_SCRIPT = "staging_owner.sh"  # FSx: the init container that hands the checkpoint's directory to STAGING_UID
# The staging ConfigMap's scripts: the program and, on FSx, its init container's (the pod runs nothing else).
STAGING_SCRIPTS = (STAGING_SCRIPT, OWNER_SCRIPT)
EFS_STAGING_SCRIPTS = (STAGING_SCRIPT,)
# The program's user: not root (images/staging/Dockerfile's USER, and the pod's runAsUser); on EFS also the
# identity the staging access point enforces and creates its root directory for.
STAGING_UID = pod_security.NONROOT_UID
# The mode EFS gives the staging access point's root directory when it creates it: the owner writes, everyone
# else (the serving access point's `nobody`) enters and reads. EFS CreationInfo `Permissions` (botocore efs
# model: pattern ^[0-7]{3,4}$).
EFS_STAGING_ROOT_MODE = "0755"
# An access point's root directory: at most four levels below `/` and 100 characters, each level not starting
# with "." nor holding one of $#<>;`|&?{}^* (botocore efs model, shape `Path`; EFS user guide, "Enforcing a root
# directory with an access point").
EFS_ROOT_MAX_LEVELS = 4
EFS_ROOT_MAX_CHARS = 100
_EFS_PATH_LEVEL = re.compile(r"^(?!\.)[^$#<>;`|&?{}^*/\n]+$")

# The staging image (images/staging/: Python and the pinned huggingface_hub and boto3
# with their dependencies, hashes checked, installed when the image is built; nothing
# is installed when the Job runs). bin/build-image pushes it to the stack's ECR
# repository at `staging_image_tag()`.
STAGING_IMAGE_DIR = Path(__file__).resolve().parents[2] / "images" / "staging"
STAGING_IMAGE_FILES = ("Dockerfile", "requirements.txt")

# How long the staging Job may run, all retries included: the checkpoint at the
# slowest download rate we accept (STAGING_MIN_BYTES_PER_S, an ASSUMPTION stated
# where the plan also prices the first `up` with it), and a one-time download may
# take at least six cold starts' worth of time.
STAGING_DEADLINE_COLD_STARTS = 6
# Pod failures the Job retries (each retry resumes where the last one stopped).
# ASSUMPTION: six covers transient hub/S3/network errors; a source that cannot
# be listed fails the Job at once (exit 3), whatever this says.
STAGING_BACKOFF_LIMIT = 6
# What `python -m infra rollout` waits for the Job beyond its deadline (the Job's own
# deadline fails it first; this only keeps rollout from giving up before Kubernetes does).
# `pulumi up` does not wait for the Job (components/storage.py).
STAGING_AWAIT_MARGIN_S = 600

_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_S3_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s]*)?$")


# ---- names and paths ----------------------------------------------------------------


def split_checkpoint(checkpoint: str, source: str) -> tuple[str, Optional[str]]:
    """Validate a checkpoint reference; return (directory under the mount, HF revision or None).

    `hf`: `org/name` or `org/name@revision` (a branch, tag or commit), stored
    under `org/name`. `s3`: `s3://bucket/prefix`, stored under `bucket/prefix`.
    """
    if source == "hf":
        repo, _, revision = checkpoint.partition("@")
        if not _HF_REPO.match(repo) or ".." in repo:
            raise ValueError(f"Hugging Face checkpoint {checkpoint!r} should look like org/name or org/name@revision")
        if "@" in checkpoint and not re.fullmatch(r"[A-Za-z0-9._/-]+", revision):
            raise ValueError(f"Hugging Face revision {revision!r} in {checkpoint!r} is not a branch, tag or commit")
        return repo, (revision or None)
    if source == "s3":
        match = _S3_URL.match(checkpoint)
        if not match:
            raise ValueError(f"S3 checkpoint {checkpoint!r} should look like s3://bucket/prefix")
        bucket, prefix = match.group(1), (match.group(2) or "").strip("/")
        parts = [p for p in prefix.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"S3 checkpoint {checkpoint!r}: '.' and '..' are not allowed in the prefix")
        return "/".join([bucket, *parts]), None
    raise ValueError(f"checkpoint source must be 'hf' or 's3', not {source!r}")


def staged_checkpoint(repo: str, revision: Optional[str], remote_code: bool, production: bool = False) -> str:
    """The Hugging Face checkpoint the Job downloads: `org/name@<commit>` when a commit is pinned
    (`gpu-serving:model.revision`, or the catalog's), so every file comes from that one commit.

    Refused without one when the serving command runs the checkpoint's own code
    (`--trust-remote-code`): that code would be whatever the repository's `main` holds when the Job
    runs; and in production whatever it runs: weights re-pushed to `main` would reach the next
    staging Job unreviewed. A reference that already names its revision is kept as it is.
    """
    if "@" in repo:
        return repo
    if revision:
        return f"{repo}@{revision}"
    if production and not remote_code:
        raise UserError(
            f"a production stack stages only a pinned commit, and no commit of {repo} is pinned (the catalog has none): "
            "set gpu-serving:model.revision to the Hugging Face commit to stage "
            f"(40 hex digits; the 'History' of huggingface.co/{repo} lists them)"
        )
    if remote_code:
        raise UserError(
            f"{repo} is served with --trust-remote-code (its tokenizer or model code runs in the serving pods), and "
            "no commit of it is pinned: set gpu-serving:model.revision to the Hugging Face commit to stage "
            f"(40 hex digits; the 'History' of huggingface.co/{repo} lists them), once its code has been read"
        )
    return repo


def source_url(checkpoint: str, source: str) -> str:
    """What the script's `--source` takes: `hf://org/name[@rev]` or the `s3://` URL itself."""
    split_checkpoint(checkpoint, source)
    return f"hf://{checkpoint}" if source == "hf" else checkpoint.rstrip("/")


def model_path(mount_path: str, checkpoint: str, source: str) -> str:
    """Where the checkpoint lives on the volume (what `vllm serve` is given)."""
    directory, _ = split_checkpoint(checkpoint, source)
    return posixpath.join(mount_path, directory)


def marker_path(mount_path: str, checkpoint: str, source: str) -> str:
    return posixpath.join(model_path(mount_path, checkpoint, source), stage_weights.MARKER_NAME)


def efs_staging_root(checkpoint: str, source: str) -> tuple[str, str]:
    """(the EFS staging access point's root directory, where the checkpoint lives below it).

    The checkpoint's directory itself (`/<org>/<name>`, `/<bucket>/<prefix>`) when an access point may
    have it as its root; else its longest leading part that may (four levels, 100 characters, levels of
    the allowed characters: `EFS_ROOT_MAX_LEVELS`), the rest below it. Never `/`: the bucket or the
    organisation is always one allowed level. The staging Job writes only under this root, which EFS
    creates for `STAGING_UID` (module doc); the serving access point, rooted at `/`, sees the same files
    at `model_path`.
    """
    directory, _ = split_checkpoint(checkpoint, source)
    levels = directory.split("/")
    root: list[str] = []
    for level in levels[:EFS_ROOT_MAX_LEVELS]:
        if not _EFS_PATH_LEVEL.match(level) or len("/" + "/".join([*root, level])) > EFS_ROOT_MAX_CHARS:
            break
        root.append(level)
    if not root:
        raise ValueError(f"checkpoint {checkpoint!r}: its first level {levels[0]!r} cannot be an EFS access point's root directory")
    return "/" + "/".join(root), "/".join(levels[len(root):])


def efs_staging_dest(mount_path: str, checkpoint: str, source: str) -> str:
    """Where the staging program writes on EFS: the staging volume's mount (the access point's root) and what
    lies below it (`efs_staging_root`); the serving pods read the same directory at `model_path`."""
    _, rest = efs_staging_root(checkpoint, source)
    return posixpath.join(mount_path, rest) if rest else mount_path


# ---- the Job's figures --------------------------------------------------------------------


def staging_deadline_s(checkpoint_bytes: int, cold_start_target_s: float) -> int:
    """`activeDeadlineSeconds` of the staging Job (all retries), in whole minutes.

    The longer of: the checkpoint at the slowest download rate we accept, and
    `STAGING_DEADLINE_COLD_STARTS` times the plan's cold-start target.
    """
    download_s = checkpoint_bytes / STAGING_MIN_BYTES_PER_S
    seconds = max(download_s, STAGING_DEADLINE_COLD_STARTS * cold_start_target_s)
    return int(math.ceil(seconds / 60.0)) * 60


def staging_await_timeout_s(deadline_s: int) -> int:
    """How long `python -m infra rollout` waits for the Job to complete (infra/cli/rollout.py)."""
    return deadline_s + STAGING_AWAIT_MARGIN_S


# ---- the program and its command ------------------------------------------------------------


def staging_args(
    source: str, dest: str, workers: int = stage_weights.DEFAULT_WORKERS, excludes: tuple[str, ...] = ()
) -> list[str]:
    """The program's arguments."""
    args = ["--source", source, "--dest", dest, "--workers", str(workers)]
    for pattern in excludes:
        args += ["--exclude", pattern]
    return args


def staging_command() -> list[str]:
    """The container command: `python3 <the mounted program>` (the image carries its clients)."""
    return ["python3", script_files.path(STAGING_SCRIPT)]


def staging_image_tag(image_dir: Path = STAGING_IMAGE_DIR) -> str:
    """The staging image's tag in the stack's repository: the pinned clients' versions and a hash of
    the files it is built from, so a changed pin or Dockerfile is a new tag (the repository's tags
    are immutable) and a new staging Job."""
    texts = {name: (image_dir / name).read_text() for name in STAGING_IMAGE_FILES}
    pins = dict(re.findall(r"^([a-z0-9][a-z0-9.-]*)==(\S+)", texts["requirements.txt"], re.M))
    missing = [p for p in ("huggingface-hub", "boto3") if p not in pins]
    if missing:
        raise ValueError(f"{image_dir / 'requirements.txt'} pins no {', '.join(missing)}")
    digest = hashlib.sha256("\0".join(f"{n}\0{t}" for n, t in sorted(texts.items())).encode()).hexdigest()[:12]
    return f"staging-hub{pins['huggingface-hub']}-boto3-{pins['boto3']}-{digest}"


def staging_scripts(owner_step: bool) -> tuple[str, ...]:
    """The scripts the Job's pod runs: the program, and the init container's on FSx (`owner_step`)."""
    return STAGING_SCRIPTS if owner_step else EFS_STAGING_SCRIPTS


def staging_config_map(name: str, namespace: str, labels: dict[str, str], scripts: tuple[str, ...] = STAGING_SCRIPTS) -> dict[str, Any]:
    """The ConfigMap that carries the program (and, on FSx, the init container's script) to the Job's pod."""
    return script_files.config_map(name, namespace, scripts, labels)


def staging_scripts_hash(scripts: tuple[str, ...] = STAGING_SCRIPTS) -> str:
    """Changes with the program: part of the Job's name and its pod template's annotation."""
    return script_files.content_hash(scripts)


# ---- the Job's manifest pieces ------------------------------------------------------------------


def job_name(prefix: str, *parts: str) -> str:
    """A Job name that changes with what the Job runs (a Job's pod template is immutable).

    A new program, image, checkpoint, destination or generation (`stagingRun`)
    gives a new name, so Pulumi creates a new Job (which resumes: complete
    files are skipped, partial ones continued) instead of failing to patch the
    old one.
    """
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]
    return f"{prefix[: 63 - 9 - 6]}-stage-{digest}"


def owner_container(image: Any, dest: str, mount_path: str) -> dict[str, Any]:
    """FSx's init container: create the checkpoint's directory and hand it to STAGING_UID (staging_owner.sh).

    The Job's one root step, with CAP_CHOWN alone (every other capability
    dropped, no privilege escalation, read-only root file system), and the
    reason an FSx stack's namespace enforces `baseline`, not `restricted`
    (module doc: why kubelet's fsGroup cannot do it there). EFS needs none.
    """
    return {
        "name": "own-dest",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", script_files.path(OWNER_SCRIPT)],
        "args": [dest, f"{STAGING_UID}:{STAGING_UID}"],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": pod_security.container_security_context(("CHOWN",), run_as_user=0),
        "volumeMounts": [{"name": VOLUME_NAME, "mountPath": mount_path}, script_files.volume_mount()],
    }


def staging_pod_spec(
    *,
    image: Any,
    command: list[str],
    args: list[str],
    pvc_name: str,
    mount_path: str,
    dest: str,
    service_account: str,
    hf_token_secret: Optional[str],
    scripts_config_map: str,
    node_selector: Optional[dict[str, str]] = None,
    owner_step: bool = True,
) -> dict[str, Any]:
    """The staging pod: the volume read-write, the program read-only, modest resources, system nodes.

    The program runs as STAGING_UID with no capability, no privilege
    escalation and a read-only root file system (it writes to the volume and
    /tmp); with `owner_step` (FSx), after `owner_container` handed it `dest`
    as root; without (EFS: the access point creates `dest` for STAGING_UID),
    the pod passes Pod Security `restricted`. No service-account token
    is mounted (the program never calls the Kubernetes API; EKS Pod Identity,
    for an S3 source, injects its own token). `image` may be an Output.
    """
    # HF_HOME and HF_HUB_DISABLE_TELEMETRY: huggingface_hub's constants.py (2.4.0, the
    # image's pin); HF_TOKEN is read by the program itself (stage_weights.py, HfSource).
    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf-home"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if hf_token_secret:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": hf_token_secret, "key": "HF_TOKEN", "optional": False}}}
        )
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": service_account,
        "enableServiceLinks": False,
        **pod_security.hardened_pod(STAGING_UID),
        "nodeSelector": dict(node_selector or system_node_selector()),
        "containers": [
            {
                "name": "stage",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": list(command),
                "args": list(args),
                "env": env,
                # Downloads are network- and NFS-bound: one core and a few GiB of
                # buffers are plenty; the limits keep a leak or a spin from hurting the node.
                "resources": {
                    "requests": {"cpu": "1", "memory": "2Gi"},
                    "limits": {"cpu": "2", "memory": "6Gi"},
                },
                "securityContext": pod_security.container_security_context(),
                "volumeMounts": [
                    {"name": VOLUME_NAME, "mountPath": mount_path},
                    {"name": "tmp", "mountPath": "/tmp"},
                    script_files.volume_mount(),
                ],
            }
        ],
        "volumes": [
            {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": pvc_name}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
            script_files.volume(scripts_config_map),
        ],
    }
    if owner_step:
        pod["initContainers"] = [owner_container(image, dest, mount_path)]
    return pod


def staging_job_spec(
    pod_spec: dict[str, Any], *, deadline_s: int, labels: dict[str, str], scripts: tuple[str, ...] = STAGING_SCRIPTS
) -> dict[str, Any]:
    """The Job: retries that resume, one deadline for all of them, final failure on a bad source."""
    return {
        "backoffLimit": STAGING_BACKOFF_LIMIT,
        "activeDeadlineSeconds": deadline_s,
        "podFailurePolicy": {
            "rules": [
                # No such repo/bucket or no access: retrying cannot help.
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "stage", "operator": "In", "values": [stage_weights.EXIT_SOURCE]},
                },
                # A drained or preempted node is not the Job's fault.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": {
            "metadata": {"labels": dict(labels), "annotations": script_files.hash_annotation(scripts)},
            "spec": pod_spec,
        },
    }
