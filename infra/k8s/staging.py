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
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
import shlex
from typing import Any, Optional

from infra.k8s import script_files
from infra.k8s.scheduling import system_node_selector
from infra.k8s.scripts import stage_weights

MiB = 2**20

VOLUME_NAME = "model-weights"
STAGING_SCRIPT = "stage_weights.py"
# The staging ConfigMap's scripts: the program alone (its pod runs nothing else).
STAGING_SCRIPTS = (STAGING_SCRIPT,)

# How long the staging Job may run, all retries included. ASSUMPTION: one pod
# downloads at no less than 100 MiB/s from the Hugging Face hub or S3 (through
# the VPC's S3 gateway endpoint; both usually give several times that), and a
# one-time download may take at least six cold starts' worth of time.
STAGING_MIN_BYTES_PER_S = 100 * MiB
STAGING_DEADLINE_COLD_STARTS = 6
# Pod failures the Job retries (each retry resumes where the last one stopped).
# ASSUMPTION: six covers transient hub/S3/network errors; a source that cannot
# be listed fails the Job at once (exit 3), whatever this says.
STAGING_BACKOFF_LIMIT = 6
# What `pulumi up` waits for the Job beyond its deadline (the Job's own deadline
# fails it first; this only keeps Pulumi from timing out before Kubernetes does).
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
    """How long `pulumi up` waits for the Job to complete."""
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


def staging_command(packages: tuple[str, ...] = ()) -> list[str]:
    """The container command: `python3 <the mounted program>`, after installing pinned packages when asked.

    With `packages` (pinned requirement specs such as `huggingface_hub==0.36.0`)
    they are installed into /tmp at start, so a slim Python image will do; the
    arguments still follow the command (`sh -c` passes them on as "$@").
    """
    program = script_files.path(STAGING_SCRIPT)
    if not packages:
        return ["python3", program]
    install = "python3 -m pip install --no-cache-dir --disable-pip-version-check --quiet --target /tmp/staging-lib " + " ".join(
        shlex.quote(p) for p in packages
    )
    return ["sh", "-c", f'{install} && PYTHONPATH=/tmp/staging-lib exec python3 {shlex.quote(program)} "$@"', "stage"]


def staging_config_map(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap that carries the program to the Job's pod."""
    return script_files.config_map(name, namespace, STAGING_SCRIPTS, labels)


def staging_scripts_hash() -> str:
    """Changes with the program: part of the Job's name and its pod template's annotation."""
    return script_files.content_hash(STAGING_SCRIPTS)


def check_packages(packages: tuple[str, ...]) -> None:
    for spec in packages:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!-]+", spec):
            raise ValueError(f"staging package {spec!r} must be pinned, like huggingface_hub==0.36.0")


# ---- the serving pods' side ---------------------------------------------------------------


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


def staging_pod_spec(
    *,
    image: str,
    command: list[str],
    args: list[str],
    pvc_name: str,
    mount_path: str,
    service_account: str,
    hf_token_secret: Optional[str],
    scripts_config_map: str,
    node_selector: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """The staging pod: the volume read-write, the program read-only, modest resources, system nodes, no special privileges."""
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
    return {
        "restartPolicy": "Never",
        "serviceAccountName": service_account,
        "nodeSelector": dict(node_selector or system_node_selector()),
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "stage",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": list(command),
                "args": list(args),
                "env": env,
                # Downloads are network- and NFS-bound: one core and a few GiB of
                # buffers are plenty; the limit keeps a leak from hurting the node.
                "resources": {
                    "requests": {"cpu": "1", "memory": "2Gi"},
                    "limits": {"memory": "6Gi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
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


def staging_job_spec(pod_spec: dict[str, Any], *, deadline_s: int, labels: dict[str, str]) -> dict[str, Any]:
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
            "metadata": {"labels": dict(labels), "annotations": script_files.hash_annotation(STAGING_SCRIPTS)},
            "spec": pod_spec,
        },
    }
