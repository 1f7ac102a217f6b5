"""`python -m infra ephemeral up | test | down` (typer): the options, and one line per usage error."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from infra.errors import UserError
from infra.ops.ephemeral.commands import EXIT_USAGE, down, test, up
from infra.ops.ephemeral.config import DEFAULT_TEMPLATE
from infra.ops.ephemeral.naming import DEFAULT_TTL_HOURS
from infra.ops.ephemeral.state import STATE_DIR
from infra.ops.ephemeral.workspace import stderr

app = typer.Typer(
    name="ephemeral",
    add_completion=False,
    no_args_is_help=True,
    help="Short-lived test stacks (Pulumi Automation API): up, test, down.",
)

_STATE_DIR_HELP = "Where state files live (one per stack)."


def _run(fn: Callable[[], int]) -> None:
    try:
        code = fn()
    except UserError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        stderr("error: " + ("; ".join(lines) if lines else str(err)))
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(code)


@app.command("up")
def up_command(
    template: str = typer.Option(DEFAULT_TEMPLATE, "--from", help="Copy the config of Pulumi.<STACK>.yaml (not a production stack)."),
    owner: Optional[str] = typer.Option(None, help="The owner tag (default: $GITHUB_ACTOR, else your user name)."),
    ttl: float = typer.Option(DEFAULT_TTL_HOURS, "--ttl", help="Hours until expires-at; the sweeper deletes what is left after that."),
    efa: Optional[bool] = typer.Option(None, "--efa/--no-efa", help="Run the EFA check at bring-up (default: when the instance type has EFA and there are 2+ nodes)."),
    deployer_cidr: list[str] = typer.Option([], "--deployer-cidr", help="Open the public API endpoint to this CIDR only (repeatable): where `up` runs from, e.g. the CI runner's egress IP as a /32."),
    keep_on_failure: bool = typer.Option(False, "--keep-on-failure", help="Keep a stack whose up failed, for debugging (no teardown)."),
    backend: Optional[str] = typer.Option(None, help="State backend URL (default: $PULUMI_BACKEND_URL, else Pulumi.yaml's)."),
    state_dir: Path = typer.Option(STATE_DIR, "--state-dir", help=_STATE_DIR_HELP),
) -> None:
    """Create a unique stack from a small stack file and deploy it; a failed up tears it down."""
    _run(lambda: up(template=template, owner=owner, ttl_hours=ttl, efa=efa, deployer_cidrs=tuple(deployer_cidr),
                    keep_on_failure=keep_on_failure, backend=backend, state_dir=state_dir))


@app.command("test")
def test_command(
    stack: Optional[str] = typer.Option(None, help="The stack (default: the one recorded in --state-dir)."),
    state_dir: Path = typer.Option(STATE_DIR, "--state-dir", help=_STATE_DIR_HELP),
) -> None:
    """Run the post-deploy checks: switch the serving benchmark on and up again (the Job must pass)."""
    _run(lambda: test(stack=stack, state_dir=state_dir))


@app.command("down")
def down_command(
    stack: Optional[str] = typer.Option(None, help="The stack (default: the one recorded in --state-dir)."),
    backend: Optional[str] = typer.Option(None, help="State backend URL (default: the state file's, else $PULUMI_BACKEND_URL)."),
    force_unlock: bool = typer.Option(False, "--force-unlock", help="Cancel a lock held by an update that is not running."),
    state_dir: Path = typer.Option(STATE_DIR, "--state-dir", help=_STATE_DIR_HELP),
) -> None:
    """Destroy and remove the ephemeral stack, then delete its state file."""
    _run(lambda: down(stack=stack, backend=backend, force_unlock=force_unlock, state_dir=state_dir))
