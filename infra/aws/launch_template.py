"""What the stack's launch templates (system nodes, GPU nodes, the SSM bastion) have in common.

- `metadata_options`: IMDSv2 only (EC2 LaunchTemplateHttpTokensState
  `required`), the endpoint on, and a hop limit of 1 unless a caller needs 2
  (why 1: components/gpu_nodes.py). Pulumi argument names, for a launch
  template's or an instance's metadata options.
- `template_version`: a template's `latest_version` as the string an EKS node
  group or an EC2 instance takes.
"""

from __future__ import annotations

from typing import Any, Optional

IMDS_TOKENS = "required"  # EC2 LaunchTemplateHttpTokensState: IMDSv2 only
IMDS_ENDPOINT = "enabled"  # EC2 LaunchTemplateInstanceMetadataEndpointState


def metadata_options(hop_limit: int = 1) -> dict[str, Any]:
    """IMDSv2 only, with `hop_limit` (pulumi_aws argument names)."""
    return {"http_endpoint": IMDS_ENDPOINT, "http_tokens": IMDS_TOKENS, "http_put_response_hop_limit": hop_limit}


def template_version(version: Any) -> Optional[str]:
    """A launch template's latest version is an integer (a float under the mocks); EKS and EC2 want a string."""
    return None if version is None else str(int(version))
