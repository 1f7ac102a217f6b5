"""Stages a model checkpoint onto the weights volume (the weight-staging Job runs it).

    python3 stage_weights.py --source URL --dest DIR [--workers N] [--exclude GLOB ...] [--progress-interval S]

Copies a checkpoint into DIR (`<mount>/<checkpoint>`):

1. lists the source with every file's size and version: the Hugging Face hub
   (`HfApi.model_info(files_metadata=True)`, pinned to the commit it resolved,
   so every file comes from one snapshot; LFS files carry their sha256), an S3
   prefix (`ListObjectsV2`, with each object's ETag), or a local directory
   (`file://`, for tests and local runs);
2. skips every file already present with the listed size; downloads the others
   into a staging directory on the same volume (`.gpu-serving-staging/`), each
   into `<file>.partial` with a small `<file>.partial.json` naming the version it
   belongs to, and moves each into place only when it has the listed size (and,
   when it was resumed and the listing gives one, the listed sha256), so a file
   at its final name is never partial;
3. checks every listed file's size again and only then writes the completion
   marker `<dest>/.gpu-serving-complete` (JSON: source, revision, every file
   and its size, the total), atomically (written aside, then renamed). If
   anything is missing or has the wrong size it exits 1 without a marker (the
   Job retries and resumes); a source that cannot be listed (no such repo or
   bucket, no access, empty prefix) exits 3, which the Job's pod failure policy
   treats as final (retrying cannot help).

Resuming is the program's own, not the client library's: huggingface_hub 1.18
and later (vLLM 0.34 needs >= 2.0) download into a per-process temporary file
that is deleted on failure, so a restarted pod would fetch every in-flight
shard again. Here a partial file survives its process; the next run (a retry
of the Job's pod, or a new Job) asks for the missing bytes only: an HTTP
`Range` request through huggingface_hub's `http_get(resume_size=...)`, a ranged
S3 `GetObject` pinned to the listed ETag (`IfMatch`), a seek for `file://`. A
partial of another version (the sidecar disagrees with the listing), one longer
than the file, or a resumed file whose sha256 disagrees is thrown away and
fetched again. A transfer that breaks is retried in-process (`ATTEMPTS`), each
time from where it stopped.

Progress: once the source is listed, every `--progress-interval` seconds while
files are fetched, and once more when the run ends, the program prints a line
`PROGRESS_PREFIX` + one JSON object: `bytes_done`/`bytes_total` (complete
files, resumed partials and what this run transferred, of the listing's
total), `files_done`/`files_total`, `rate_bytes_per_s` (this run's transfers
over the time since they started), `eta_s` (what is left at that rate, null
until something moved), `elapsed_s` and `state` (`running`, then `complete` or
`incomplete`; the last line counts only complete files). `python -m infra
rollout` reads the newest one from the pod's log (infra/cli/rollout.py).

When files must be fetched and an old marker exists, the marker is removed
first: the serving pods never see a marker over a half-updated checkpoint.
Files at the destination that the source does not list are left alone.

Permissions: the program sets its umask to `UMASK` (022) before it writes, so
every file it stages is mode 0644 and every directory 0755 whatever the
runtime's default (runc's is the same, 0022, when the OCI spec names none):
the serving pods read them as another user (on EFS the serving access point's
`nobody`; infra/aws/efs_access.py). A destination it may not write (on EFS, a
staging access point's root directory that exists and belongs to another user:
EFS only creates it, with the staging user as owner, when it is missing) is
reported as such, exit 1.

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
import hashlib
import importlib
import json
import os
import shutil
import sys
import threading
import time

MARKER_NAME = ".gpu-serving-complete"  # the serving pods wait for it (wait_for_weights.sh)
STAGING_DIR_NAME = ".gpu-serving-staging"
# A file:// source may carry its own listing (name -> size, or name -> {"size": n,
# "sha256": hex}) in this file instead of a directory walk: tests use it to play a
# source whose listing and content disagree.
LISTING_FILE_NAME = ".gpu-serving-listing.json"
PARTIAL_SUFFIX = ".partial"
ATTEMPTS = 3  # transfers of one file per run; each resumes where the last one stopped

EXIT_INCOMPLETE = 1  # some file missing or of the wrong size: retry (resumes)
EXIT_SOURCE = 3  # the source cannot be listed (no repo/bucket, no access): final
UMASK = 0o022  # files 0644, directories 0755: readable by the serving pods' user (module doc, "Permissions")

DEFAULT_WORKERS = 8
# Progress lines (module doc, "Progress"); infra/cli/rollout.py parses them.
PROGRESS_PREFIX = "stage: progress "
PROGRESS_INTERVAL_S = 30.0
CHUNK = 8 * 1024 * 1024
_print_lock = threading.Lock()


def emit(line):
    with _print_lock:
        print(line, flush=True)


def log(msg):
    emit("stage: " + msg)


class SourceError(Exception):
    """The source cannot be listed: retrying will not help."""


class Incomplete(Exception):
    """A file could not be completed in this run; its partial is kept for the next one."""


def entry(size, version=None, sha256=None):
    """One listed file: its size, what identifies its content (a blob id, an ETag), its sha256 if known."""
    return {"size": int(size), "version": version, "sha256": sha256}


def copy_stream(read, out, limit=None):
    """Append `read(n)` chunks to `out` until EOF (or `limit` bytes); returns the bytes copied."""
    copied = 0
    while limit is None or copied < limit:
        chunk = read(CHUNK if limit is None else min(CHUNK, limit - copied))
        if not chunk:
            break
        out.write(chunk)
        copied += len(chunk)
    return copied


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
                doc = json.load(f)
            return {
                str(k): entry(v["size"], sha256=v.get("sha256")) if isinstance(v, dict) else entry(v) for k, v in doc.items()
            }
        files = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != STAGING_DIR_NAME)
            for name in filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.root).replace(os.sep, "/")
                if rel in (MARKER_NAME, LISTING_FILE_NAME):
                    continue
                files[rel] = entry(os.path.getsize(path))
        return files

    def fetch(self, rel, info, out, offset):
        """Append the file's bytes from `offset` on to `out`; returns how many were read."""
        with open(os.path.join(self.root, rel), "rb") as src:
            src.seek(offset)
            return copy_stream(src.read, out)


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
            lfs = getattr(sibling, "lfs", None)
            sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
            files[sibling.rfilename] = entry(sibling.size, sha256 or getattr(sibling, "blob_id", None), sha256)
        return files

    def fetch(self, rel, info, out, offset):
        """The missing bytes over HTTP: `Range: bytes=<offset>-` (huggingface_hub's http_get resumes from resume_size)."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.repo, rel, revision=self.revision)
        meta = get_hf_file_metadata(url, token=self.token)
        headers = build_hf_headers(token=self.token)
        target = url
        # As hf_hub_download does: an LFS blob redirects to a signed CDN URL, which gets no token.
        if getattr(meta, "xet_file_data", None) is None and meta.location and meta.location != url:
            target = meta.location
            if _host(target) != _host(url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        start = out.tell()
        http_get(target, out, resume_size=offset, headers=headers, expected_size=info["size"])
        return out.tell() - start


def _host(url):
    return url.split("://", 1)[-1].split("/", 1)[0].lower()


class S3Source:
    """An S3 prefix (credentials: boto3's default chain; in the Job, EKS Pod Identity)."""

    def __init__(self, spec):
        bucket, _, prefix = spec.partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.revision = None
        import boto3
        from botocore.config import Config

        # Up to 8 files at once, and patient retries.
        self.client = boto3.client("s3", config=Config(max_pool_connections=64, retries={"max_attempts": 10, "mode": "adaptive"}))

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
                    files[key[len(self.prefix):]] = entry(obj["Size"], obj.get("ETag"))
        except ClientError as exc:
            raise SourceError(str(exc))
        if not files:
            raise SourceError("no objects under " + self.describe())
        return files

    def fetch(self, rel, info, out, offset):
        """A ranged GET of the listed object version (IfMatch: a changed object fails instead of mixing)."""
        if offset >= info["size"]:
            return 0
        kwargs = {"Bucket": self.bucket, "Key": self.prefix + rel, "Range": "bytes=%d-" % offset}
        if info.get("version"):
            kwargs["IfMatch"] = info["version"]
        body = self.client.get_object(**kwargs)["Body"]
        try:
            return copy_stream(body.read, out)
        finally:
            body.close()


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


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _discard(*paths):
    for path in paths:
        if os.path.exists(path):
            os.remove(path)


def resume_offset(partial, sidecar, info):
    """Bytes of `partial` the next transfer may keep: 0 unless it belongs to the listed version and is not too long."""
    want = {"size": info["size"], "version": info.get("version"), "sha256": info.get("sha256")}
    offset = 0
    if os.path.isfile(partial) and os.path.isfile(sidecar):
        try:
            with open(sidecar) as f:
                same = json.load(f) == want
        except ValueError:
            same = False
        if same and os.path.getsize(partial) <= info["size"]:
            offset = os.path.getsize(partial)
    if offset == 0:
        _discard(partial, sidecar)
        with open(sidecar, "w") as f:
            json.dump(want, f, sort_keys=True)
    return offset


class _Tallied:
    """The partial file as a source writes to it: every write is tallied as it lands, so progress
    lines move during a multi-gigabyte shard, not only when it ends. Everything else is the file's."""

    def __init__(self, out, tally):
        self.out, self.tally, self.count = out, tally, 0

    def write(self, data):
        written = self.out.write(data)
        n = len(data) if written is None else written
        self.count += n
        self.tally(n)
        return written

    def __getattr__(self, name):
        return getattr(self.out, name)


def fetch_file(source, rel, info, staging, dest, tally=lambda n: None, kept=lambda n: None):
    """Complete one file from its partial; returns (bytes transferred, offset it resumed at).

    `tally(n)` hears of every transfer, also those of a file that ends incomplete;
    `kept(n)` of the bytes a partial from an earlier run already holds."""
    size = info["size"]
    partial = os.path.join(staging, rel + PARTIAL_SUFFIX)
    sidecar = partial + ".json"
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    resumed_at = offset = resume_offset(partial, sidecar, info)
    kept(resumed_at)
    transferred = 0
    for attempt in range(1, ATTEMPTS + 1):
        if offset >= size:
            break
        try:
            with open(partial, "ab") as out:
                start = out.tell()
                counted = _Tallied(out, tally)
                try:
                    source.fetch(rel, info, counted, offset)
                finally:
                    out.flush()
                    moved = max(out.tell() - start, 0)
                    transferred += moved
                    tally(moved - counted.count)  # what reached the file by another way than write()
        except Exception as exc:  # a broken transfer: resume from what arrived
            if attempt == ATTEMPTS:
                raise Incomplete("%s: %s (%d of %d bytes kept for the next run)" % (rel, exc, os.path.getsize(partial), size))
            log("transfer of %s broke (%s); resuming (attempt %d of %d)" % (rel, exc, attempt + 1, ATTEMPTS))
        new_offset = os.path.getsize(partial)
        if new_offset == offset:
            break  # the source has nothing more to give
        offset = new_offset
    got = os.path.getsize(partial)
    if got > size:
        _discard(partial, sidecar)
        raise ValueError("size mismatch after download: %s has %d bytes, the source lists %d" % (rel, got, size))
    if got < size:
        raise Incomplete("%s has %d of %d bytes after download (kept; the next run resumes)" % (rel, got, size))
    if resumed_at and info.get("sha256") and sha256_of(partial) != info["sha256"]:
        _discard(partial, sidecar)
        raise ValueError("sha256 mismatch after resuming %s: fetched again on the next run" % rel)
    final = os.path.join(dest, rel)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    os.replace(partial, final)
    _discard(sidecar)
    return transferred, resumed_at


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


class Progress:
    """What a run has done, for the progress lines (module doc, "Progress"). Thread-safe."""

    def __init__(self, sizes, complete_files, clock=time.monotonic):
        self.clock = clock
        self.started = clock()
        self.lock = threading.Lock()
        self.bytes_total = sum(sizes.values())
        self.files_total = len(sizes)
        self.bytes_done = sum(sizes[rel] for rel in complete_files)
        self.files_done = len(complete_files)
        self.transferred = 0

    def kept(self, n):
        with self.lock:
            self.bytes_done += n

    def moved(self, n):
        with self.lock:
            self.bytes_done += n
            self.transferred += n

    def file_done(self):
        with self.lock:
            self.files_done += 1

    def line(self, state):
        with self.lock:
            elapsed = max(self.clock() - self.started, 1e-9)
            rate = self.transferred / elapsed
            left = max(self.bytes_total - self.bytes_done, 0)
            doc = {
                "state": state,
                "bytes_done": self.bytes_done,
                "bytes_total": self.bytes_total,
                "files_done": self.files_done,
                "files_total": self.files_total,
                "rate_bytes_per_s": round(rate),
                "eta_s": round(left / rate) if rate > 0 else (0 if left == 0 else None),
                "elapsed_s": round(elapsed, 1),
            }
        return PROGRESS_PREFIX + json.dumps(doc, sort_keys=True)


def _report_every(progress, interval_s, stop):
    """Print a progress line every `interval_s` until `stop` is set (a daemon thread's loop)."""
    while not stop.wait(interval_s):
        emit(progress.line("running"))


def stage(source, dest, workers, excludes, progress_interval_s=PROGRESS_INTERVAL_S):
    listing = source.listing()
    listing = {rel: info for rel, info in listing.items() if not any(fnmatch.fnmatch(rel, p) for p in excludes)}
    check_names(listing)
    if not listing:
        raise SourceError("the source lists no files")
    sizes = {rel: info["size"] for rel, info in listing.items()}
    os.makedirs(dest, exist_ok=True)
    marker = os.path.join(dest, MARKER_NAME)
    todo = [rel for rel in sorted(listing) if not complete(os.path.join(dest, rel), sizes[rel])]
    skipped = len(listing) - len(todo)
    log("%s: %d files, %d bytes; %d complete, %d to fetch" % (source.describe(), len(listing), sum(sizes.values()), skipped, len(todo)))
    if todo and os.path.exists(marker):
        os.remove(marker)
        log("removed the old completion marker: files are about to change")
    staging = os.path.join(dest, STAGING_DIR_NAME)
    moved = {"bytes": 0, "resumed": 0}
    lock = threading.Lock()
    pending = set(todo)
    progress = Progress(sizes, [rel for rel in listing if rel not in pending])
    emit(progress.line("running"))

    def tally(n):
        with lock:
            moved["bytes"] += n
        progress.moved(n)

    def fetch(rel):
        transferred, resumed_at = fetch_file(source, rel, listing[rel], staging, dest, tally, progress.kept)
        progress.file_done()
        with lock:
            moved["resumed"] += 1 if resumed_at else 0
        how = " (resumed at byte %d)" % resumed_at if resumed_at else ""
        log("fetched %s (%d bytes, %d transferred)%s" % (rel, sizes[rel], transferred, how))

    failed = []
    if todo:
        stop = threading.Event()
        reporter = threading.Thread(target=_report_every, args=(progress, progress_interval_s, stop), daemon=True)
        reporter.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                futures = {pool.submit(fetch, rel): rel for rel in todo}
                for future in concurrent.futures.as_completed(futures):
                    exc = future.exception()
                    if exc is not None:
                        failed.append(futures[future])
                        log("FAILED %s: %s" % (futures[future], exc))
        finally:
            stop.set()
            reporter.join()
    fetched = len(todo) - len(failed)
    bad = [rel for rel in sorted(listing) if not complete(os.path.join(dest, rel), sizes[rel])]
    # The last line counts what is at its final name, whatever the run's tallies said.
    progress.files_done = len(listing) - len(bad)
    missing = set(bad)
    progress.bytes_done = sum(sizes[rel] for rel in listing if rel not in missing)
    log(
        "summary: files=%d fetched=%d skipped=%d failed=%d bad=%d resumed=%d transferred=%d"
        % (len(listing), fetched, skipped, len(failed), len(bad), moved["resumed"], moved["bytes"])
    )
    if bad:
        for rel in bad[:20]:
            path = os.path.join(dest, rel)
            have = os.path.getsize(path) if os.path.isfile(path) else None
            log("incomplete: %s has %s bytes, the source lists %d" % (rel, have, sizes[rel]))
        log("no completion marker written")
        emit(progress.line("incomplete"))
        return EXIT_INCOMPLETE
    write_marker(dest, source, sizes)
    shutil.rmtree(staging, ignore_errors=True)
    log("complete: wrote " + marker)
    emit(progress.line("complete"))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="Stage a model checkpoint onto the weights volume.")
    parser.add_argument("--source", required=True, help="hf://org/name[@revision], s3://bucket/prefix or file:///dir")
    parser.add_argument("--dest", required=True, help="directory on the weights volume")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="files downloaded in parallel")
    parser.add_argument("--exclude", action="append", default=[], help="glob of source files to leave out")
    parser.add_argument("--progress-interval", type=float, default=PROGRESS_INTERVAL_S, help="seconds between progress lines")
    args = parser.parse_args(argv)
    if not args.progress_interval > 0:
        parser.error("--progress-interval must be positive")
    os.umask(UMASK)
    try:
        source = make_source(args.source)
        return stage(source, args.dest, args.workers, args.exclude, args.progress_interval)
    except PermissionError as exc:
        log("cannot write the destination %s: %s (uid %d); on EFS the staging access point's root directory must "
            "belong to the staging user" % (args.dest, exc, os.getuid()))
        return EXIT_INCOMPLETE
    except SourceError as exc:
        log("cannot use the source: %s" % exc)
        return EXIT_SOURCE
    except ImportError as exc:
        log("this image lacks the client for %s: %s" % (args.source.split(":", 1)[0], exc))
        return EXIT_SOURCE


if __name__ == "__main__":
    sys.exit(main())
