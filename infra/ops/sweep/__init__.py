"""Leak sweeper: delete what failed teardowns of expired ephemeral stacks left behind.

    python -m infra sweep [--yes] [--region R ...] [--wait SECONDS] [--json]

Dry run by default: lists what it would delete and deletes nothing. `--yes`
deletes. Without `--region` it sweeps the region boto3's standard configuration
gives (AWS_REGION / AWS_DEFAULT_REGION / the profile's region); credentials come
from boto3's standard chain, and `AWS_ENDPOINT_URL` is honoured like any boto3
setting (infra/ops/aws.py). IAM roles are global: they are swept once per run.

The parts, in the order a run goes through them:

- selection.py: what is deleted: only resources whose own tags say project,
  lifecycle=ephemeral and an expires-at that has passed; everything else is left
  alone (and reported as skipped when it is the project's).
- listing.py: discovery per service and region, and the untagged parts that go
  with a swept parent.
- deleting.py: the deleters and their order (dependents first).
- run.py: the steps in that order, retries and bounded waiting (`--wait`), progress.
- report.py: the tables; records.py: what they are made of (`Report.to_json_dict`
  is `--json`).

Exit status: 0 when nothing failed, 1 when a deletion or a listing failed, 2 when
boto3 has no region or credentials.
"""

from infra.ops.sweep.deleting import ORDER, STEPS
from infra.ops.sweep.records import Entry, Report, Resource
from infra.ops.sweep.report import render
from infra.ops.sweep.run import RichProgress, sweep
from infra.ops.sweep.selection import verdict

__all__ = ["ORDER", "STEPS", "Entry", "Report", "Resource", "RichProgress", "render", "sweep", "verdict"]
