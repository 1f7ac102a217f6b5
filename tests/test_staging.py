"""The weight-staging program and the serving pods' wait, run for real.

`infra/k8s/scripts/stage_weights.py` runs as a subprocess with the Job's own
command and arguments (the mounted scripts folder mapped to the source folder),
against a fake checkpoint in a temporary directory; `wait_for_weights.sh` runs
under `sh`. Nothing is mocked: files are copied, sizes checked, markers written.
"""

from __future__ import annotations

import json
import re
import os
from http.server import BaseHTTPRequestHandler
import subprocess
import sys
from pathlib import Path

import pytest

from infra.errors import UserError
from infra.k8s import script_files
from infra.k8s.scripts import stage_weights
from infra.k8s.scripts.stage_weights import EXIT_INCOMPLETE, EXIT_SOURCE, LISTING_FILE_NAME, MARKER_NAME, STAGING_DIR_NAME
from infra.k8s.staging import (
    OWNER_SCRIPT,
    STAGING_IMAGE_DIR,
    STAGING_IMAGE_FILES,
    STAGING_SCRIPT,
    STAGING_UID,
    job_name,
    marker_path,
    model_path,
    source_url,
    split_checkpoint,
    staged_checkpoint,
    staging_args,
    staging_command,
    staging_config_map,
    staging_deadline_s,
    staging_image_tag,
)

FILES = {
    "config.json": b'{"model_type": "deepseek_v4"}\n',
    "tokenizer.json": b"t" * 5000,
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(123_457),
    "sub/dir/extra.bin": b"x" * 10,
}


TOTAL = sum(len(d) for d in FILES.values())


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    for rel, data in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def local(argv: list[str]) -> list[str]:
    """A container's argv run here: the mounted scripts folder is the source folder, python3 this Python."""
    return [sys.executable if a == "python3" else a.replace(script_files.MOUNT_PATH, str(script_files.SCRIPTS_DIR)) for a in argv]


def wait_command(marker: Path, timeout_s: int, interval_s: int) -> list[str]:
    """wait_for_weights.sh, as the serving pods' init container runs it (infra/k8s/raycluster.py)."""
    return ["sh", str(script_files.SCRIPTS_DIR / "wait_for_weights.sh"), str(marker), str(timeout_s), str(interval_s)]


def run_stage(src: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    args = staging_args(f"file://{src}", str(dest), workers=3) + list(extra)
    return subprocess.run(local(staging_command()) + args, capture_output=True, text=True, timeout=120)


def summary(proc: subprocess.CompletedProcess) -> dict[str, int]:
    (line,) = [l for l in proc.stdout.splitlines() if "summary:" in l]
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split("summary:")[1].split())}


def marker(dest: Path) -> dict:
    return json.loads((dest / MARKER_NAME).read_text())


def test_first_run_copies_everything_and_writes_the_marker(source, tmp_path):
    dest = tmp_path / "models" / "org" / "name"
    proc = run_stage(source, dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc) == {"files": 5, "fetched": 5, "skipped": 0, "failed": 0, "bad": 0, "resumed": 0, "transferred": TOTAL}
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
    doc = marker(dest)
    assert doc["files"] == {rel: len(data) for rel, data in FILES.items()}
    assert doc["total_bytes"] == sum(len(d) for d in FILES.values())
    assert doc["file_count"] == len(FILES)
    assert doc["source"] == f"file://{source}"
    assert not (dest / STAGING_DIR_NAME).exists(), "the staging directory is cleaned up"


def test_second_run_skips_complete_files(source, tmp_path):
    dest = tmp_path / "dest"
    assert run_stage(source, dest).returncode == 0
    mtimes = {rel: (dest / rel).stat().st_mtime_ns for rel in FILES}
    inodes = {rel: (dest / rel).stat().st_ino for rel in FILES}
    proc = run_stage(source, dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc) == {"files": 5, "fetched": 0, "skipped": 5, "failed": 0, "bad": 0, "resumed": 0, "transferred": 0}
    assert {rel: (dest / rel).stat().st_mtime_ns for rel in FILES} == mtimes
    assert {rel: (dest / rel).stat().st_ino for rel in FILES} == inodes
    assert (dest / MARKER_NAME).exists()


def test_truncated_file_is_fetched_again(source, tmp_path):
    dest = tmp_path / "dest"
    assert run_stage(source, dest).returncode == 0
    victim = "model-00001-of-00002.safetensors"
    with open(dest / victim, "r+b") as f:
        f.truncate(1000)
    untouched = {rel: (dest / rel).stat().st_mtime_ns for rel in FILES if rel != victim}
    proc = run_stage(source, dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A short file at its final name is not a partial: it is fetched again from the start.
    assert summary(proc) == {"files": 5, "fetched": 1, "skipped": 4, "failed": 0, "bad": 0, "resumed": 0, "transferred": len(FILES[victim])}
    assert f"fetched {victim}" in proc.stdout
    assert (dest / victim).read_bytes() == FILES[victim]
    assert {rel: (dest / rel).stat().st_mtime_ns for rel in untouched} == untouched
    assert marker(dest)["files"][victim] == len(FILES[victim])


def test_missing_file_is_fetched_and_new_source_file_added(source, tmp_path):
    dest = tmp_path / "dest"
    assert run_stage(source, dest).returncode == 0
    (dest / "tokenizer.json").unlink()
    (source / "generation_config.json").write_bytes(b"{}")
    proc = run_stage(source, dest)
    assert proc.returncode == 0
    assert summary(proc)["fetched"] == 2
    assert marker(dest)["files"]["generation_config.json"] == 2


def test_size_mismatch_after_download_fails_without_a_marker(source, tmp_path):
    """A source whose listing and content disagree (a truncated transfer) never gets a marker."""
    dest = tmp_path / "dest"
    listing = {rel: len(data) for rel, data in FILES.items()}
    listing["model-00002-of-00002.safetensors"] += 1  # the listing promises one byte more than arrives
    (source / LISTING_FILE_NAME).write_text(json.dumps(listing))
    proc = run_stage(source, dest)
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    assert summary(proc) == {"files": 5, "fetched": 4, "skipped": 0, "failed": 1, "bad": 1, "resumed": 0, "transferred": TOTAL}
    short = "model-00002-of-00002.safetensors"
    assert f"{short} has {len(FILES[short])} of {len(FILES[short]) + 1} bytes after download (kept; the next run resumes)" in proc.stdout
    assert not (dest / MARKER_NAME).exists()
    assert not (dest / short).exists(), "a bad download never reaches its final name"
    # A listing that promises fewer bytes than arrive: the partial is thrown away.
    listing[short] -= 2
    (source / LISTING_FILE_NAME).write_text(json.dumps(listing))
    proc = run_stage(source, dest)
    assert proc.returncode == EXIT_INCOMPLETE and f"size mismatch after download: {short}" in proc.stdout
    assert not (dest / short).exists() and list((dest / STAGING_DIR_NAME).rglob("*.partial")) == []


BIG = "model-00001-of-00002.safetensors"


def _partial(dest: Path, rel: str) -> Path:
    return dest / STAGING_DIR_NAME / (rel + stage_weights.PARTIAL_SUFFIX)


def _fail_half_way(source: Path, dest: Path, listing: dict) -> subprocess.CompletedProcess:
    """A run that ends with BIG half fetched: the source holds only its first half (a transfer cut off)."""
    (source / LISTING_FILE_NAME).write_text(json.dumps(listing))
    (source / BIG).write_bytes(FILES[BIG][: len(FILES[BIG]) // 2])
    proc = run_stage(source, dest)
    assert proc.returncode == EXIT_INCOMPLETE, proc.stdout + proc.stderr
    assert not (dest / MARKER_NAME).exists() and not (dest / BIG).exists()
    assert _partial(dest, BIG).read_bytes() == FILES[BIG][: len(FILES[BIG]) // 2], "the partial survives its run"
    return proc


def test_a_rerun_after_a_failed_run_fetches_only_the_missing_bytes(source, tmp_path):
    dest = tmp_path / "dest"
    half = len(FILES[BIG]) // 2
    _fail_half_way(source, dest, {rel: len(d) for rel, d in FILES.items()})
    # The source now has the whole file, but its first half changed: a run that fetched it from byte 0
    # again would copy the change, one that resumed keeps what it had.
    (source / BIG).write_bytes(b"Z" * half + FILES[BIG][half:])
    proc = run_stage(source, dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (dest / BIG).read_bytes() == FILES[BIG]
    assert f"fetched {BIG} ({len(FILES[BIG])} bytes, {len(FILES[BIG]) - half} transferred) (resumed at byte {half})" in proc.stdout
    assert summary(proc) == {"files": 5, "fetched": 1, "skipped": 4, "failed": 0, "bad": 0, "resumed": 1, "transferred": len(FILES[BIG]) - half}
    assert marker(dest)["files"][BIG] == len(FILES[BIG]) and not (dest / STAGING_DIR_NAME).exists()


def test_a_resumed_file_whose_sha256_disagrees_is_fetched_again(source, tmp_path):
    import hashlib

    dest = tmp_path / "dest"
    listing = {rel: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in FILES.items()}
    _fail_half_way(source, dest, listing)
    partial = _partial(dest, BIG)
    partial.write_bytes(b"\x00" + partial.read_bytes()[1:])  # the kept half went bad
    (source / BIG).write_bytes(FILES[BIG])
    proc = run_stage(source, dest)
    assert proc.returncode == EXIT_INCOMPLETE and f"sha256 mismatch after resuming {BIG}" in proc.stdout
    assert not partial.exists() and not (dest / BIG).exists()
    proc = run_stage(source, dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (dest / BIG).read_bytes() == FILES[BIG] and summary(proc)["transferred"] == len(FILES[BIG])


def test_a_partial_of_another_version_is_not_resumed(source, tmp_path):
    import hashlib

    dest = tmp_path / "dest"
    old = {rel: {"size": len(d), "sha256": "0" * 64} for rel, d in FILES.items()}
    _fail_half_way(source, dest, old)
    new = {rel: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in FILES.items()}
    (source / LISTING_FILE_NAME).write_text(json.dumps(new))
    (source / BIG).write_bytes(FILES[BIG])
    proc = run_stage(source, dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (dest / BIG).read_bytes() == FILES[BIG]
    assert summary(proc)["resumed"] == 0 and summary(proc)["transferred"] == len(FILES[BIG])


def test_an_old_marker_is_removed_before_files_change(source, tmp_path):
    dest = tmp_path / "dest"
    assert run_stage(source, dest).returncode == 0
    assert (dest / MARKER_NAME).exists()
    # The source changes and its new file cannot be fetched correctly: the old
    # marker must not survive over a checkpoint that is now incomplete.
    (source / "new.bin").write_bytes(b"n" * 100)
    listing = {rel: len(data) for rel, data in FILES.items()} | {"new.bin": 101}
    (source / LISTING_FILE_NAME).write_text(json.dumps(listing))
    proc = run_stage(source, dest)
    assert proc.returncode == EXIT_INCOMPLETE
    assert "removed the old completion marker" in proc.stdout
    assert not (dest / MARKER_NAME).exists()


def test_a_source_that_cannot_be_listed_fails_finally(tmp_path):
    proc = run_stage(tmp_path / "no-such-dir", tmp_path / "dest")
    assert proc.returncode == EXIT_SOURCE
    assert not (tmp_path / "dest" / MARKER_NAME).exists()


def test_unsafe_names_in_a_listing_are_refused(source, tmp_path):
    (source / LISTING_FILE_NAME).write_text(json.dumps({"../escape": 1}))
    proc = run_stage(source, tmp_path / "dest")
    assert proc.returncode == EXIT_SOURCE
    assert not (tmp_path / "escape").exists()


def test_excluded_files_are_not_staged(source, tmp_path):
    dest = tmp_path / "dest"
    proc = run_stage(source, dest, "--exclude", "sub/*")
    assert proc.returncode == 0
    assert not (dest / "sub").exists()
    assert "sub/dir/extra.bin" not in marker(dest)["files"]


def test_the_job_command_runs_the_program_its_config_map_carries(source, tmp_path):
    """The container's command runs a file of the mounted ConfigMap, and that file is the program."""
    command = staging_command()
    assert command[0] == "python3" and command[1].startswith(script_files.MOUNT_PATH + "/")
    data = staging_config_map("w-staging-scripts", "ns", {})["data"]
    assert data[command[1].rsplit("/", 1)[1]] == (script_files.SCRIPTS_DIR / STAGING_SCRIPT).read_text()
    dest = tmp_path / "dest"
    proc = subprocess.run(
        local(command) + staging_args(f"file://{source}", str(dest)), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert (dest / MARKER_NAME).exists()


def test_the_job_installs_nothing_at_run_time():
    """The command runs the mounted program with the image's Python: no pip, no shell in between."""
    assert staging_command() == ["python3", f"{script_files.MOUNT_PATH}/{STAGING_SCRIPT}"]
    assert not any("pip" in part for part in staging_command())


def test_the_owner_step_creates_the_directory_and_hands_it_over(tmp_path):
    """staging_owner.sh, run for real: the checkpoint's directory (and what an earlier Job left in it) changes owner."""
    dest = tmp_path / "models" / "org" / "name"
    (dest / ".gpu-serving-staging").mkdir(parents=True)
    (dest / ".gpu-serving-staging" / "model.safetensors.partial").write_bytes(b"abc")
    uid = STAGING_UID if os.geteuid() == 0 else os.getuid()  # only root may give files away
    gid = STAGING_UID if os.geteuid() == 0 else os.getgid()
    fresh = tmp_path / "models" / "other" / "model"
    for d in (dest, fresh):
        proc = subprocess.run(
            ["sh", str(script_files.SCRIPTS_DIR / OWNER_SCRIPT), str(d), f"{uid}:{gid}"], capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 0, proc.stderr
        assert d.is_dir() and (d.stat().st_uid, d.stat().st_gid) == (uid, gid)
    partial = dest / ".gpu-serving-staging" / "model.safetensors.partial"
    assert (partial.stat().st_uid, partial.stat().st_gid) == (uid, gid)
    assert (tmp_path / "models").stat().st_uid == os.geteuid()  # the volume's root is not touched
    bad = subprocess.run(["sh", str(script_files.SCRIPTS_DIR / OWNER_SCRIPT), str(tmp_path / "x"), "no-such-user"], capture_output=True, timeout=30)
    assert bad.returncode != 0


def test_staged_files_are_readable_by_the_serving_user(source, tmp_path):
    """The program sets umask 022 itself: whatever the runtime's umask (here a tight 077), what it stages is 0644 and
    its directories 0755, so the serving access point's `nobody` (another user, another group) reads them."""
    dest = tmp_path / "models" / "org" / "name"
    args = staging_args(f"file://{source}", str(dest), workers=3)
    proc = subprocess.run(local(staging_command()) + args, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.umask(0o077))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert stage_weights.UMASK == 0o022
    files = [p for p in dest.rglob("*") if p.is_file()]
    dirs = [dest, *(p for p in dest.rglob("*") if p.is_dir())]
    assert {p.relative_to(dest).as_posix() for p in files} == set(FILES) | {MARKER_NAME}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o644"}
    assert {oct(p.stat().st_mode & 0o777) for p in dirs} == {"0o755"}


def test_a_checkpoint_staged_the_old_way_is_complete_through_the_efs_access_point(source, tmp_path):
    """Day two on EFS: the old Job staged into `<mount>/<org>/<name>` (the whole file system mounted); the new one
    mounts that directory itself (the staging access point's root) and writes to the mount: nothing is fetched
    again, and the marker the serving pods wait for is where they look for it."""
    from infra.k8s.staging import efs_staging_dest, marker_path, model_path

    fs_root = tmp_path / "efs"
    checkpoint = "deepseek-ai/DeepSeek-V4-Pro"
    old = run_stage(source, Path(model_path(str(fs_root), checkpoint, "hf")))
    assert old.returncode == 0 and summary(old)["fetched"] == len(FILES)
    access_point_root = fs_root / "deepseek-ai" / "DeepSeek-V4-Pro"  # what the staging pod sees at its mount
    new = run_stage(source, Path(efs_staging_dest(str(access_point_root), checkpoint, "hf")))
    assert new.returncode == 0, new.stdout + new.stderr
    assert summary(new) == {"files": 5, "fetched": 0, "skipped": 5, "failed": 0, "bad": 0, "resumed": 0, "transferred": 0}
    assert Path(marker_path(str(fs_root), checkpoint, "hf")).is_file()


def test_a_destination_it_may_not_write_is_reported(source, tmp_path, monkeypatch, capsys):
    """A staging access point's root that exists and belongs to someone else (EFS creates it for the staging user
    only when it is missing): a clear line, exit 1 (the Job retries; nothing else is wrong)."""
    def refuse(path, *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(stage_weights.os, "makedirs", refuse)
    old_umask = os.umask(0o022)
    try:
        code = stage_weights.main(["--source", f"file://{source}", "--dest", str(tmp_path / "m")])
    finally:
        os.umask(old_umask)
    assert code == EXIT_INCOMPLETE
    assert "cannot write the destination" in capsys.readouterr().out


def test_the_staging_image_pins_every_package_by_hash():
    """images/staging: every requirement is pinned to one version and at least one sha256; the Dockerfile installs
    exactly those at build time, as the user the Job runs as; the tag follows the pins."""
    text = (STAGING_IMAGE_DIR / "requirements.txt").read_text()
    entries = [e for e in text.replace("\\\n", " ").splitlines() if e.strip() and not e.lstrip().startswith("#")]
    pins = {}
    for entry in entries:
        name, rest = entry.split("==", 1)
        version, *hashes = rest.split()
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), entry
        pins[name.strip()] = version
    assert {"huggingface-hub", "boto3", "botocore", "s3transfer"} <= set(pins)
    dockerfile = (STAGING_IMAGE_DIR / "Dockerfile").read_text()
    install = [l for l in dockerfile.replace("\\\n", " ").splitlines() if "pip install" in l and not l.startswith("#")]
    assert len(install) == 1 and all(f in install[0] for f in ("--require-hashes", "--no-deps", "--only-binary=:all:"))
    assert re.search(rf"^USER {STAGING_UID}:{STAGING_UID}$", dockerfile, re.M)
    tag = staging_image_tag()
    assert tag.startswith(f"staging-hub{pins['huggingface-hub']}-boto3-{pins['boto3']}-") and len(tag) <= 128
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag)  # a valid image tag


def test_the_staging_image_tag_changes_with_what_it_is_built_from(tmp_path):
    for name in STAGING_IMAGE_FILES:
        (tmp_path / name).write_text((STAGING_IMAGE_DIR / name).read_text())
    assert staging_image_tag(tmp_path) == staging_image_tag()
    (tmp_path / "Dockerfile").write_text((STAGING_IMAGE_DIR / "Dockerfile").read_text() + "LABEL x=y\n")
    changed = staging_image_tag(tmp_path)
    assert changed != staging_image_tag() and changed.rsplit("-", 1)[0] == staging_image_tag().rsplit("-", 1)[0]
    (tmp_path / "requirements.txt").write_text("boto3==1.0.0 --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(ValueError, match="huggingface-hub"):
        staging_image_tag(tmp_path)


# ---- the serving pods' wait --------------------------------------------------------------------


def test_wait_succeeds_only_when_the_marker_exists(tmp_path):
    path = tmp_path / "org" / "name" / MARKER_NAME
    cmd = wait_command(path, timeout_s=2, interval_s=1)
    missing = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1
    assert "not staged" in missing.stderr
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    present = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert present.returncode == 0
    assert "ready" in present.stdout


def test_wait_picks_up_a_marker_written_while_waiting(tmp_path):
    path = tmp_path / MARKER_NAME
    proc = subprocess.Popen(wait_command(path, timeout_s=20, interval_s=1), stdout=subprocess.PIPE, text=True)
    try:
        import time

        time.sleep(1.5)
        assert proc.poll() is None, "still waiting"
        path.write_text("{}")
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


def test_wait_from_the_staging_script(source, tmp_path):
    """The marker the program writes is the one the wait looks for."""
    mount = tmp_path / "models"
    checkpoint = "deepseek-ai/DeepSeek-V4-Pro"
    dest = model_path(str(mount), checkpoint, "hf")
    cmd = wait_command(Path(marker_path(str(mount), checkpoint, "hf")), timeout_s=1, interval_s=1)
    assert subprocess.run(cmd, capture_output=True, timeout=30).returncode == 1
    assert run_stage(source, Path(dest)).returncode == 0
    assert subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0


# ---- names, paths, figures ------------------------------------------------------------------------


def test_paths_and_source_urls():
    assert split_checkpoint("deepseek-ai/DeepSeek-V4-Pro", "hf") == ("deepseek-ai/DeepSeek-V4-Pro", None)
    assert split_checkpoint("org/m@v1.0", "hf") == ("org/m", "v1.0")
    assert source_url("org/m@abc123", "hf") == "hf://org/m@abc123"
    assert split_checkpoint("s3://bucket/models/ds/", "s3") == ("bucket/models/ds", None)
    assert source_url("s3://bucket/models/ds/", "s3") == "s3://bucket/models/ds"
    assert model_path("/models", "org/m", "hf") == "/models/org/m"
    assert marker_path("/models", "s3://bkt/p", "s3") == f"/models/bkt/p/{MARKER_NAME}"
    for bad, src in [("noslash", "hf"), ("../x/y", "hf"), ("a/b/c", "hf"), ("bucket/p", "s3"), ("s3://b/../x", "s3"), ("x/y", "gcs")]:
        with pytest.raises(ValueError):
            split_checkpoint(bad, src)


def test_deadline_scales_with_checkpoint_and_cold_start():
    prod = staging_deadline_s(864_699_742_328, 600.0)
    assert prod % 60 == 0
    assert prod >= 864_699_742_328 / (100 * 2**20)  # the checkpoint at 100 MiB/s
    assert staging_deadline_s(10**9, 600.0) == 3600  # small checkpoints: six cold starts
    assert staging_deadline_s(2 * 864_699_742_328, 600.0) > prod


def test_job_name_changes_with_what_it_runs():
    a = job_name("model-weights", "script", "image:1", "--source", "hf://a/b")
    assert a == job_name("model-weights", "script", "image:1", "--source", "hf://a/b")
    assert a != job_name("model-weights", "script", "image:2", "--source", "hf://a/b")
    assert a.startswith("model-weights-stage-") and len(a) <= 63
    assert len(job_name("x" * 80, "s")) <= 63


# ---- the S3 and Hugging Face sources --------------------------------------------------------------


def test_s3_source_against_moto(tmp_path, monkeypatch, capsys):
    """S3Source for real through boto3, against moto's in-process S3 (the program run in-process)."""
    boto3 = pytest.importorskip("boto3")
    from moto import mock_aws

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    dest = tmp_path / "models" / "weights-bucket" / "deepseek" / "v4"
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="weights-bucket")
        for rel, data in FILES.items():
            s3.put_object(Bucket="weights-bucket", Key=f"deepseek/v4/{rel}", Body=data)
        s3.put_object(Bucket="weights-bucket", Key="deepseek/v4/", Body=b"")  # a console "folder"
        s3.put_object(Bucket="weights-bucket", Key="deepseek/v40/other.bin", Body=b"not ours")  # a sibling prefix
        args = staging_args(source_url("s3://weights-bucket/deepseek/v4", "s3"), str(dest), workers=2)
        assert stage_weights.main(args) == 0
        assert {rel: (dest / rel).read_bytes() for rel in FILES} == FILES
        assert marker(dest)["files"] == {rel: len(d) for rel, d in FILES.items()}
        assert stage_weights.main(args) == 0
        out = capsys.readouterr().out
        assert "summary: files=5 fetched=0 skipped=5" in out
        # A transfer cut off in every attempt leaves a partial; the next run asks S3 for the rest only.
        dest2 = tmp_path / "models" / "resumed"
        cut = 50_000
        real_copy, real_fetch = stage_weights.copy_stream, stage_weights.S3Source.fetch

        def cut_off(read, out, limit=None):
            real_copy(read, out, cut)
            raise ConnectionError("connection reset by peer")

        monkeypatch.setattr(stage_weights, "copy_stream", cut_off)
        assert stage_weights.main(staging_args(source_url("s3://weights-bucket/deepseek/v4", "s3"), str(dest2), workers=2)) == EXIT_INCOMPLETE
        kept = (dest2 / STAGING_DIR_NAME / (BIG + stage_weights.PARTIAL_SUFFIX)).stat().st_size
        assert kept == stage_weights.ATTEMPTS * cut  # every attempt resumed where the last one stopped
        monkeypatch.setattr(stage_weights, "copy_stream", real_copy)
        offsets = []

        def recorded(self, rel, info, out, offset):
            offsets.append((rel, offset))
            return real_fetch(self, rel, info, out, offset)

        monkeypatch.setattr(stage_weights.S3Source, "fetch", recorded)
        assert stage_weights.main(staging_args(source_url("s3://weights-bucket/deepseek/v4", "s3"), str(dest2), workers=2)) == 0
        assert dict(offsets)[BIG] == kept and {rel: (dest2 / rel).read_bytes() for rel in FILES} == FILES
        # An empty or missing prefix cannot be staged, and retrying will not change that.
        assert stage_weights.main(staging_args("s3://weights-bucket/nothing-here", str(tmp_path / "x"))) == EXIT_SOURCE
        assert stage_weights.main(staging_args("s3://no-such-bucket-xyz/p", str(tmp_path / "y"))) == EXIT_SOURCE


FAKE_HUB = '''
"""A stand-in for huggingface_hub with the calls the staging program makes (tests only).

Files are served over HTTP by the test's server: small files from the "hub" host, LFS
files (*.safetensors) redirected to a "CDN" host, as the hub does."""
import json, os, urllib.request

ROOT = os.environ["FAKE_HUB_ROOT"]
HUB = os.environ["FAKE_HUB_URL"]
CDN = os.environ["FAKE_CDN_URL"]
LOG = os.path.join(ROOT, "calls.log")


class RepositoryNotFoundError(Exception):
    pass


class _Lfs:
    def __init__(self, sha256):
        self.sha256 = sha256


class _Sibling:
    def __init__(self, rfilename, size, lfs, blob_id):
        self.rfilename, self.size, self.lfs, self.blob_id = rfilename, size, lfs, blob_id


class _Info:
    def __init__(self, sha, siblings):
        self.sha, self.siblings = sha, siblings


class _Meta:
    def __init__(self, location, size):
        self.location, self.size, self.etag, self.commit_hash, self.xet_file_data = location, size, "e", "c", None


def _record(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\\n")


class HfApi:
    def __init__(self, token=None):
        self.token = token

    def model_info(self, repo_id, revision=None, files_metadata=False):
        _record(call="model_info", repo=repo_id, revision=revision, token=self.token, files_metadata=files_metadata)
        import hashlib
        repo = os.path.join(ROOT, "repos", repo_id)
        if not os.path.isdir(repo):
            raise RepositoryNotFoundError(repo_id)
        files = []
        for d, _, names in os.walk(repo):
            for n in names:
                p = os.path.join(d, n)
                rel = os.path.relpath(p, repo)
                lfs = _Lfs(hashlib.sha256(open(p, "rb").read()).hexdigest()) if rel.endswith(".safetensors") else None
                files.append(_Sibling(rel, os.path.getsize(p) if files_metadata else None, lfs, "blob-" + rel))
        return _Info("c0ffee" * 6 + "abcd", files)


def hf_hub_url(repo_id, filename, revision=None):
    return "%s/%s/resolve/%s/%s" % (HUB, repo_id, revision, filename)


def get_hf_file_metadata(url, token=None):
    _record(call="metadata", url=url, token=token)
    rel = url.split("/resolve/", 1)[1].split("/", 1)[1]
    repo = url[len(HUB) + 1:].split("/resolve/", 1)[0]
    size = os.path.getsize(os.path.join(ROOT, "repos", repo, rel))
    return _Meta(url.replace(HUB, CDN) if rel.endswith(".safetensors") else url, size)
'''
FAKE_HUB_HTTP_GET = '''
import urllib.request


def http_get(url, temp_file, resume_size=0, headers=None, expected_size=None):
    headers = dict(headers or {})
    if resume_size:
        headers["Range"] = "bytes=%d-" % resume_size
    got = resume_size
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as resp:
        while True:
            chunk = resp.read(4096)
            if not chunk:
                break
            temp_file.write(chunk)
            got += len(chunk)
    if expected_size is not None and got != expected_size:
        raise OSError("Consistency check failed: %d != %d" % (got, expected_size))
'''


class _Files(BaseHTTPRequestHandler):
    """Serves tests' repositories with Range support, records each request, and can cut one response short."""

    root: Path
    requests: list
    cut: dict  # file name -> bytes after which its next response stops

    def do_GET(self):  # noqa: N802 (http.server's name)
        rel = self.path.split("/resolve/", 1)[1].split("/", 1)[1]
        repo = self.path[1:].split("/resolve/", 1)[0]
        data = (self.root / "repos" / repo / rel).read_bytes()
        start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
        body = data[start:]
        limit = self.cut.pop(rel, None)
        sent = body if limit is None else body[:limit]
        self.requests.append({"host": self.headers["Host"].split(":")[0], "file": rel, "range": self.headers.get("Range"),
                              "auth": self.headers.get("Authorization"), "bytes": len(sent)})  # fmt: skip
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(sent)
        if limit is not None:
            self.close_connection = True

    def log_message(self, *args):
        pass


def test_hf_source_with_a_stand_in_hub(source, tmp_path):
    """HfSource's glue: sizes and sha256 from the listing, one pinned commit, the token to the hub but not the
    CDN, and a transfer broken mid-file resumed with a Range request (no byte fetched twice)."""
    import threading
    from http.server import ThreadingHTTPServer

    hub_root = tmp_path / "hub"
    fake = tmp_path / "fakehub" / "huggingface_hub"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_HUB)
    (fake / "file_download.py").write_text(FAKE_HUB_HTTP_GET)
    (fake / "utils.py").write_text(
        "from huggingface_hub import RepositoryNotFoundError\n\n\ndef build_hf_headers(token=None):\n"
        "    return {'authorization': 'Bearer %s' % token, 'user-agent': 'fake'}\n"
    )
    repo = hub_root / "repos" / "deepseek-ai" / "DeepSeek-V4-Pro"
    repo.parent.mkdir(parents=True)
    os.rename(source, repo)
    handler = type("Files", (_Files,), {"root": hub_root, "requests": [], "cut": {"model-00001-of-00002.safetensors": 100_000}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    env = {**os.environ, "PYTHONPATH": str(fake.parent), "FAKE_HUB_ROOT": str(hub_root), "HF_TOKEN": "hf_test_token",
           "FAKE_HUB_URL": f"http://127.0.0.1:{port}", "FAKE_CDN_URL": f"http://localhost:{port}"}  # fmt: skip
    mount = tmp_path / "models"
    checkpoint = "deepseek-ai/DeepSeek-V4-Pro@main"
    dest = model_path(str(mount), checkpoint, "hf")

    def run(url):
        return subprocess.run(
            local(staging_command()) + staging_args(url, dest, workers=2),
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    try:
        proc = run(source_url(checkpoint, "hf"))
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {rel: (Path(dest) / rel).read_bytes() for rel in FILES} == FILES
    doc = marker(Path(dest))
    assert doc["revision"] == "c0ffee" * 6 + "abcd" and doc["source"] == "hf://deepseek-ai/DeepSeek-V4-Pro"
    calls = [json.loads(l) for l in (hub_root / "calls.log").read_text().splitlines()]
    (info,) = [c for c in calls if c["call"] == "model_info"]
    assert info == {"call": "model_info", "repo": "deepseek-ai/DeepSeek-V4-Pro", "revision": "main", "token": "hf_test_token", "files_metadata": True}
    # Every file at the pinned commit, each byte served once: the broken shard resumed where it stopped.
    assert all(f"/resolve/{doc['revision']}/" in c["url"] for c in calls if c["call"] == "metadata")
    served = handler.requests
    assert {rel: sum(r["bytes"] for r in served if r["file"] == rel) for rel in FILES} == {rel: len(d) for rel, d in FILES.items()}
    cut = [r for r in served if r["file"] == "model-00001-of-00002.safetensors"]
    assert [r["range"] for r in cut] == [None, "bytes=100000-"]
    # The token goes to the hub's host, never to the CDN a large file is redirected to.
    assert all(r["auth"] == "Bearer hf_test_token" for r in served if r["host"] == "127.0.0.1")
    assert all(r["auth"] is None for r in served if r["host"] == "localhost") and any(r["host"] == "localhost" for r in served)
    assert "hf_test_token" not in proc.stdout + proc.stderr, "the token is never printed"
    assert "transfer of model-00001-of-00002.safetensors broke" in proc.stdout and summary(proc)["transferred"] == TOTAL
    assert run("hf://nobody/nothing").returncode == EXIT_SOURCE


def test_staging_and_fsx_sizing_are_pure():
    """infra/k8s/staging.py and infra/planning/storage.py import nothing from Pulumi (usable offline, in a notebook)."""
    code = "import sys, infra.k8s.staging, infra.planning.storage; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'pulumi_kubernetes')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---- progress lines (python -m infra rollout reads them) ------------------------------------------------


def progress_lines(stdout: str) -> list[dict]:
    from infra.cli.rollout import parse_progress

    return [p for p in map(parse_progress, stdout.splitlines()) if p]


def test_progress_lines_count_bytes_and_files_to_the_end(source, tmp_path):
    dest = tmp_path / "dest"
    proc = run_stage(source, dest, "--progress-interval", "0.01")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = progress_lines(proc.stdout)
    first, last = lines[0], lines[-1]
    # Printed once the listing is known, before anything moved: nothing done, time left unknown.
    assert (first["state"], first["bytes_done"], first["files_done"], first["eta_s"]) == ("running", 0, 0, None)
    assert all(p["bytes_total"] == TOTAL and p["files_total"] == len(FILES) for p in lines)
    done = [p["bytes_done"] for p in lines]
    assert done == sorted(done), "bytes done never go back"
    assert (last["state"], last["bytes_done"], last["files_done"], last["eta_s"]) == ("complete", TOTAL, len(FILES), 0)


def test_progress_moves_while_a_large_file_is_still_arriving(tmp_path):
    """A shard of several GB is written in chunks: each chunk counts as it lands, not the file when it ends."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    size = 8 * stage_weights.CHUNK
    (src / "model.safetensors").write_bytes(b"w" * size)
    chunks: list[int] = []

    class Trickle(stage_weights.FileSource):
        def fetch(self, rel, info, out, offset):  # noqa: ANN001
            with open(Path(self.root, rel), "rb") as f:
                f.seek(offset)
                return stage_weights.copy_stream(lambda n: chunks.append(n) or f.read(n), out)

    seen: list[int] = []
    progress = stage_weights.Progress({"model.safetensors": size}, [])
    source = Trickle(str(src))
    stage_weights.fetch_file(source, "model.safetensors", {"size": size}, str(dest / ".staging"), str(dest),
                             tally=lambda n: (progress.moved(n), seen.append(progress.bytes_done)))  # fmt: skip
    assert len(chunks) > 2 and seen[0] == stage_weights.CHUNK, "the first chunk counted before the file ended"
    assert progress.bytes_done == size == progress.transferred, "and nothing counted twice"


def test_a_resumed_partial_counts_as_done_but_not_as_moved(source, tmp_path):
    dest = tmp_path / "dest"
    half = len(FILES[BIG]) // 2
    failed = _fail_half_way(source, dest, {rel: len(d) for rel, d in FILES.items()})
    # The failed run's last line: everything but the partial file, and the state that says so.
    last = progress_lines(failed.stdout)[-1]
    assert (last["state"], last["files_done"], last["bytes_done"]) == ("incomplete", len(FILES) - 1, TOTAL - len(FILES[BIG]))
    (source / BIG).write_bytes(FILES[BIG])
    progress = stage_weights.Progress({rel: len(d) for rel, d in FILES.items()}, [rel for rel in FILES if rel != BIG])
    stage_weights.fetch_file(stage_weights.FileSource(str(source)), BIG, {"size": len(FILES[BIG])},
                             str(dest / STAGING_DIR_NAME), str(dest), progress.moved, progress.kept)  # fmt: skip
    # What the partial held is done without being this run's transfer (the rate counts transfers only).
    assert progress.bytes_done == TOTAL and progress.transferred == len(FILES[BIG]) - half


def test_the_staged_checkpoint_is_the_pinned_commit_and_remote_code_needs_one():
    from infra.catalog.models import CATALOG

    kimi = CATALOG["kimi-k3"]
    staged = staged_checkpoint(kimi.hf_repo, kimi.revision, remote_code=True)
    assert staged == f"moonshotai/Kimi-K3@{kimi.revision}"
    # The weights' directory stays org/name whatever the commit: serving reads the same path.
    assert split_checkpoint(staged, "hf") == ("moonshotai/Kimi-K3", kimi.revision)
    # No commit: staged from `main` unless serving runs the checkpoint's code; then refused, naming the key.
    assert staged_checkpoint("Qwen/Qwen3-0.6B", None, remote_code=False) == "Qwen/Qwen3-0.6B"
    with pytest.raises(UserError, match=r"--trust-remote-code.*set gpu-serving:model.revision"):
        staged_checkpoint("moonshotai/Kimi-K3", None, remote_code=True)
    # A reference that names its own revision is kept.
    assert staged_checkpoint("org/m@v1.0", None, remote_code=True) == "org/m@v1.0"
    # Production stages nothing from `main`: refused without a commit, naming the key; a pinned one passes.
    with pytest.raises(UserError, match=r"production stack stages only a pinned commit.*gpu-serving:model.revision"):
        staged_checkpoint("meta-llama/Meta-Llama-3.1-405B", None, remote_code=False, production=True)
    assert staged_checkpoint("Qwen/Qwen3-0.6B", "c" * 40, remote_code=False, production=True) == f"Qwen/Qwen3-0.6B@{'c' * 40}"


def test_every_catalog_model_a_production_stack_may_stage_is_pinned():
    """What a production stack would stage for each catalog model: the catalog's commit, or a refusal for the
    unpinned (tests/test_models.py UNPINNED) until gpu-serving:model.revision names one."""
    from infra.catalog.models import CATALOG
    from tests.test_models import UNPINNED

    refused = set()
    for name, entry in CATALOG.items():
        try:
            assert staged_checkpoint(entry.hf_repo, entry.revision, remote_code=False, production=True) == f"{entry.hf_repo}@{entry.revision}"
        except UserError:
            refused.add(name)
    assert refused == UNPINNED


def test_a_production_stack_refuses_an_unpinned_variant_checkpoint(tmp_path):
    """Prod planned on the FP8 variant of its model (another repository, no commit pinned for it): the program stops
    with one message naming the variant and the way out, before any resource (gpu-serving:model.revision pins the
    model's own repository, not the variant's)."""
    from infra.preview.synth import synthesize
    from tests.project_copy import edited_project

    root = edited_project(tmp_path / "p", "prod", [("    weightFormat: null", "    weightFormat: fp8")])
    with pytest.raises(UserError, match=r"stages sgl-project/DeepSeek-V4-Pro-FP8, a published variant.*production stack stages only pinned commits"):
        synthesize("prod", root)
