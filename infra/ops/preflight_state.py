"""Pre-flight check 10 (infra/ops/preflight.py's module doc): where the stack's state lives. No AWS call."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from infra.ops.preflight import Check, Target


def state_backend(root, environ) -> tuple[Optional[str], str]:
    """(URL, where it is set) of the backend `pulumi` uses for this project: PULUMI_BACKEND_URL, which takes
    precedence over the project's choice (pulumi/pulumi#5789, "instead of deferring to the project or the
    ~/.pulumi/credentials.json file"), else Pulumi.yaml's `backend.url`; None: the current `pulumi login`, which
    comes last (pulumi/pulumi GetCurrentCloudURLWithSource: environment, project, stored credentials)."""
    import yaml

    from infra.config import REPO_ROOT

    if environ.get("PULUMI_BACKEND_URL"):
        return environ["PULUMI_BACKEND_URL"], "PULUMI_BACKEND_URL"
    project = (Path(root) if root is not None else REPO_ROOT) / "Pulumi.yaml"
    try:
        url = ((yaml.safe_load(project.read_text()) or {}).get("backend") or {}).get("url")
    except (OSError, yaml.YAMLError):
        url = None
    return (url, "Pulumi.yaml backend.url") if url else (None, "the current `pulumi login`")


def check_state_backend(t: Target) -> Check:
    """Where the stack's state lives. A production stack on a local file backend is a go with a warning: one
    machine holds the only copy of the state, with no locking against a second `pulumi up` and no versions to
    go back to (docs/deploying.md, "Where the state lives")."""
    name = "Pulumi state backend"
    url, source = t.backend_url, t.backend_source
    if url is None:
        detail = f"not set in the project or the environment: {source} decides (`pulumi whoami -v` shows it)"
        if t.production:
            return Check(name, True, detail, STATE_FIX, "production state: make sure it is not a local file")
        return Check(name, True, detail)
    detail = f"{url} ({source})"
    if t.production and url.startswith("file://"):
        return Check(name, True, detail, STATE_FIX,
                     "production state in a local file: one machine's copy, no locking, no versions to go back to")  # fmt: skip
    return Check(name, True, detail)


STATE_FIX = (
    "keep production state in S3 with versioning and a KMS secrets provider: `export PULUMI_BACKEND_URL=s3://<bucket>` "
    "(Pulumi.yaml's backend.url wins over a `pulumi login`) and `pulumi stack init prod --secrets-provider "
    "'awskms://alias/<key>?region=<region>'` (docs/deploying.md, \"Where the state lives\")"
)
