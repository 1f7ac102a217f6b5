"""Stages a model checkpoint onto the weights volume (the weight-staging Job runs it).

    python3 stage_weights.py --source URL --dest DIR [--workers N] [--exclude GLOB ...]

Copies a checkpoint into DIR (`<mount>/<checkpoint>`):

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
role on the prefix). It needs `huggingface_hub` for `hf://` and `boto3` for
`s3://`, nothing else; both are imported only when used. Python 3.8+.
"""

import argparse
import concurrent.futures
import datetime
import fnmatch
import importlib
import json
import os
import shutil
import sys
import threading

MARKER_NAME = ".gpu-serving-complete"  # the serving pods wait for it (wait_for_weights.sh)
STAGING_DIR_NAME = ".gpu-serving-staging"
# A file:// source may carry its own listing (name -> size) in this file instead of
# a directory walk: tests use it to play a source whose listing and content disagree.
LISTING_FILE_NAME = ".gpu-serving-listing.json"

EXIT_INCOMPLETE = 1  # some file missing or of the wrong size: retry (resumes)
EXIT_SOURCE = 3  # the source cannot be listed (no repo/bucket, no access): final

DEFAULT_WORKERS = 8
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
        override = os.path.join(self.root, LISTING_FILE_NAME)
        if os.path.exists(override):
            with open(override) as f:
                return {str(k): int(v) for k, v in json.load(f).items()}
        files = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != STAGING_DIR_NAME)
            for name in filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.root).replace(os.sep, "/")
                if rel in (MARKER_NAME, LISTING_FILE_NAME):
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
        if parts[0] in (MARKER_NAME, STAGING_DIR_NAME):
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
    tmp = os.path.join(dest, MARKER_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(dest, MARKER_NAME))


def stage(source, dest, workers, excludes):
    listing = source.listing()
    listing = {rel: size for rel, size in listing.items() if not any(fnmatch.fnmatch(rel, p) for p in excludes)}
    check_names(listing)
    if not listing:
        raise SourceError("the source lists no files")
    os.makedirs(dest, exist_ok=True)
    marker = os.path.join(dest, MARKER_NAME)
    todo = [rel for rel in sorted(listing) if not complete(os.path.join(dest, rel), listing[rel])]
    skipped = len(listing) - len(todo)
    log("%s: %d files, %d bytes; %d complete, %d to fetch" % (source.describe(), len(listing), sum(listing.values()), skipped, len(todo)))
    if todo and os.path.exists(marker):
        os.remove(marker)
        log("removed the old completion marker: files are about to change")
    staging = os.path.join(dest, STAGING_DIR_NAME)

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
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="files downloaded in parallel")
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
