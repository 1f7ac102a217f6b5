"""The sweep's report as a person reads it: rich tables of what was (or would be) deleted,
what failed, what was skipped and why, and a one-line verdict."""

from __future__ import annotations

from infra.aws.tags import PROJECT_TAG
from infra.config import PROJECT
from infra.ops.sweep.records import Entry, Report, Resource


def _short(r: Resource) -> str:
    # An ELBv2 ARN is long: show its name and the tail of the ARN.
    if r.kind.startswith("elbv2:") and "/" in r.id:
        return r.id.split(":", 5)[-1]
    return r.id


def render(report: Report, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    def table(title: str, entries: list[Entry], detail: str) -> None:
        t = Table(title=title, title_justify="left", title_style="bold")
        for col in ("region", "kind", "id", "name", "stack", "expires-at", detail):
            t.add_column(col, overflow="fold")
        for e in entries:
            r = e.resource
            t.add_row(*(escape(x) for x in (r.region, r.kind, _short(r), r.name if r.name != r.id else "", r.stack,
                                           r.expires_at, e.detail)))  # fmt: skip
        console.print(t)

    when = report.now.strftime("%Y-%m-%dT%H:%M:%SZ")
    scope = ", ".join(report.regions) + " and IAM (global)"
    if report.dry_run:
        if report.planned:
            table(f"Would delete ({len(report.planned)}), expired before {when}", report.planned, "why")
        else:
            console.print(f"Nothing to delete in {escape(scope)}: no expired ephemeral resources (as of {when}).")
    else:
        if report.deleted:
            table(f"Deleted ({len(report.deleted)})", report.deleted, "detail")
        if report.failed:
            table(f"Failed ({len(report.failed)})", report.failed, "error")
        if not report.planned:
            console.print(f"Nothing to delete in {escape(scope)}: no expired ephemeral resources (as of {when}).")
    if report.skipped:
        table(f"Skipped ({len(report.skipped)}): tagged {PROJECT_TAG}={PROJECT} but not to be deleted", report.skipped, "why")
    for err in report.errors:
        console.print(f"[red]could not look:[/red] {escape(err)}", soft_wrap=True)
    if report.dry_run:
        tail = f"dry run: {len(report.planned)} to delete, {len(report.skipped)} skipped; rerun with --yes to delete."
    else:
        tail = f"{len(report.deleted)} deleted, {len(report.failed)} failed, {len(report.skipped)} skipped."
    if report.errors:
        tail += f" {len(report.errors)} listing(s) failed."
    console.print(("[green]" if report.ok else "[red]") + escape(tail) + ("[/green]" if report.ok else "[/red]"))
