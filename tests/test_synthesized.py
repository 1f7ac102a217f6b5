"""tests/synthesized.py: the repository's stacks synthesized once per run, shared on disk, a copy per caller."""

from __future__ import annotations

import json
import shutil

import pytest

from infra.preview.synth import synthesize
from tests import synthesized
from tests.conftest import SHARED_ENV
from tests.synthesized import REPO_ROOT, repo_stack


@pytest.fixture
def own_run(tmp_path, monkeypatch):
    """A shared directory of this test alone, and no document remembered in this process."""
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "shared"))
    synthesized._text.cache_clear()
    yield tmp_path / "shared" / "synth"
    synthesized._text.cache_clear()


def test_it_is_the_synthesis_of_the_repository_and_each_caller_gets_a_copy(own_run):
    doc = repo_stack("test")
    assert doc == json.loads(json.dumps(synthesize("test")))
    assert [p.name for p in own_run.iterdir()] == [synthesized._name("test")]  # written for the other processes
    doc["resources"].clear()
    assert repo_stack("test")["resources"], "a caller's change reached the next caller"


def test_another_process_reads_the_shared_entry_and_a_mutant_does_not(own_run, monkeypatch):
    own_run.mkdir(parents=True)
    (own_run / synthesized._name("test")).write_text(json.dumps({"resources": [], "written": "by another worker"}))
    assert repo_stack("test")["written"] == "by another worker"
    monkeypatch.setenv("MUTANT_UNDER_TEST", "infra.planning.plan.x_make_plan__mutmut_1")
    synthesized._text.cache_clear()
    assert "written" not in repo_stack("test")


def test_the_entry_is_named_by_the_stack_file(tmp_path, monkeypatch):
    for name in ("__main__.py", "Pulumi.yaml", "Pulumi.test.yaml"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    for tree in ("infra", "components"):
        (tmp_path / tree).symlink_to(REPO_ROOT / tree)
    monkeypatch.setattr(synthesized, "REPO_ROOT", tmp_path)
    before = synthesized._name("test")
    assert before.startswith("test-")
    with open(tmp_path / "Pulumi.test.yaml", "a") as fh:
        fh.write("# edited\n")
    assert synthesized._name("test") != before
