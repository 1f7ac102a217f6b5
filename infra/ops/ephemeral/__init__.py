"""Ephemeral test stacks: `python -m infra ephemeral up | test | down`.

A short-lived copy of a small stack file (`Pulumi.test.yaml` unless `--from`
says otherwise) is deployed, checked and destroyed on the Pulumi Automation API.
Every AWS resource of it carries an `expires-at` tag, so whatever a failed
teardown leaves is deleted by the leak sweeper (infra/ops/sweep) once that time
has passed.

- commands.py: `up`, `test`, `down`, and the guard that tears a failed or
  interrupted `up` down; cli.py: their options (`python -m infra ephemeral`).
- naming.py: the stack's name, owner tag and expiry.
- config.py: its config, copied from the stack file with the lifecycle rewritten.
- state.py: the state file `.ephemeral/<stack>.json`, written before the stack exists.
- workspace.py: the `Workspace` seam to Pulumi (`PulumiWorkspace` on
  `pulumi.automation`, a fake in the tests), the Pulumi CLI, the backend.
"""

from infra.ops.ephemeral.commands import DESTROY_ATTEMPTS, Guard, down, test, up
from infra.ops.ephemeral.config import CHECKS_KEY, HF_TOKEN_KEY, LIFECYCLE_KEY, ephemeral_config
from infra.ops.ephemeral.naming import expires_at, owner_tag, stack_name
from infra.ops.ephemeral.state import State
from infra.ops.ephemeral.workspace import (
    ConfigItem,
    PulumiWorkspace,
    StackLocked,
    StackNotFound,
    Workspace,
    WorkspaceError,
    WorkspaceUnavailable,
)

__all__ = [
    "CHECKS_KEY", "DESTROY_ATTEMPTS", "HF_TOKEN_KEY", "LIFECYCLE_KEY",
    "ConfigItem", "Guard", "PulumiWorkspace", "StackLocked", "StackNotFound", "State",
    "Workspace", "WorkspaceError", "WorkspaceUnavailable",
    "down", "ephemeral_config", "expires_at", "owner_tag", "stack_name", "test", "up",
]  # fmt: skip
