"""SLA capacities shared by processes on disk (infra/planning/capacity_cache.py): what one
process computed another reads, and nothing it was not computed for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.planning import PlanRequest, capacity_cache, make_plan, sla_search
from infra.planning import performance as perf

REPO = Path(__file__).resolve().parents[1]
SLA = perf.Sla(250.0, 40.0)
SHORT = perf.WorkloadSpec(input_tokens=128, output_tokens=16)  # a search of a fraction of a second


def _request(**kw) -> PlanRequest:
    base = dict(model="qwen3-0.6b", instance_type="g5.12xlarge", nodes=1, max_model_len=8192,
                objective="sla-throughput-per-dollar", sla=SLA, workload=SHORT,
                api_price_usd_per_mtok=2.0)  # fmt: skip
    base.update(kw)
    return PlanRequest(**base)


def _forget(monkeypatch) -> None:
    """A new process: nothing in the in-process memo."""
    monkeypatch.setattr(sla_search, "_CAPACITIES", {})
    monkeypatch.setattr(sla_search, "_RATES", {})


class Searched(Exception):
    pass


def _no_search(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise Searched

    monkeypatch.setattr(perf, "sla_capacity", refuse)
    monkeypatch.setattr(perf, "rate_capacity", refuse)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv(capacity_cache.ENV, str(tmp_path))
    _forget(monkeypatch)
    return tmp_path


def _plan_json(req: PlanRequest) -> str:
    return json.dumps(make_plan(req).to_json_dict(), sort_keys=True)


def test_another_process_with_another_hash_seed_plans_the_same_without_searching(cache_dir: Path):
    here = _plan_json(_request())
    kinds = sorted({p.name.split("-")[0] for p in cache_dir.glob("*.pickle")})
    assert kinds == ["capacity", "rate"]
    script = (
        "import json, sys\n"
        "from infra.planning import performance as perf\n"
        "def refuse(*a, **k): sys.exit('searched')\n"
        "perf.sla_capacity = perf.rate_capacity = refuse\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from test_capacity_cache import _plan_json, _request\n"
        "print(_plan_json(_request()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONHASHSEED": "7", capacity_cache.ENV: str(cache_dir)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == here


@pytest.mark.parametrize(
    "change",
    ["another SLA", "another workload", "another model", "another instance type", "changed code", "another mutant"],
)
def test_what_it_was_not_computed_for_misses(cache_dir: Path, monkeypatch, change: str):
    make_plan(_request())
    _forget(monkeypatch)
    _no_search(monkeypatch)
    make_plan(_request())  # the same request: read from disk
    _forget(monkeypatch)
    req = _request()
    if change == "another SLA":
        req = _request(sla=perf.Sla(250.0, 30.0))
    elif change == "another workload":
        req = _request(workload=perf.WorkloadSpec(input_tokens=128, output_tokens=32))
    elif change == "another model":
        req = _request(model="qwen3-30b-a3b")
    elif change == "another instance type":
        req = _request(instance_type="g6e.12xlarge")
    elif change == "changed code":
        monkeypatch.setattr(capacity_cache, "code_digest", lambda: "0" * 64)
    else:
        monkeypatch.setenv("MUTANT_UNDER_TEST", "infra.planning.performance.x_sla_capacity__mutmut_1")
    with pytest.raises(Searched):
        make_plan(req)


def test_without_the_variable_nothing_is_kept_across_processes(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(capacity_cache.ENV, raising=False)
    _forget(monkeypatch)
    make_plan(_request())
    assert not any(tmp_path.iterdir())
    _forget(monkeypatch)
    _no_search(monkeypatch)
    with pytest.raises(Searched):
        make_plan(_request())


def test_an_unreadable_entry_is_computed_again_and_rewritten(cache_dir: Path, monkeypatch):
    before = _plan_json(_request())
    entries = sorted(cache_dir.glob("*.pickle"))
    for entry in entries:
        entry.write_bytes(b"not a pickle")
    _forget(monkeypatch)
    assert _plan_json(_request()) == before
    assert sorted(cache_dir.glob("*.pickle")) == entries
    _forget(monkeypatch)
    _no_search(monkeypatch)
    assert _plan_json(_request()) == before


def test_the_code_digest_follows_every_file_but_bytecode(tmp_path: Path):
    root = tmp_path / "infra"
    (root / "planning").mkdir(parents=True)
    (root / "planning" / "perf.py").write_text("STEP = 1\n")
    (root / "catalog.json").write_text("{}")
    first = capacity_cache.code_digest.__wrapped__(root)
    (root / "planning" / "__pycache__").mkdir()
    (root / "planning" / "__pycache__" / "perf.cpython-311.pyc").write_bytes(b"\0")
    assert capacity_cache.code_digest.__wrapped__(root) == first
    (root / "planning" / "perf.py").write_text("STEP = 2\n")
    assert capacity_cache.code_digest.__wrapped__(root) != first
    (root / "planning" / "perf.py").write_text("STEP = 1\n")
    (root / "planning" / "perf.py").rename(root / "planning" / "perf2.py")
    assert capacity_cache.code_digest.__wrapped__(root) != first
