"""The real checkov for the scan tests (tests/test_scan.py, tests/test_scan_aws.py), run once per input.

- `checkov_path()`: the pinned checkov in venv-scan/. bin/test sets that virtualenv up
  from requirements-scan.txt (bin/venv.sh, the same stamp the scan's own first-use install
  writes), so no test installs anything or reaches a package index: a missing or
  out-of-date venv-scan/ fails the test and names the set-up command.
- `runner`: a drop-in for `scan.run_checkov` (`scan.scan_document(..., runner=runner)`) that
  runs checkov once per framework and input in a test session (per xdist worker), keyed
  by the content of the converted files, and hands every later caller the same reports:
  the prod and test stacks are each scanned once, however many tests read the scan. The
  workers of a run share them too: a run's reports (and what the guard saw) are written to
  the run's shared directory (GPU_SERVING_TEST_SHARED, set by tests/conftest.py), named by
  the sha256 of checkov's path and pinned requirements, the guard, the framework and the
  input, and a worker that misses in memory reads them there before running checkov.
  Each run goes through `scan.run_checkov` with `scan.checkov_env`'s environment plus a
  guard (`sitecustomize.py`) that records, and refuses, any network call of the checkov
  process: a run that tried one fails the test that asked for it, and `guard_logs()`
  shows what the guard saw during a document's runs (the offline test asserts: nothing).
  checkov is run without `--quiet`, so the reports also list the passed checks (`--quiet`
  leaves out only those, not their counts: `parse_reports` reads the same findings).
- `stack_reports(checkov, doc)`: checkov's reports over a synthesis, by framework (the
  same runs `runner` shares).

Callers only read what they get back (reports are shared, not copied).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from infra.errors import UserError
from infra.planning.capacity_cache import write_whole
from infra.preview import scan
from tests.conftest import shared_path

SETUP = "bin/test (or `source bin/venv.sh && ensure_venv requirements-scan.txt venv-scan`)"

GUARD = textwrap.dedent(
    """\
    # Records, and refuses, every network call of the process (the scan tests' guard).
    import os, socket

    _log = os.environ["NET_GUARD_LOG"]

    def _refuse(what):
        with open(_log, "a") as fh:
            fh.write(repr(what) + "\\n")
        raise OSError("network call refused by the test guard: %r" % (what,))

    def _connect(self, address):
        if isinstance(address, tuple):
            _refuse(address)
        return _real_connect(self, address)

    def _getaddrinfo(host, *args, **kwargs):
        if host not in (None, "localhost", "127.0.0.1", "::1"):
            _refuse(host)
        return _real_getaddrinfo(host, *args, **kwargs)

    _real_connect, _real_getaddrinfo = socket.socket.connect, socket.getaddrinfo
    socket.socket.connect, socket.getaddrinfo = _connect, _getaddrinfo
    """
)


def checkov_path() -> Path:
    """checkov in venv-scan/, as set up (never installed here); a missing one fails the test with the fix."""
    __tracebackhide__ = True
    try:
        return scan.ensure_checkov(install=False)
    except UserError as err:
        pytest.fail(f"the scan tests run the pinned checkov from {scan.VENV}/: {err}. Set it up with {SETUP}", pytrace=False)


def guard_env(guard: Path, log: Path) -> dict[str, str]:
    """What puts the guard into a Python process (its `sitecustomize.py` in `guard`), logging to `log`."""
    return {"PYTHONPATH": str(guard), "NET_GUARD_LOG": str(log)}


@functools.lru_cache(maxsize=None)
def _guard_dir() -> Path:
    guard = Path(tempfile.mkdtemp(prefix="gpu-serving-checkov-guard-"))
    atexit.register(shutil.rmtree, guard, True)
    (guard / "sitecustomize.py").write_text(GUARD)
    return guard


_runs: dict[tuple[str, str, str], tuple[list[dict[str, Any]], str]] = {}  # (checkov, framework, input digest) -> (reports, guard log)


def _digest(files: dict[str, str]) -> str:
    """The input of one checkov run: the converted files (relative path -> text)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].encode() + b"\0")
    return h.hexdigest()


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in directory.rglob("*") if p.is_file()}


def _shared_path(checkov: Path, key: tuple[str, str, str]) -> Path | None:
    """Where this run's processes share the run `key` (None outside a test run that set the directory)."""
    stamp = checkov.parent.parent / scan.STAMP  # the pinned requirements' sha256, as venv-scan/ was set up from
    pinned = stamp.read_text() if stamp.is_file() else ""
    name = hashlib.sha256("\0".join((*key, pinned, GUARD)).encode()).hexdigest()
    return shared_path("checkov-runs", f"{name}.json")


def _shared_run(checkov: Path, key: tuple[str, str, str]) -> tuple[list[dict[str, Any]], str] | None:
    """The run `key` another process of this test run shared, or None (none yet, or unreadable)."""
    path = _shared_path(checkov, key)
    try:
        data = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    return (data["reports"], data["guard_log"]) if isinstance(data, dict) else None


def _share_run(checkov: Path, key: tuple[str, str, str], run: tuple[list[dict[str, Any]], str]) -> None:
    """Writes the run for the other processes (whole: capacity_cache.write_whole)."""
    path = _shared_path(checkov, key)
    if path is not None:
        write_whole(path, json.dumps({"reports": run[0], "guard_log": run[1]}).encode())


def runner(checkov: Path, framework: str, directory: Path, home: Path) -> list[dict[str, Any]]:
    """`scan.run_checkov` under the network guard, once per (checkov, framework, files of `directory`).

    A run during which checkov tried the network fails the test that asked for it (every time it is asked)."""
    __tracebackhide__ = True
    key = (str(checkov), framework, _digest(_files(directory)))
    if key not in _runs and (shared := _shared_run(checkov, key)) is not None:
        _runs[key] = shared
    if key not in _runs:
        guard = _guard_dir()
        log = guard / f"net-{len(_runs)}.log"
        log.write_text("")
        real_env = scan.checkov_env
        with mock.patch.object(scan, "checkov_env", lambda h: {**real_env(h), **guard_env(guard, log)}):
            reports = scan.run_checkov(checkov, framework, directory, home, quiet=False)
        _runs[key] = (reports, log.read_text())
        _share_run(checkov, key, _runs[key])
    reports, calls = _runs[key]
    if calls:
        pytest.fail(f"checkov ({framework}) tried the network: {calls}", pytrace=False)
    return reports


def guard_logs(checkov: Path, doc: dict) -> dict[str, str]:
    """What the guard recorded during the shared runs over `doc`, by framework ("" where checkov made no network call)."""
    converted = scan.convert(doc)
    return {fw: _runs[(str(checkov), fw, _digest(files))][1] for fw, files in converted.files.items() if files}


def stack_reports(checkov: Path, doc: dict) -> dict[str, list[dict[str, Any]]]:
    """checkov's reports (passed checks included) over the converted `doc`, by framework, through `runner`."""
    converted = scan.convert(doc)
    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-serving-scan-test-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        for fw in scan.FRAMEWORKS:
            if not converted.files[fw]:
                out[fw] = []
                continue
            directory = Path(tmp) / fw
            directory.mkdir()
            for rel, text in converted.files[fw].items():
                (directory / rel).write_text(text)
            out[fw] = runner(checkov, fw, directory, home)
    return out


def _resources(framework: str, files: dict[str, str]) -> int:
    """The resources of converted files: a Terraform plan's planned resources, or one per Kubernetes manifest."""
    if framework == "terraform_plan":
        return sum(len(json.loads(text)["planned_values"]["root_module"].get("resources", [])) for text in files.values())
    return len(files)


def scan_together(checkov: Path, docs: dict[str, dict], accepted=()) -> dict[str, scan.ScanResult]:
    """`scan.scan_document(doc, accepted, checkov)` of each of several small documents, with one checkov run per
    framework over all of them (each run costs seconds of start-up; the documents' results are what each alone gives).

    Each document's converted files go to a directory of their own, `<framework>/<key>/`; the one run's reports
    (through `runner`: the network guard) are split by that directory: the checks and parsing errors of a file
    under `/<key>/` are that document's, with the file path checkov reports for it alone; its summary counts
    are those lists' lengths (as checkov counts them), its resources those of its converted files (the Terraform
    plan's planned resources; one per Kubernetes manifest). That the shares add up to the run's whole summary,
    resources included, is asserted: a document whose resources checkov did not all count fails here. Then
    `scan.scan_document` parses, matches and counts each document's share as it would its own run.
    """
    __tracebackhide__ = True
    converted = {key: scan.convert(doc) for key, doc in docs.items()}
    shares: dict[str, dict[str, list[dict[str, Any]]]] = {key: {} for key in docs}
    with tempfile.TemporaryDirectory(prefix="gpu-serving-scan-together-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        for fw in scan.FRAMEWORKS:
            keys = [key for key in docs if converted[key].files[fw]]
            if not keys:
                continue
            directory = Path(tmp) / fw
            for key in keys:
                (directory / key).mkdir(parents=True)
                for rel, text in converted[key].files[fw].items():
                    (directory / key / rel).write_text(text)
            reports = runner(checkov, fw, directory, home)
            for key in keys:
                shares[key][fw] = []
            for report in reports:
                results = report.get("results") or {}
                split_resources = 0
                for key in keys:
                    prefix = f"/{key}/"
                    part: dict[str, list] = {}
                    for kind in ("passed_checks", "failed_checks", "skipped_checks"):
                        part[kind] = [{**c, "file_path": "/" + str(c.get("file_path", "")).removeprefix(prefix)}
                                      for c in results.get(kind) or [] if str(c.get("file_path", "")).startswith(prefix)]  # fmt: skip
                    part["parsing_errors"] = [p for p in results.get("parsing_errors") or [] if prefix in "/" + str(p).lstrip("/")]
                    resources = _resources(fw, converted[key].files[fw])
                    split_resources += resources
                    summary = {**(report.get("summary") or {}), "passed": len(part["passed_checks"]), "failed": len(part["failed_checks"]),
                               "skipped": len(part["skipped_checks"]), "parsing_errors": len(part["parsing_errors"]), "resource_count": resources}  # fmt: skip
                    shares[key][fw].append({**report, "results": part, "summary": summary})
                total = report.get("summary") or {}
                for field, kind in (("passed", "passed_checks"), ("failed", "failed_checks"), ("skipped", "skipped_checks")):
                    assert int(total.get(field, 0)) == sum(len(s[fw][-1]["results"][kind]) for s in (shares[k] for k in keys)), (fw, field, total)
                assert int(total.get("resource_count", 0)) == split_resources, f"checkov ({fw}) counted {total} resources, the documents hold {split_resources}"
                assert int(total.get("parsing_errors", 0)) == sum(s[fw][-1]["summary"]["parsing_errors"] for s in (shares[k] for k in keys)), total
    return {key: scan.scan_document(doc, accepted, checkov, runner=lambda c, fw, d, h, key=key: shares[key][fw]) for key, doc in docs.items()}
