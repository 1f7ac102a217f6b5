"""The weight-staging program and the serving pods' wait, run for real.

`infra/k8s/scripts/stage_weights.py` runs as a subprocess with the Job's own
command and arguments (the mounted scripts folder mapped to the source folder),
against a fake checkpoint in a temporary directory; `wait_for_weights.sh` runs
under `sh`. Nothing is mocked: files are copied, sizes checked, markers written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.k8s import script_files
from infra.k8s.scripts import stage_weights
from infra.k8s.scripts.stage_weights import EXIT_INCOMPLETE, EXIT_SOURCE, LISTING_FILE_NAME, MARKER_NAME, STAGING_DIR_NAME
from infra.k8s.staging import (
    STAGING_SCRIPT,
    check_packages,
    job_name,
    marker_path,
    model_path,
    source_url,
    split_checkpoint,
    staging_args,
    staging_command,
    staging_config_map,
    staging_deadline_s,
)

FILES = {
    "config.json": b'{"model_type": "deepseek_v4"}\n',
    "tokenizer.json": b"t" * 5000,
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(123_457),
    "sub/dir/extra.bin": b"x" * 10,
}


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
    assert summary(proc) == {"files": 5, "fetched": 5, "skipped": 0, "failed": 0, "bad": 0}
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
    assert summary(proc) == {"files": 5, "fetched": 0, "skipped": 5, "failed": 0, "bad": 0}
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
    assert summary(proc) == {"files": 5, "fetched": 1, "skipped": 4, "failed": 0, "bad": 0}
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
    assert summary(proc) == {"files": 5, "fetched": 4, "skipped": 0, "failed": 1, "bad": 1}
    assert "size mismatch after download: model-00002-of-00002.safetensors" in proc.stdout
    assert not (dest / MARKER_NAME).exists()
    assert not (dest / "model-00002-of-00002.safetensors").exists(), "a bad download never reaches its final name"


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


def test_the_install_variant_passes_arguments_through(tmp_path):
    """With packages, `sh -c` installs them and hands the Job's args to the script ("$@")."""
    command = staging_command(("huggingface_hub==0.36.0",))
    assert command[0] == "sh" and command[-1] == "stage"
    assert "pip install" in command[2] and "huggingface_hub==0.36.0" in command[2]
    assert '"$@"' in command[2] and staging_command()[1] in command[2]
    # Without the install step, run it: the mounted program sees exactly the Job's args.
    shell = command[2].split(" && ", 1)[1]
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"abc")
    proc = subprocess.run(
        ["sh", "-c", " ".join(local(shell.split(" "))), "stage", *staging_args(f"file://{src}", str(tmp_path / "d"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "d" / MARKER_NAME).read_text())["files"] == {"a": 3}


def test_unpinned_packages_are_refused():
    check_packages(("huggingface_hub==0.36.0", "boto3==1.40.0"))
    for bad in ("huggingface_hub", "boto3>=1", "x==1; rm -rf /"):
        with pytest.raises(ValueError):
            check_packages((bad,))


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
        # An empty or missing prefix cannot be staged, and retrying will not change that.
        assert stage_weights.main(staging_args("s3://weights-bucket/nothing-here", str(tmp_path / "x"))) == EXIT_SOURCE
        assert stage_weights.main(staging_args("s3://no-such-bucket-xyz/p", str(tmp_path / "y"))) == EXIT_SOURCE


FAKE_HUB = '''
"""A stand-in for huggingface_hub with the calls the staging program makes (tests only)."""
import json, os, shutil

ROOT = os.environ["FAKE_HUB_ROOT"]
LOG = os.path.join(ROOT, "calls.log")


class RepositoryNotFoundError(Exception):
    pass


class _Sibling:
    def __init__(self, rfilename, size):
        self.rfilename, self.size = rfilename, size


class _Info:
    def __init__(self, sha, siblings):
        self.sha, self.siblings = sha, siblings


def _record(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\\n")


class HfApi:
    def __init__(self, token=None):
        self.token = token

    def model_info(self, repo_id, revision=None, files_metadata=False):
        _record(call="model_info", repo=repo_id, revision=revision, token=self.token, files_metadata=files_metadata)
        repo = os.path.join(ROOT, repo_id)
        if not os.path.isdir(repo):
            raise RepositoryNotFoundError(repo_id)
        files = []
        for d, _, names in os.walk(repo):
            for n in names:
                p = os.path.join(d, n)
                files.append(_Sibling(os.path.relpath(p, repo), os.path.getsize(p) if files_metadata else None))
        return _Info("c0ffee" * 6 + "abcd", files)


def hf_hub_download(repo_id, filename, revision=None, local_dir=None, token=None, force_download=False):
    _record(call="download", repo=repo_id, file=filename, revision=revision, token=token, force=force_download)
    target = os.path.join(local_dir, filename)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(os.path.join(ROOT, repo_id, filename), target)
    return target
'''


def test_hf_source_with_a_stand_in_hub(source, tmp_path):
    """HfSource's glue: sizes from the listing, one pinned commit, the token from HF_TOKEN, local_dir paths."""
    hub_root = tmp_path / "hub"
    fake = tmp_path / "fakehub" / "huggingface_hub"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_HUB)
    (fake / "utils.py").write_text("from huggingface_hub import RepositoryNotFoundError\n")
    repo = hub_root / "deepseek-ai" / "DeepSeek-V4-Pro"
    repo.parent.mkdir(parents=True)
    os.rename(source, repo)
    env = {**os.environ, "PYTHONPATH": str(fake.parent), "FAKE_HUB_ROOT": str(hub_root), "HF_TOKEN": "hf_test_token"}
    mount = tmp_path / "models"
    checkpoint = "deepseek-ai/DeepSeek-V4-Pro@main"
    dest = model_path(str(mount), checkpoint, "hf")

    def run(url):
        return subprocess.run(
            local(staging_command()) + staging_args(url, dest, workers=2),
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    proc = run(source_url(checkpoint, "hf"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {rel: (Path(dest) / rel).read_bytes() for rel in FILES} == FILES
    doc = marker(Path(dest))
    assert doc["revision"] == "c0ffee" * 6 + "abcd" and doc["source"] == "hf://deepseek-ai/DeepSeek-V4-Pro"
    calls = [json.loads(l) for l in (hub_root / "calls.log").read_text().splitlines()]
    (info,) = [c for c in calls if c["call"] == "model_info"]
    assert info == {"call": "model_info", "repo": "deepseek-ai/DeepSeek-V4-Pro", "revision": "main", "token": "hf_test_token", "files_metadata": True}
    downloads = [c for c in calls if c["call"] == "download"]
    assert sorted(c["file"] for c in downloads) == sorted(FILES)
    assert all(c["revision"] == doc["revision"] and c["token"] == "hf_test_token" and c["force"] for c in downloads)
    assert "hf_test_token" not in proc.stdout + proc.stderr, "the token is never printed"
    assert run("hf://nobody/nothing").returncode == EXIT_SOURCE


def test_staging_and_fsx_sizing_are_pure():
    """infra/k8s/staging.py and infra/planning/storage.py import nothing from Pulumi (usable offline, in a notebook)."""
    code = "import sys, infra.k8s.staging, infra.planning.storage; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'pulumi_aws', 'pulumi_kubernetes')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
