"""checkov over the offline synthesis (`python -m infra scan`).

`scan_stack(stack)` synthesises a stack offline (`infra.preview.synth`), converts
the document (`infra.preview.convert`): its `aws:*` resources to a Terraform
plan, its `kubernetes:*` resources to manifests with one Pod per pod template
of a custom resource; runs checkov (pinned, `CHECKOV_VERSION`) over each with
the frameworks `terraform_plan` and `kubernetes`; and sorts the failed checks
into the ones `policies/accepted-risks.yaml` accepts and the ones it does not.

checkov runs as a subprocess of its own virtualenv, `venv-scan/`, installed from
`requirements-scan.txt`: checkov 3.3.30 pins `packaging<24` and `boto3==1.35.49`,
which no environment with the program's `pulumi` (`packaging>=26`) and the
tools' `boto3` can also hold. `ensure_checkov()` creates that virtualenv on first
use and installs it again when the file changes (as `bin/test` does for
`./venv`); `--checkov PATH` uses another checkov executable instead.

Offline: checkov is started with an environment of its own (`checkov_env`, no
inherited API keys), `CKV_SKIP_PACKAGE_UPDATE_CHECK` (no PyPI version check at
import), `BC_SKIP_MAPPING` and `--skip-download` (no policy metadata or
guidelines from the Prisma Cloud platform), `--skip-results-upload`, no API key
(so nothing to upload to), and only the two frameworks (none that fetches
modules or package data). Its JSON report (stdout) is parsed into `Finding`s
and passed/failed counts per framework.

Accepted risks (`load_accepted`): a YAML list of `{check, resource, reason}`;
`check` is a checkov id, `resource` a glob (`fnmatch`, case-sensitive) over
checkov's resource id (`aws_eip.gpu-serving-prod-nat-us-east-1a-eip`,
`Pod.gpu-serving.vllm-head`), `reason` why the finding is accepted; an entry
without a reason is refused. An entry that matches no finding of the scan is
stale: reported, so the list only shrinks.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from infra.config import REPO_ROOT
from infra.errors import UserError
from infra.preview import tool_venv
from infra.preview.convert import Gap
from infra.preview.convert.kubernetes import manifests as to_manifests
from infra.preview.convert.terraform import plan as to_plan

CHECKOV_VERSION = "3.3.30"
REQUIREMENTS = "requirements-scan.txt"
VENV = "venv-scan"
STAMP = ".requirements-scan.sha256"
ACCEPTED_RISKS = Path("policies") / "accepted-risks.yaml"
FRAMEWORKS = ("terraform_plan", "kubernetes")
FRAMEWORK_TITLES = {"terraform_plan": "AWS (Terraform plan)", "kubernetes": "Kubernetes"}
TIMEOUT_S = 600

# What keeps checkov from calling home (checkov/common/util/env_vars_config.py, main.py).
OFFLINE_ENV = {
    "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true",  # no PyPI version check when its banner is imported
    "BC_SKIP_MAPPING": "TRUE",  # no policy-id mapping download from the platform
    "LOG_LEVEL": "WARNING",
    "PYTHONDONTWRITEBYTECODE": "1",
}
OFFLINE_FLAGS = ("--skip-download", "--skip-results-upload")


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Finding:
    """A failed checkov check on one resource."""

    framework: str
    check: str
    name: str  # checkov's title of the check
    resource: str  # checkov's resource id
    file: str  # the converted file checkov read, relative to its framework's directory
    source: str = ""  # the synth resource it comes from

    def key(self) -> tuple[str, str, str]:
        return (self.framework, self.resource, self.check)


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    parsing_errors: int = 0
    resources: int = 0


@dataclass(frozen=True)
class AcceptedRisk:
    check: str
    resources: tuple[str, ...]  # globs over checkov's resource id (one string: a single glob)
    reason: str

    def __post_init__(self) -> None:
        if isinstance(self.resources, str):
            object.__setattr__(self, "resources", (self.resources,))

    @property
    def resource(self) -> str:
        """The globs as the scan prints them."""
        return ", ".join(self.resources)

    def matches(self, finding: Finding) -> bool:
        return finding.check == self.check and any(fnmatch.fnmatchcase(finding.resource, glob) for glob in self.resources)


@dataclass
class ScanResult:
    stack: str
    counts: dict[str, Counts]
    accepted: list[tuple[Finding, AcceptedRisk]]
    not_accepted: list[Finding]
    stale: list[AcceptedRisk]
    gaps: list[Gap]
    checkov_version: str = CHECKOV_VERSION
    errors: list[str] = field(default_factory=list)  # the conversion or a checkov run failed

    @property
    def passed(self) -> bool:
        return not self.not_accepted and not self.errors

    def accepted_in(self, framework: str) -> int:
        """How many of `framework`'s failed checks the accepted risks accept."""
        return sum(1 for f, _ in self.accepted if f.framework == framework)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "checkov_version": self.checkov_version,
            "passed": self.passed,
            "counts": {fw: asdict(c) for fw, c in self.counts.items()},
            "not_accepted": [asdict(f) for f in self.not_accepted],
            "accepted": [{**asdict(f), "reason": r.reason, "accepted_by": {"check": r.check, "resource": r.resource}} for f, r in self.accepted],
            "stale": [asdict(r) for r in self.stale],
            "gaps": [g.to_json_dict() for g in self.gaps],
            "errors": list(self.errors),
        }


# --------------------------------------------------------------------------- accepted risks


def parse_accepted(data: Any, origin: str = "accepted risks") -> list[AcceptedRisk]:
    """The accepted risks of a loaded YAML document (a list of {check, resource, reason})."""
    if data is None:
        return []
    if isinstance(data, dict) and set(data) == {"accepted"}:
        data = data["accepted"] or []
    if not isinstance(data, list):
        raise UserError(f"{origin}: expected a list of {{check, resource, reason}}, got {type(data).__name__}")
    out = []
    for i, entry in enumerate(data, 1):
        where = f"{origin}: entry {i}"
        if not isinstance(entry, dict):
            raise UserError(f"{where}: expected a mapping with check, resource and reason, got {entry!r}")
        unknown = sorted(set(entry) - {"check", "resource", "reason"})
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(unknown)} (an entry has check, resource and reason)")
        check, resource, reason = (entry.get(k) for k in ("check", "resource", "reason"))
        if not isinstance(check, str) or not check.strip():
            raise UserError(f"{where}: no check (a checkov id such as CKV_K8S_23)")
        globs = [resource] if isinstance(resource, str) else resource
        if not isinstance(globs, list) or not globs or not all(isinstance(g, str) and g.strip() for g in globs):
            raise UserError(f"{where} ({check}): no resource (a glob over checkov's resource id, or a list of them)")
        if not isinstance(reason, str) or not reason.strip():
            raise UserError(f"{where} ({check} on {', '.join(globs)}): no reason; an accepted risk needs one")
        out.append(AcceptedRisk(check.strip(), tuple(g.strip() for g in globs), " ".join(reason.split())))
    seen = set()
    for r in out:
        for glob in r.resources:
            if (r.check, glob) in seen:
                raise UserError(f"{origin}: {r.check} on {glob} is accepted twice")
            seen.add((r.check, glob))
    return out


def load_accepted(path: Path) -> list[AcceptedRisk]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"no accepted-risks file {path}") from None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    return parse_accepted(data, str(path))


def match(findings: Sequence[Finding], risks: Sequence[AcceptedRisk]) -> tuple[list[tuple[Finding, AcceptedRisk]], list[Finding], list[AcceptedRisk]]:
    """(accepted findings with the entry that accepts each, findings not accepted, stale entries)."""
    accepted, not_accepted, used = [], [], set()
    for f in findings:
        risk = next((r for r in risks if r.matches(f)), None)
        if risk is None:
            not_accepted.append(f)
        else:
            accepted.append((f, risk))
            used.add(risk)
    return accepted, not_accepted, [r for r in risks if r not in used]


# --------------------------------------------------------------------------- checkov




def venv_checkov(root: Path = REPO_ROOT) -> Path:
    return root / VENV / "bin" / "checkov"


def ensure_checkov(root: Path = REPO_ROOT, *, install: bool = True, log: Callable[[str], None] = lambda m: None) -> Path:
    """checkov in `venv-scan/`, (re)installed from requirements-scan.txt when missing or out of date."""
    tool_venv.ensure(
        root, venv=VENV, requirements=REQUIREMENTS, stamp=STAMP, tool="checkov", pinned="the scanner's",
        hint=", or pass --checkov PATH", note=f" (checkov {CHECKOV_VERSION}, once; its pins conflict with requirements.txt's)",
        install=install, log=log,
    )  # fmt: skip
    checkov = venv_checkov(root)
    if not checkov.is_file():
        raise UserError(f"{REQUIREMENTS} installed no checkov executable into {VENV}/bin")
    return checkov


def checkov_env(home: Path) -> dict[str, str]:
    """The whole environment checkov runs with: nothing inherited but PATH and the locale."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    env.update(OFFLINE_ENV)
    env["HOME"] = str(home)  # its caches, if any, go to the scan's temporary directory
    return env


def checkov_command(checkov: Path, framework: str, directory: Path, quiet: bool = True) -> list[str]:
    """checkov over `directory`: a JSON report on stdout, exit 0 whatever it finds; `quiet` leaves out the passed checks (not their count)."""
    cmd = [str(checkov), "--framework", framework, "--directory", str(directory), "--output", "json", "--soft-fail", *OFFLINE_FLAGS]
    return [*cmd, "--quiet"] if quiet else cmd


def run_checkov(checkov: Path, framework: str, directory: Path, home: Path, timeout: float = TIMEOUT_S, quiet: bool = True) -> list[dict[str, Any]]:
    """checkov's JSON reports (one per framework it ran) over `directory`."""
    cmd = checkov_command(checkov, framework, directory, quiet)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=checkov_env(home), cwd=directory, timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"no checkov at {checkov}") from None
    except PermissionError:
        raise UserError(f"{checkov} is not executable") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"checkov ({framework}) did not finish in {timeout:.0f} s") from None
    text = proc.stdout.strip()
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        data = None
    if proc.returncode != 0 or data is None:
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"checkov ({framework}) exited {proc.returncode}: {last}")
    return data if isinstance(data, list) else [data]


def parse_reports(reports: Sequence[dict[str, Any]], framework: str, sources: dict[str, str]) -> tuple[Counts, list[Finding]]:
    """Counts and failed checks of `framework` in checkov's JSON reports.

    `sources`: checkov's resource id or file (as it reports them) -> synth resource name.
    """
    counts, findings = Counts(), []
    for report in reports:
        if report.get("check_type", framework) != framework:
            continue
        summary = report.get("summary") or {}
        counts.passed += int(summary.get("passed", 0))
        counts.failed += int(summary.get("failed", 0))
        counts.skipped += int(summary.get("skipped", 0))
        counts.parsing_errors += int(summary.get("parsing_errors", 0))
        counts.resources += int(summary.get("resource_count", 0))
        for c in (report.get("results") or {}).get("failed_checks", []):
            resource, file = str(c.get("resource", "")), str(c.get("file_path", "")).lstrip("/")
            findings.append(Finding(framework, str(c.get("check_id", "")), str(c.get("check_name", "")), resource, file,
                                    sources.get(resource) or sources.get(file, "")))  # fmt: skip
    findings.sort(key=Finding.key)
    return counts, findings


# --------------------------------------------------------------------------- converting and scanning


@dataclass
class Converted:
    """The converted files of a synth document, by framework, and what did not convert."""

    files: dict[str, dict[str, str]]  # framework -> relative path -> text
    sources: dict[str, dict[str, str]]  # framework -> checkov resource id or file -> synth resource name
    gaps: list[Gap]


def convert(doc: dict[str, Any]) -> Converted:
    """A synth document as the files checkov reads (see the module docstring)."""
    tf = to_plan(doc)
    k8s = to_manifests(doc)
    names = {r["urn"]: r["name"] for r in doc.get("resources", [])}
    files: dict[str, dict[str, str]] = {fw: {} for fw in FRAMEWORKS}
    sources: dict[str, dict[str, str]] = {fw: {} for fw in FRAMEWORKS}
    if tf.resources:
        files["terraform_plan"]["plan.json"] = json.dumps(tf.document, indent=1, sort_keys=True) + "\n"
        sources["terraform_plan"] = {address: names[urn] for urn, address in tf.addresses.items()}
    for i, m in enumerate(k8s.items, 1):
        stem = "-".join(x for x in (m.kind, m.namespace, m.name) if x)
        path = f"{i:03d}-{stem}.yaml"
        files["kubernetes"][path] = yaml.safe_dump(m.manifest, sort_keys=True)
        sources["kubernetes"][path] = m.source
    return Converted(files, sources, [*tf.gaps, *k8s.gaps])


def scan_document(
    doc: dict[str, Any],
    accepted: Sequence[AcceptedRisk],
    checkov: Path,
    *,
    runner: Callable[[Path, str, Path, Path], list[dict[str, Any]]] = run_checkov,
) -> ScanResult:
    """Convert a synth document, run checkov over it, and sort its findings against `accepted`."""
    converted = convert(doc)
    counts, findings, errors = {}, [], []
    errors += [f"{g.type} {g.resource}: {g.reason}" for g in converted.gaps if g.blocking]
    with tempfile.TemporaryDirectory(prefix="gpu-serving-scan-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        for fw in FRAMEWORKS:
            files = converted.files[fw]
            if not files:
                counts[fw] = Counts()
                continue
            directory = Path(tmp) / fw
            directory.mkdir()
            for rel, text in files.items():
                (directory / rel).write_text(text)
            c, f = parse_reports(runner(checkov, fw, directory, home), fw, converted.sources[fw])
            if c.parsing_errors:
                errors.append(f"checkov could not parse {c.parsing_errors} converted {FRAMEWORK_TITLES[fw]} file(s)")
            counts[fw], findings = c, findings + f
    ok, not_ok, stale = match(findings, accepted)
    return ScanResult(str(doc.get("stack", "")), counts, ok, not_ok, stale, converted.gaps, errors=errors)


def scan_stack(
    stack: str,
    root: Optional[Path] = None,
    *,
    accepted_path: Optional[Path] = None,
    checkov: Optional[Path] = None,
    install: bool = True,
    log: Callable[[str], None] = lambda m: None,
) -> ScanResult:
    """Synthesise `stack` offline and scan it; a config mistake, a bad accepted-risks file or a missing checkov is a `UserError`."""
    from infra.preview.synth import synthesize

    accepted = load_accepted(accepted_path or (REPO_ROOT / ACCEPTED_RISKS))
    if checkov is None:
        checkov = ensure_checkov(install=install, log=log)
    elif not Path(checkov).is_file():
        found = shutil.which(str(checkov))
        if not found:
            raise UserError(f"no checkov at {checkov}")
        checkov = Path(found)
    doc = synthesize(stack, root)
    return scan_document(doc, accepted, Path(checkov))


# --------------------------------------------------------------------------- Markdown


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(result: ScanResult) -> str:
    """The scan as Markdown for a pull-request comment."""
    verdict = "passed" if result.passed else "failed"
    lines = [f"### checkov {result.checkov_version}: stack `{result.stack}` {verdict}", ""]
    lines += ["| framework | resources | passed | failed | accepted | not accepted |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for fw in FRAMEWORKS:
        c, acc = result.counts.get(fw, Counts()), result.accepted_in(fw)
        lines.append(f"| {FRAMEWORK_TITLES[fw]} | {c.resources} | {c.passed} | {c.failed} | {acc} | {c.failed - acc} |")
    lines.append("")
    for e in result.errors:
        lines.append(f"**Error:** {_cell(e)}")
    if result.errors:
        lines.append("")
    if result.not_accepted:
        lines += [f"**Not accepted ({len(result.not_accepted)}):**", "", "| check | resource | title | from |", "| --- | --- | --- | --- |"]
        lines += [f"| {f.check} | `{_cell(f.resource)}` | {_cell(f.name)} | `{_cell(f.source)}` |" for f in result.not_accepted]
        lines.append("")
    else:
        lines += ["No finding that is not accepted.", ""]
    if result.accepted:
        by_risk: dict[AcceptedRisk, list[Finding]] = {}
        for f, r in result.accepted:
            by_risk.setdefault(r, []).append(f)
        lines += [f"<details><summary>Accepted ({len(result.accepted)} findings, {len(by_risk)} entries of <code>{ACCEPTED_RISKS}</code>)</summary>", ""]
        lines += ["| check | resources | reason |", "| --- | --- | --- |"]
        for r, fs in by_risk.items():
            lines.append(f"| {r.check} | {'<br>'.join(f'`{_cell(f.resource)}`' for f in fs)} | {_cell(r.reason)} |")
        lines += ["", "</details>", ""]
    if result.stale:
        lines += [f"**Stale accepted risks ({len(result.stale)}): they match no finding of stack `{result.stack}`; "
                  f"remove from `{ACCEPTED_RISKS}` those that no stack needs:**", ""]
        lines += [f"- {r.check} on `{_cell(r.resource)}`" for r in result.stale]
        lines.append("")
    if result.gaps:
        lines += ["<details><summary>Not scanned (" + str(len(result.gaps)) + ")</summary>", ""]
        lines += [f"- `{_cell(g.resource)}` ({g.type}): {_cell(g.reason)}" for g in result.gaps]
        lines += ["", "</details>", ""]
    return "\n".join(lines)
