"""Shared fixtures: where the repository and the shared reference data are.

The reference data (model configs, upstream chart files) lives next to the
repository in `../shared/`; set GPU_SERVING_SHARED to use another copy. Tests
that need it are skipped, with the reason, when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("GPU_SERVING_SHARED", REPO_ROOT.parent / "shared")).resolve()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (holds Pulumi.yaml and the stack files)."""
    return REPO_ROOT


def _shared(*parts: str) -> Path:
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data not found: {path} (set GPU_SERVING_SHARED)")
    return path


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """`../shared`: reference data kept outside the repository."""
    return _shared()


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """`../shared/models/<org>--<repo>/config.json`: published model configs."""
    return _shared("models")


@pytest.fixture(scope="session")
def upstream_dir() -> Path:
    """`../shared/upstream/<chart>-<version>/`: upstream CRDs and chart defaults."""
    return _shared("upstream")
