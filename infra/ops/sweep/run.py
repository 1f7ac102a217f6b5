"""Running the sweep: discovery, then the deletion steps in order, with bounded waiting.

A deletion that AWS refuses because something still depends on it
(DependencyViolation, ResourceInUse, ...) is retried until the step's `--wait`
runs out (load balancer ENIs, for one, take minutes to go), then reported as
failed with AWS's error. Where AWS deletes asynchronously the step polls until
the resource is gone, again bounded by `--wait`. IAM roles are global: they are
listed and deleted once per run, whatever the regions.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Callable, Optional

from infra.errors import UserError
from infra.ops import aws
from infra.ops.sweep.clients import Clients
from infra.ops.sweep.deleting import ORDER, STEPS, Refused, Retry, Step, mark_swept_holders, revoke_group_rules
from infra.ops.sweep.listing import discover
from infra.ops.sweep.records import GLOBAL, Entry, Report, Resource

# Errors that mean "something still depends on it; try again shortly".
RETRY_CODES = {
    "DependencyViolation",
    "ResourceInUse",
    "ResourceInUseException",
    "FileSystemInUse",
    "InvalidPlacementGroup.InUse",
    "InvalidIPAddress.InUse",
    "IncorrectState",
    "IncorrectInstanceState",
    "DeleteConflict",
}


class Progress:
    """What the sweep reports while it works (the CLI draws a rich progress bar with it)."""

    def note(self, text: str) -> None:  # discovery steps
        pass

    def start(self, total: int) -> None:  # deletion begins
        pass

    def advance(self, text: str) -> None:  # one resource handled
        pass

    def finish(self) -> None:
        pass


class RichProgress(Progress):
    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)  # fmt: skip
        self._bar.start()
        self._task = self._bar.add_task("discovering", total=None)
        self._listing = 0

    def note(self, text: str) -> None:
        self._listing += 1
        self._bar.update(self._task, description=text, completed=self._listing)

    def start(self, total: int) -> None:
        self._bar.reset(self._task, total=total, completed=0, description="deleting")

    def advance(self, text: str) -> None:
        self._bar.update(self._task, description=text[:70])
        self._bar.advance(self._task)

    def finish(self) -> None:
        self.close()

    def close(self) -> None:
        self._bar.stop()


def _run_step(step: Step, entries: list[Entry], clients: dict[str, Clients], report: Report,
              wait: float, poll: float, advance: Callable[[str], None] = lambda label: None) -> None:  # fmt: skip
    """Delete `entries` (all of `step.kind`), retrying and waiting up to `wait` seconds; record each outcome."""
    deadline = time.monotonic() + wait
    if step.kind == "ec2:security-group":
        by_region: dict[str, list[Resource]] = {}
        for e in entries:
            by_region.setdefault(e.resource.region, []).append(e.resource)
        for region, groups in by_region.items():
            try:
                revoked = revoke_group_rules(clients[region], groups)
            except Exception as exc:  # noqa: BLE001 - the deletions below will say what is still blocked
                report.errors.append(f"{region}: could not revoke security group rules: {aws.error_text(exc)}")
                revoked = {}
            for g in groups:
                g.data["revoked"] = revoked.get(g.id, 0)
    started: list[tuple[Entry, str]] = []
    for e in entries:
        r = e.resource
        advance(f"deleting {r.label()}")
        while True:
            try:
                started.append((e, step.delete(clients[r.region], r)))
                break
            except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the sweep
                if aws.is_gone(exc):
                    report.deleted.append(Entry(r, "already gone (went with what it belonged to)"))
                    break
                retry = isinstance(exc, Retry) or aws.error_code(exc) in RETRY_CODES
                if retry and time.monotonic() + poll <= deadline:
                    time.sleep(poll)
                    continue
                why = str(exc) if isinstance(exc, (Retry, Refused)) else aws.error_text(exc)
                if retry:
                    why += f" (still so after waiting {wait:g} s)"
                report.failed.append(Entry(r, why))
                break
    waiting = [(e, d) for e, d in started if step.exists is not None]
    done = [(e, d) for e, d in started if step.exists is None]
    while waiting:
        still = []
        for e, d in waiting:
            try:
                there = step.exists(clients[e.resource.region], e.resource)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001
                report.failed.append(Entry(e.resource, f"deletion started; could not confirm: {aws.error_text(exc)}"))
                continue
            (still if there else done).append((e, d))
        waiting = still
        if not waiting:
            break
        if time.monotonic() + poll > deadline:
            for e, _ in waiting:
                report.failed.append(Entry(e.resource, f"deletion started but it is still there after {wait:g} s; rerun the sweep later"))
            break
        time.sleep(poll)
    for e, d in done:
        report.deleted.append(Entry(e.resource, d or "deleted"))


def sweep(
    regions: Optional[list[str]] = None,
    *,
    yes: bool = False,
    now: Optional[dt.datetime] = None,
    session=None,
    wait: float = 900.0,
    poll: float = 10.0,
    progress: Optional["Progress"] = None,
) -> Report:
    """Find (and with `yes`, delete) the resources of expired ephemeral stacks in `regions`.

    `regions` None: the region of boto3's standard configuration. Raises UserError when
    there is no region or no credentials.
    """
    session = session or aws.new_session()
    regions = list(dict.fromkeys(regions or ([session.region_name] if session.region_name else [])))
    if not regions:
        raise UserError("no AWS region: pass --region, or set AWS_REGION / AWS_DEFAULT_REGION or a profile's region")
    aws.require_credentials(session)
    now = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    progress = progress or Progress()
    report = Report(regions=regions, dry_run=not yes, now=now)
    report.planned, report.skipped, report.errors = discover(session, regions, now, progress.note)
    if not yes:
        return report
    clients = {r: Clients(session, r) for r in [*regions, GLOBAL]}
    mark_swept_holders(e.resource for e in report.planned)
    progress.start(len(report.planned))
    for kind in ORDER:
        entries = [e for e in report.planned if e.resource.kind == kind]
        if entries:
            _run_step(STEPS[kind], entries, clients, report, wait, poll, advance=progress.advance)
    progress.finish()
    return report
