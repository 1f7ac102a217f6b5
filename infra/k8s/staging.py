"""Weight staging: the script that fills the model-weight volume, and the Job around it.

Pure: no Pulumi, no cloud. `components/storage.py` turns these pieces into
Kubernetes objects; the tests run the script for real on local directories.

The script (`staging_script()`, run as `python3 -c <script> --source ... --dest ...`)
copies a checkpoint into `<mount>/<checkpoint>`:

1. lists the source with every file's size: the Hugging Face hub
   (`HfApi.model_info(files_metadata=True)`, pinned to the commit it resolved,
   so every file comes from one snapshot), an S3 prefix (`ListObjectsV2`), or a
   local directory (`file://`, for tests and local runs);
2. skips every file already present with the listed size; downloads the others
   into a staging directory on the same volume (`.gpu-serving-staging/`) and
   moves each into place only when its size matches, so a file at its final
   name is never partial;
3. checks every listed file's size again and only then writes the completion
   marker `<dest>/.gpu-serving-complete` (JSON: source, revision, every file
   and its size, the total), atomically (written aside, then renamed). If
   anything is missing or has the wrong size it exits 1 without a marker (the
   Job retries and resumes); a source that cannot be listed (no such repo or
   bucket, no access, empty prefix) exits 3, which the Job's pod failure policy
   treats as final (retrying cannot help).

When files must be fetched and an old marker exists, the marker is removed
first: the serving pods never see a marker over a half-updated checkpoint.
Files at the destination that the source does not list are left alone.

Credentials: the Hugging Face token comes from the `HF_TOKEN` environment
variable (a Kubernetes Secret); S3 uses boto3's default chain, which in the Job
is EKS Pod Identity (the pod's service account is associated with a read-only
role on the prefix). The script needs `huggingface_hub` for `hf://` and `boto3`
for `s3://`, nothing else; both are imported only when used.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import re
import shlex
from typing import Any, Optional

from infra.k8s.scheduling import system_node_selector

MiB = 2**20

MARKER_NAME = ".gpu-serving-complete"
STAGING_DIR_NAME = ".gpu-serving-staging"
# A file:// source may carry its own listing (name -> size) in this file instead of
# a directory walk: tests use it to play a source whose listing and content disagree.
LISTING_FILE_NAME = ".gpu-serving-listing.json"

EXIT_INCOMPLETE = 1  # some file missing or of the wrong size: retry (resumes)
EXIT_SOURCE = 3  # the source cannot be listed (no repo/bucket, no access): final

DEFAULT_WORKERS = 8
VOLUME_NAME = "model-weights"

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
    return posixpath.join(model_path(mount_path, checkpoint, source), MARKER_NAME)


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


# ---- the script ------------------------------------------------------------------------------

_SCRIPT = r'''
import argparse, concurrent.futures, datetime, fnmatch, importlib, json, os, shutil, sys, threading

MARKER = "@MARKER@"
STAGING = "@STAGING@"
LISTING = "@LISTING@"
EXIT_INCOMPLETE = @EXIT_INCOMPLETE@
EXIT_SOURCE = @EXIT_SOURCE@
CHUNK = 8 * 1024 * 1024
_print_lock = threading.Lock()


def log(msg):
    with _print_lock:
        print("stage: " + msg, flush=True)


class SourceError(Exception):
    """The source cannot be listed: retrying will not help."""


class FileSource:
    """A local directory (tests, local runs)."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.revision = None

    def describe(self):
        return "file://" + self.root

    def listing(self):
        if not os.path.isdir(self.root):
            raise SourceError("no such directory: " + self.root)
        override = os.path.join(self.root, LISTING)
        if os.path.exists(override):
            with open(override) as f:
                return {str(k): int(v) for k, v in json.load(f).items()}
        files = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != STAGING)
            for name in filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.root).replace(os.sep, "/")
                if rel in (MARKER, LISTING):
                    continue
                files[rel] = os.path.getsize(path)
        return files

    def fetch(self, rel, tmp_path):
        with open(os.path.join(self.root, rel), "rb") as src, open(tmp_path, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
        return tmp_path


class HfSource:
    """A Hugging Face hub model repository (token from HF_TOKEN)."""

    def __init__(self, spec):
        self.repo, _, revision = spec.partition("@")
        self.requested = revision or None
        self.revision = None
        self.token = os.environ.get("HF_TOKEN") or None

    def describe(self):
        return "hf://" + self.repo

    def listing(self):
        from huggingface_hub import HfApi

        # Errors that retrying cannot fix (huggingface_hub.errors; .utils in older releases).
        modules = []
        for module_name in ("huggingface_hub.errors", "huggingface_hub.utils"):
            try:
                modules.append(importlib.import_module(module_name))
            except ImportError:
                pass
        errors = tuple(
            {
                getattr(module, name)
                for module in modules
                if module is not None
                for name in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError")
                if hasattr(module, name)
            }
        )
        try:
            info = HfApi(token=self.token).model_info(self.repo, revision=self.requested, files_metadata=True)
        except errors as exc:
            raise SourceError("%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""))
        self.revision = info.sha  # download every file from this one commit
        files = {}
        for sibling in info.siblings or []:
            if sibling.size is None:
                raise SourceError("the hub gave no size for " + sibling.rfilename)
            files[sibling.rfilename] = int(sibling.size)
        return files

    def fetch(self, rel, tmp_path):
        from huggingface_hub import hf_hub_download

        # local_dir: the file lands at <staging>/<rel> (tmp_path), its partial
        # download and lock under <staging>/.cache, all on the weights volume.
        staging_root = tmp_path[: -len(rel)].rstrip("/")
        return hf_hub_download(
            self.repo, rel, revision=self.revision, local_dir=staging_root, token=self.token, force_download=True
        )


class S3Source:
    """An S3 prefix (credentials: boto3's default chain; in the Job, EKS Pod Identity)."""

    def __init__(self, spec):
        bucket, _, prefix = spec.partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.revision = None
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        # Up to 8 files at once, 8 parts each: room for every connection, and patient retries.
        self.client = boto3.client("s3", config=Config(max_pool_connections=64, retries={"max_attempts": 10, "mode": "adaptive"}))
        self.transfer = TransferConfig(multipart_chunksize=64 * 1024 * 1024, max_concurrency=8)

    def describe(self):
        return "s3://%s/%s" % (self.bucket, self.prefix)

    def listing(self):
        from botocore.exceptions import ClientError

        files = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if key.endswith("/"):
                        continue  # a "folder" placeholder
                    files[key[len(self.prefix):]] = int(obj["Size"])
        except ClientError as exc:
            raise SourceError(str(exc))
        if not files:
            raise SourceError("no objects under " + self.describe())
        return files

    def fetch(self, rel, tmp_path):
        self.client.download_file(self.bucket, self.prefix + rel, tmp_path, Config=self.transfer)
        return tmp_path


def make_source(url):
    if url.startswith("file://"):
        return FileSource(url[len("file://"):])
    if url.startswith("hf://"):
        return HfSource(url[len("hf://"):])
    if url.startswith("s3://"):
        return S3Source(url[len("s3://"):])
    raise SourceError("unsupported source " + url)


def check_names(listing):
    for rel in listing:
        parts = rel.split("/")
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise SourceError("unsafe file name in the listing: %r" % rel)
        if parts[0] in (MARKER, STAGING):
            raise SourceError("the listing names a file the stager owns: %r" % rel)


def complete(path, size):
    try:
        return os.path.isfile(path) and os.path.getsize(path) == size
    except OSError:
        return False


def write_marker(dest, source, listing):
    doc = {
        "source": source.describe(),
        "revision": source.revision,
        "files": {rel: listing[rel] for rel in sorted(listing)},
        "file_count": len(listing),
        "total_bytes": sum(listing.values()),
        "completed_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    tmp = os.path.join(dest, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(dest, MARKER))


def stage(source, dest, workers, excludes):
    listing = source.listing()
    listing = {rel: size for rel, size in listing.items() if not any(fnmatch.fnmatch(rel, p) for p in excludes)}
    check_names(listing)
    if not listing:
        raise SourceError("the source lists no files")
    os.makedirs(dest, exist_ok=True)
    marker = os.path.join(dest, MARKER)
    todo = [rel for rel in sorted(listing) if not complete(os.path.join(dest, rel), listing[rel])]
    skipped = len(listing) - len(todo)
    log("%s: %d files, %d bytes; %d complete, %d to fetch" % (source.describe(), len(listing), sum(listing.values()), skipped, len(todo)))
    if todo and os.path.exists(marker):
        os.remove(marker)
        log("removed the old completion marker: files are about to change")
    staging = os.path.join(dest, STAGING)

    def fetch(rel):
        size = listing[rel]
        tmp = os.path.join(staging, rel)
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        if os.path.exists(tmp):
            os.remove(tmp)
        got_path = source.fetch(rel, tmp)
        got = os.path.getsize(got_path)
        if got != size:
            os.remove(got_path)
            raise ValueError("size mismatch after download: %s has %d bytes, the source lists %d" % (rel, got, size))
        final = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(got_path, final)
        log("fetched %s (%d bytes)" % (rel, size))

    failed = []
    if todo:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = {pool.submit(fetch, rel): rel for rel in todo}
            for future in concurrent.futures.as_completed(futures):
                exc = future.exception()
                if exc is not None:
                    failed.append(futures[future])
                    log("FAILED %s: %s" % (futures[future], exc))
    fetched = len(todo) - len(failed)
    bad = [rel for rel in sorted(listing) if not complete(os.path.join(dest, rel), listing[rel])]
    log("summary: files=%d fetched=%d skipped=%d failed=%d bad=%d" % (len(listing), fetched, skipped, len(failed), len(bad)))
    if bad:
        for rel in bad[:20]:
            path = os.path.join(dest, rel)
            have = os.path.getsize(path) if os.path.isfile(path) else None
            log("incomplete: %s has %s bytes, the source lists %d" % (rel, have, listing[rel]))
        log("no completion marker written")
        return EXIT_INCOMPLETE
    write_marker(dest, source, listing)
    shutil.rmtree(staging, ignore_errors=True)
    log("complete: wrote " + marker)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="Stage a model checkpoint onto the weights volume.")
    parser.add_argument("--source", required=True, help="hf://org/name[@revision], s3://bucket/prefix or file:///dir")
    parser.add_argument("--dest", required=True, help="directory on the weights volume")
    parser.add_argument("--workers", type=int, default=8, help="files downloaded in parallel")
    parser.add_argument("--exclude", action="append", default=[], help="glob of source files to leave out")
    args = parser.parse_args(argv)
    try:
        source = make_source(args.source)
        return stage(source, args.dest, args.workers, args.exclude)
    except SourceError as exc:
        log("cannot use the source: %s" % exc)
        return EXIT_SOURCE
    except ImportError as exc:
        log("this image lacks the client for %s: %s" % (args.source.split(":", 1)[0], exc))
        return EXIT_SOURCE


if __name__ == "__main__":
    sys.exit(main())
'''


def staging_script() -> str:
    """The staging script's Python source (runs on Python 3.8+, stdlib plus the source's client)."""
    return (
        _SCRIPT.replace("@MARKER@", MARKER_NAME)
        .replace("@STAGING@", STAGING_DIR_NAME)
        .replace("@LISTING@", LISTING_FILE_NAME)
        .replace("@EXIT_INCOMPLETE@", str(EXIT_INCOMPLETE))
        .replace("@EXIT_SOURCE@", str(EXIT_SOURCE))
        .lstrip("\n")
    )


def staging_args(source: str, dest: str, workers: int = DEFAULT_WORKERS, excludes: tuple[str, ...] = ()) -> list[str]:
    """The script's arguments."""
    args = ["--source", source, "--dest", dest, "--workers", str(workers)]
    for pattern in excludes:
        args += ["--exclude", pattern]
    return args


def staging_command(packages: tuple[str, ...] = ()) -> list[str]:
    """The container command: `python3 -c <script>`, after installing pinned packages when asked.

    With `packages` (pinned requirement specs such as `huggingface_hub==0.36.0`)
    they are installed into /tmp at start, so a slim Python image will do; the
    arguments still follow the command (`sh -c` passes them on as "$@").
    """
    script = staging_script()
    if not packages:
        return ["python3", "-c", script]
    install = "python3 -m pip install --no-cache-dir --disable-pip-version-check --quiet --target /tmp/staging-lib " + " ".join(
        shlex.quote(p) for p in packages
    )
    return ["sh", "-c", f'{install} && PYTHONPATH=/tmp/staging-lib exec python3 -c "$STAGING_SCRIPT" "$@"', "stage"]


def check_packages(packages: tuple[str, ...]) -> None:
    for spec in packages:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!-]+", spec):
            raise ValueError(f"staging package {spec!r} must be pinned, like huggingface_hub==0.36.0")


# ---- the serving pods' side ---------------------------------------------------------------

_WAIT = (
    'marker="$0"; timeout="$1"; interval="$2"; waited=0; '
    'while [ ! -f "$marker" ]; do '
    'if [ "$timeout" -gt 0 ] && [ "$waited" -ge "$timeout" ]; then '
    'echo "model weights not staged after ${waited}s: no $marker" >&2; exit 1; fi; '
    'echo "waiting for the model weights: $marker"; sleep "$interval"; waited=$((waited + interval)); '
    "done; "
    'echo "model weights ready: $marker"'
)


def wait_for_weights_command(marker: str, timeout_s: int = 0, interval_s: int = 10) -> list[str]:
    """An init container's command that waits for the staging Job's completion marker.

    POSIX `sh` only (any image has it). Exits 0 once the marker exists; with
    `timeout_s` > 0 it gives up after that long and exits 1 (the pod then
    restarts and waits again), 0 waits for ever.
    """
    if timeout_s < 0 or interval_s < 1:
        raise ValueError("timeout_s must be >= 0 and interval_s >= 1")
    return ["sh", "-c", _WAIT, marker, str(int(timeout_s)), str(int(interval_s))]


def weights_volume(pvc_name: str, mount_path: str = "/models", volume_name: str = VOLUME_NAME) -> dict[str, dict[str, Any]]:
    """The pod volume and the read-only mount a serving pod uses (Kubernetes field names).

    `{"volume": {...}, "volume_mount": {...}}`: put the first in
    `spec.volumes` and the second in each container's `volumeMounts`.
    """
    return {
        "volume": {"name": volume_name, "persistentVolumeClaim": {"claimName": pvc_name, "readOnly": True}},
        "volume_mount": {"name": volume_name, "mountPath": mount_path, "readOnly": True},
    }


# ---- the Job's manifest pieces ------------------------------------------------------------------


def job_name(prefix: str, *parts: str) -> str:
    """A Job name that changes with what the Job runs (a Job's pod template is immutable).

    A new script, image, checkpoint or destination gives a new name, so Pulumi
    creates a new Job (which resumes: complete files are skipped) instead of
    failing to patch the old one.
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
    packages: tuple[str, ...] = (),
    node_selector: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """The staging pod: the volume read-write, modest resources, system nodes, no special privileges."""
    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf-home"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    ]
    if packages:
        env.append({"name": "STAGING_SCRIPT", "value": staging_script()})
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
                ],
            }
        ],
        "volumes": [
            {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": pvc_name}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
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
                {"action": "FailJob", "onExitCodes": {"containerName": "stage", "operator": "In", "values": [EXIT_SOURCE]}},
                # A drained or preempted node is not the Job's fault.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
