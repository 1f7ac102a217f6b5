"""What the sweep finds and what it reports: a `Resource`, an `Entry` (a resource and
why or what happened), the `Report` of one run."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from infra.aws.tags import EXPIRES_TAG, STACK_TAG

GLOBAL = "global"  # the "region" of IAM roles


@dataclass
class Resource:
    kind: str  # one of ORDER (deleting.py)
    id: str
    region: str
    tags: dict[str, str] = field(default_factory=dict)
    name: str = ""
    parent: str = ""  # for parts deleted with a tagged parent: "efs:file-system fs-1"
    data: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def stack(self) -> str:
        return self.tags.get(STACK_TAG, "")

    @property
    def expires_at(self) -> str:
        return self.tags.get(EXPIRES_TAG, "")

    def label(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.name})" if self.name and self.name != self.id else "")

    def to_json_dict(self) -> dict:
        return {
            "region": self.region, "kind": self.kind, "id": self.id, "name": self.name,
            "stack": self.stack, "expires_at": self.expires_at, "parent": self.parent,
        }  # fmt: skip


@dataclass
class Entry:
    resource: Resource
    detail: str = ""

    def to_json_dict(self) -> dict:
        return {**self.resource.to_json_dict(), "detail": self.detail}


@dataclass
class Report:
    regions: list[str]
    dry_run: bool
    now: dt.datetime
    planned: list[Entry] = field(default_factory=list)  # what the sweep deletes (or would)
    deleted: list[Entry] = field(default_factory=list)
    failed: list[Entry] = field(default_factory=list)
    skipped: list[Entry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # listings that failed: what could not be looked at

    @property
    def ok(self) -> bool:
        return not self.failed and not self.errors

    def to_json_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "now": self.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "regions": list(self.regions),
            "would_delete" if self.dry_run else "planned": [e.to_json_dict() for e in self.planned],
            "deleted": [e.to_json_dict() for e in self.deleted],
            "failed": [e.to_json_dict() for e in self.failed],
            "skipped": [e.to_json_dict() for e in self.skipped],
            "errors": list(self.errors),
            "ok": self.ok,
        }
