"""A copy of the project (symbolic links) whose stack file carries some edits: a "head" for the synth diff."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def edited_project(root: Path, stack: str, edits) -> Path:
    """Links to the project's files under `root`, with each (line, replacement) applied to Pulumi.<stack>.yaml."""
    root.mkdir(parents=True)
    for f in REPO.iterdir():
        if f.name in ("venv", ".git") or f.name.startswith("Pulumi."):
            continue
        (root / f.name).symlink_to(f)
    for f in REPO.glob("Pulumi.*yaml"):
        text = f.read_text()
        if f.name == f"Pulumi.{stack}.yaml":
            for old, new in edits:
                assert text.count(old) == 1, f"{old!r} is not one line of {f.name}"
                text = text.replace(old, new)
        (root / f.name).write_text(text)
    return root
