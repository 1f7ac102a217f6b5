"""Shared fixtures: where the repository and its test data are.

Upstream data the tests check against (the KubeRay CRD, the charts' default
values, published model configs, chart and add-on tables) is kept in the
repository under `tests/fixtures/`, with its sources and how to refresh it in
`tests/fixtures/README.md`. A fixture file that is missing fails the test when
`CI=true` and skips it otherwise, naming the path and the refresh command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"
REFRESH = "python tests/fixtures/refresh.py [REFERENCE_DIR]; see tests/fixtures/README.md"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def missing(message: str) -> None:
    """Something a test needs is not there: fail under CI=true (the set-up must provide it), skip otherwise."""
    __tracebackhide__ = True  # report the test that asked, not this line
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def fixture_path(*parts: str) -> Path:
    """`tests/fixtures/<parts>`; a missing one fails the test under CI=true and skips it otherwise."""
    __tracebackhide__ = True
    path = FIXTURES_DIR.joinpath(*parts)
    if not path.exists():
        missing(f"test fixture missing: {path} (restore it from git or refresh it: {REFRESH})")
    return path


# Prometheus' promtool, which bin/test installs (bin/install-promtool): the alert and dashboard tests run it.
PROMTOOL = REPO_ROOT / ".tools" / "bin" / "promtool"


# Where this run's processes share what they computed (a directory of this run alone): the SLA
# capacities (infra/planning/capacity_cache.py), checkov's reports (tests/checkov_runs.py) and the
# repository's stacks synthesized (tests/synthesized.py).
SHARED_ENV = "GPU_SERVING_TEST_SHARED"


def shared_path(*parts: str) -> Path | None:
    """`parts` under this run's shared directory (SHARED_ENV), or None outside a run that set it."""
    where = os.environ.get(SHARED_ENV)
    return Path(where).joinpath(*parts) if where else None


@pytest.fixture(scope="session", autouse=True)
def shared_run_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The directory this run's workers and the programs its tests start share (SHARED_ENV):
    under pytest-xdist the workers' temporary directories have a parent that is this run's
    alone. In it, one SLA capacity cache (infra/planning/capacity_cache.py: prod's search,
    seconds each time, runs once per run instead of once per test file; a test that must
    compute afresh unsets GPU_SERVING_SLA_CACHE), checkov's reports (tests/checkov_runs.py) and
    the synthesis of the repository's prod and test stacks (tests/synthesized.py)."""
    from infra.planning.capacity_cache import ENV

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    os.environ.setdefault(SHARED_ENV, str(base))
    os.environ.setdefault(ENV, str(Path(os.environ[SHARED_ENV]) / "sla-capacities"))


# The test files that take longest, longest first: their tests' summed seconds in a full run
# on 2 cores (junit XML of `bin/test` at 3de24bc: 61, 46, 44, 40, 35, 30, 29, 27, 25, 22, 21,
# 21, 18 s of 667; and test_aiconfigurator.py's real driver, 23 s, since bin/test sets up
# venv-perf/). bin/test hands whole files to its workers in collection order
# (`--dist loadfile --no-loadscope-reorder`), and these go first, so that no worker is left
# alone with one of them at the end (longest first, the list-scheduling rule). One exception:
# test_sweep.py, which plans nothing, goes second, to the other worker, while test_scan.py's
# first test plans prod: test_changes.py, second by time, plans prod at once too, and two
# workers starting together both ran prod's SLA search (8 s of CPU) before either had stored
# it (infra/planning/capacity_cache.py). A stale entry only costs balance;
# tests/test_test_order.py checks that each names a test file.
SLOWEST_FILES = (
    "test_scan.py", "test_sweep.py", "test_changes.py", "test_preflight.py", "test_sla_plan.py",
    "test_requirements.py", "test_names.py", "test_perf_validation.py", "test_synth.py", "test_aiconfigurator.py",
    "test_rayspec.py", "test_diff.py", "test_scan_aws.py", "test_staging.py", "test_perf_fit.py",
)


def slowest_files_first(files: list[Path]) -> list[Path]:
    """The order to run test files in: those named in SLOWEST_FILES first, in its order, then
    the rest in the order given."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    return sorted(files, key=lambda path: rank.get(path.name, len(rank)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each file's tests stay together and in their order; the files run slowest_files_first."""
    order = {path: i for i, path in enumerate(slowest_files_first(list(dict.fromkeys(item.path for item in items))))}
    items.sort(key=lambda item: order[item.path])


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool at .tools/bin/; missing, it fails the test under CI=true and skips it otherwise."""
    if not PROMTOOL.is_file():
        missing(f"{PROMTOOL.relative_to(REPO_ROOT)} is missing: run bin/install-promtool (bin/test does)")
    return PROMTOOL


@pytest.fixture(scope="session")
def checkov() -> Path:
    """The pinned checkov in venv-scan/, which bin/test sets up (tests/checkov_runs.py); no test installs it."""
    from tests.checkov_runs import checkov_path

    return checkov_path()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (holds Pulumi.yaml and the stack files)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def fixture_file() -> Callable[..., Path]:
    """`fixture_file("upstream", "kuberay-operator-1.7.0", "values.yaml")`: a checked path in tests/fixtures."""
    return fixture_path


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """`tests/fixtures/models/<org>--<repo>/config.json`: published model configs."""
    return fixture_path("models")


@pytest.fixture(scope="session")
def upstream_dir() -> Path:
    """`tests/fixtures/upstream/<chart>-<version>/`: upstream CRDs and chart defaults."""
    return fixture_path("upstream")
