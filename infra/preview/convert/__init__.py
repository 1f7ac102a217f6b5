"""A synth document (`infra.preview.synth`) in the formats other scanners read.

- `terraform.plan(doc)`: its `aws:*` resources as a Terraform plan (`terraform
  show -json`); pulumi-aws is the bridged Terraform AWS provider, so each
  resource is the Terraform resource it is built on.
- `kubernetes.manifests(doc)`: its `kubernetes:*` resources as manifests, with
  one Pod per pod template inside a custom resource (the RayCluster's head and
  worker groups).

Both are pure functions of the document. What they cannot convert is listed in
the result (`gaps`), never dropped silently: `python -m infra scan` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    """Something of the document a conversion could not carry over, and why."""

    resource: str  # the synth resource's name ("" for the whole document)
    type: str  # its Pulumi type token
    reason: str
    # True when the conversion failed (a type it does not know): the scan fails. False for
    # what is known not to convert offline (a Helm release): reported, not failed.
    blocking: bool = False

    def to_json_dict(self) -> dict[str, object]:
        return {"resource": self.resource, "type": self.type, "reason": self.reason, "blocking": self.blocking}
