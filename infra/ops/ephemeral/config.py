"""The config of a new ephemeral stack: a copy of a small stack file's, its lifecycle rewritten.

`gpu-serving:lifecycle` becomes {production: false, owner, expiresAt}: every
AWS resource carries the `expires-at` tag through the provider's default tags
(infra.aws.tags), so the leak sweeper can delete what a failed teardown leaves.
The way into the cluster API: `up` runs `pulumi up` in one go, so the stack
must be reachable from where it runs. With `deployer_cidrs` (the CI runner's
egress address, read at run time) the copy uses `endpointAccess:
public-restricted` open to those CIDRs only; without them the template's mode
must be one that needs no tunnel opened half-way (`private-ssm` does: it is
refused with what to pass instead).
The EFA check (NCCL all-reduce across two nodes) is switched on at bring-up when
the instance type has EFA and there are >= 2 nodes: it needs GPU nodes the
serving pods do not hold yet, so it can only run before the RayCluster takes
them (components/serving.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from infra.catalog.eks import PRIVATE_SSM, PUBLIC_RESTRICTED
from infra.config import PROJECT, REPO_ROOT, SECRET_KEYS, StackConfig, from_mapping, load_stack_file, read_stack_file, stack_file_name
from infra.errors import UserError
from infra.ops.ephemeral.workspace import ConfigItem

DEFAULT_TEMPLATE = "test"

LIFECYCLE_KEY = f"{PROJECT}:lifecycle"
CLUSTER_KEY = f"{PROJECT}:cluster"
CHECKS_KEY = f"{PROJECT}:checks"
HF_TOKEN_KEY = f"{PROJECT}:hfToken"
HF_TOKEN_ENV = "HF_TOKEN"


def efa_check_applies(cfg: StackConfig) -> bool:
    """The EFA check runs an all-reduce across two nodes of an EFA instance type."""
    from infra.catalog.instances import INSTANCE_TYPES
    from infra.k8s.serving_spec import EFA_CHECK_NODES

    it = INSTANCE_TYPES.get(cfg.gpu.instance_type)
    return it is not None and it.max_efa_interfaces > 0 and cfg.gpu.nodes >= EFA_CHECK_NODES


def _encode(value: Any) -> str:
    """As the Pulumi CLI hands config to a program: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def program_config(stack: str, values: Mapping[str, ConfigItem], source: str) -> StackConfig:
    """Validate config items the way the program will read them (`pulumi.Config.get_object` decodes JSON)."""
    areas: dict[str, Any] = {}
    region = None
    for key, item in values.items():
        namespace, _, name = key.partition(":")
        if key == "aws:region":
            region = item.value
        elif namespace == PROJECT and name not in SECRET_KEYS:
            try:
                areas[name] = json.loads(item.value)
            except json.JSONDecodeError:
                areas[name] = item.value
    return from_mapping(stack, areas, region=region, source=source)


def ephemeral_config(
    template: str,
    *,
    stack: str,
    owner: str,
    expiry: str,
    efa: Optional[bool] = None,
    deployer_cidrs: Sequence[str] = (),
    root: Path = REPO_ROOT,
    env: Mapping[str, str] | None = None,
) -> tuple[dict[str, ConfigItem], list[str]]:
    """The new stack's config: the template's, lifecycle rewritten, the EFA check decided; and notes for the log.

    Refuses a production template. Secrets of the template are encrypted for that
    stack and are not copied; `$HF_TOKEN`, when set, becomes `gpu-serving:hfToken`.
    """
    env = os.environ if env is None else env
    source = stack_file_name(template)
    cfg = load_stack_file(template, root)  # the template must be valid itself
    if cfg.lifecycle.production:
        raise UserError(
            f"{source} is a production stack ({LIFECYCLE_KEY}.production is true); ephemeral stacks are made only "
            f"from non-production stack files such as {stack_file_name(DEFAULT_TEMPLATE)}"
        )
    raw = read_stack_file(template, root)
    notes: list[str] = []
    out: dict[str, ConfigItem] = {}
    for key, value in raw.items():
        key = str(key)
        if isinstance(value, dict) and set(value) == {"secure"}:
            notes.append(f"{key} is a secret of {source}, encrypted for that stack: not copied")
            continue
        if key in (LIFECYCLE_KEY, CLUSTER_KEY):
            continue
        out[key] = ConfigItem(_encode(value))
    out[LIFECYCLE_KEY] = ConfigItem(json.dumps({"production": False, "owner": owner, "expiresAt": expiry}))
    cluster = dict(raw.get(CLUSTER_KEY) or {})
    if deployer_cidrs:
        cluster.update(endpointAccess=PUBLIC_RESTRICTED, deployerCidrs=list(deployer_cidrs))
        notes.append(f"API endpoint: public, open to {', '.join(deployer_cidrs)} only (--deployer-cidr)")
    elif cfg.cluster.endpoint_access == PRIVATE_SSM:
        raise UserError(
            f"{source} reaches the API through an SSM tunnel (gpu-serving:cluster.endpointAccess: private-ssm), which "
            "must be opened between two `pulumi up` runs; `ephemeral up` runs one: pass --deployer-cidr with the "
            "public address `up` runs from (e.g. --deployer-cidr \"$(curl -fsS https://checkip.amazonaws.com)/32\"), "
            "so the copy's endpoint is public-restricted to it"
        )
    if cluster:
        out[CLUSTER_KEY] = ConfigItem(json.dumps(cluster))

    checks = dict(raw.get(CHECKS_KEY) or {})
    applies = efa_check_applies(cfg)
    if efa and not applies:
        raise UserError(
            f"--efa: the EFA check runs across 2 or more nodes of an EFA instance type; {source} has "
            f"{cfg.gpu.nodes} x {cfg.gpu.instance_type}"
        )
    want_efa = applies if efa is None else efa
    if CHECKS_KEY in raw or want_efa:
        checks["efa"] = want_efa
        out[CHECKS_KEY] = ConfigItem(json.dumps(checks))
    notes.append(
        "EFA check at bring-up: on" if want_efa else
        f"EFA check: off ({cfg.gpu.nodes} x {cfg.gpu.instance_type}" + ("" if applies else ": needs 2+ nodes with EFA") + ")"
    )
    token = env.get(HF_TOKEN_ENV)
    if token:
        out[HF_TOKEN_KEY] = ConfigItem(token, secret=True)
        notes.append(f"{HF_TOKEN_KEY}: from ${HF_TOKEN_ENV} (secret)")
    program_config(stack, out, source=f"ephemeral stack {stack} (from {source})")
    return out, notes
