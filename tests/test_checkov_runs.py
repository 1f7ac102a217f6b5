"""tests/checkov_runs.py shares a checkov run between the processes of a test run (its workers).

checkov itself is replaced here by a stand-in of `scan.run_checkov` that counts its calls; the
scan tests run the real one through the same `runner`. A second process is the first with its
in-memory runs forgotten (`_runs` cleared), as a new worker starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.preview import scan
from tests import checkov_runs
from tests.conftest import SHARED_ENV, shared_path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A venv-scan/ with a checkov and its stamp, a shared directory, and a counting stand-in for checkov."""
    venv = tmp_path / "venv-scan"
    (venv / "bin").mkdir(parents=True)
    checkov = venv / "bin" / "checkov"
    checkov.write_text("")
    (venv / scan.STAMP).write_text("a" * 64 + "\n")
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "shared"))
    monkeypatch.setattr(checkov_runs, "_runs", {})
    calls = []

    def run_checkov(checkov, framework, directory, home, quiet=True):
        calls.append((framework, sorted(p.name for p in directory.iterdir())))
        return [{"check_type": framework, "summary": {"passed": len(calls)}, "results": {}}]

    monkeypatch.setattr(scan, "run_checkov", run_checkov)
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "main.tf.json").write_text('{"resource": {}}')
    home = tmp_path / "home"
    home.mkdir()
    return checkov, inputs, home, calls


def another_process(monkeypatch) -> None:
    monkeypatch.setattr(checkov_runs, "_runs", {})


def test_a_second_process_reads_the_first_ones_run(fake, monkeypatch):
    checkov, inputs, home, calls = fake
    first = checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    another_process(monkeypatch)
    second = checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    assert len(calls) == 1 and second == first


def test_another_input_framework_or_checkov_runs_again(fake, monkeypatch):
    checkov, inputs, home, calls = fake
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    another_process(monkeypatch)
    checkov_runs.runner(checkov, "kubernetes", inputs, home)  # another framework
    (inputs / "main.tf.json").write_text('{"resource": {"aws_s3_bucket": {}}}')
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)  # another input
    another_process(monkeypatch)
    (checkov.parent.parent / scan.STAMP).write_text("b" * 64 + "\n")  # checkov set up from other pins
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    assert len(calls) == 4


def test_without_a_shared_directory_each_process_runs_its_own(fake, monkeypatch):
    checkov, inputs, home, calls = fake
    monkeypatch.delenv("GPU_SERVING_TEST_SHARED")
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)  # the same process: its memory
    another_process(monkeypatch)
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    assert len(calls) == 2


def test_a_shared_run_that_tried_the_network_fails_the_reader_too(fake, monkeypatch):
    checkov, inputs, home, calls = fake
    def run_checkov(checkov, framework, directory, home, quiet=True):
        # What the guard's sitecustomize writes when checkov calls out.
        Path(scan.checkov_env(home)["NET_GUARD_LOG"]).write_text("('203.0.113.7', 443)\n")
        return []

    monkeypatch.setattr(scan, "run_checkov", run_checkov)
    with pytest.raises(pytest.fail.Exception, match="tried the network"):
        checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    another_process(monkeypatch)
    monkeypatch.setattr(scan, "run_checkov", lambda *a, **k: pytest.fail("ran checkov again"))
    with pytest.raises(pytest.fail.Exception, match="tried the network.*203.0.113.7"):
        checkov_runs.runner(checkov, "terraform_plan", inputs, home)


def test_an_unreadable_shared_run_is_run_again(fake, monkeypatch):
    checkov, inputs, home, calls = fake
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    for path in shared_path("checkov-runs").iterdir():
        path.write_text("{trunc")
    another_process(monkeypatch)
    checkov_runs.runner(checkov, "terraform_plan", inputs, home)
    assert len(calls) == 2
