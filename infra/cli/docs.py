"""`python -m infra docs`: rewrite the generated regions of README.md and docs/ (infra/docs.py)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from infra.docs import generate

REPO = Path(__file__).resolve().parents[2]


def docs(
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when a page is out of date."),
) -> None:
    """Rewrite the generated parts of README.md and docs/ (config reference, plan figures, command output) from the code."""
    console = Console()
    stale = generate(REPO)
    for page in stale:
        rel = page.path.relative_to(REPO)
        if check:
            console.print(f"out of date: {rel} (run `python -m infra docs`)", soft_wrap=True)
        else:
            page.path.write_text(page.text)
            console.print(f"rewrote {rel}", soft_wrap=True)
    if not stale:
        console.print("every generated region is up to date")
    if check and stale:
        raise typer.Exit(1)
