"""The names, owners and expiry times of ephemeral stacks.

A stack is `eph-<run id, base 36>-<attempt>` in GitHub Actions (a re-run gets
its own) or `eph-<8 hex>` elsewhere; its owner tag is `--owner`, else the
GitHub actor, else the local user; it expires `--ttl` hours after `up` began.
"""

from __future__ import annotations

import datetime as dt
import getpass
import re
import secrets
from typing import Callable, Mapping

from infra.errors import UserError

NAME_PREFIX = "eph-"
DEFAULT_TTL_HOURS = 6.0
MAX_TTL_HOURS = 7 * 24.0


def base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def stack_name(env: Mapping[str, str], token: Callable[[int], str] = secrets.token_hex) -> str:
    """`eph-<run id in base 36>-<attempt>` in GitHub Actions (a re-run gets its own), else `eph-<8 random hex digits>`.

    Short on purpose: the stack name goes into every resource name (the EKS
    cluster is `gpu-serving-<stack>`, IAM roles `gpu-serving-<stack>-...-role`
    plus Pulumi's 8-character suffix, and IAM allows 64 characters).
    """
    run_id = (env.get("GITHUB_RUN_ID") or "").strip()
    if run_id.isdigit():
        attempt = (env.get("GITHUB_RUN_ATTEMPT") or "1").strip()
        return f"{NAME_PREFIX}{base36(int(run_id))}-{attempt if attempt.isdigit() else '1'}"
    return f"{NAME_PREFIX}{token(4)}"


# AWS tag values (IAM is the strictest of the services tagged): letters, digits, spaces and _ . : / = + - @
_TAG_UNSAFE = re.compile(r"[^\w .:/=+@-]")


def owner_tag(explicit: str | None, env: Mapping[str, str]) -> str:
    """`--owner`, else $GITHUB_ACTOR, else the local user; made safe as an AWS tag value."""
    raw = explicit or env.get("GITHUB_ACTOR") or _local_user()
    owner = _TAG_UNSAFE.sub("-", raw or "").strip(" -")[:128]
    if not owner:
        raise UserError(f"owner {raw!r} has nothing usable as an AWS tag value; give --owner NAME")
    return owner


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database entry (containers)
        return ""


def expires_at(now: dt.datetime, ttl_hours: float) -> str:
    """now + ttl as ISO 8601 UTC with a Z, to the second (the form gpu-serving:lifecycle.expiresAt takes)."""
    if not (0 < ttl_hours <= MAX_TTL_HOURS):
        raise UserError(f"--ttl {ttl_hours:g} is out of range; allowed: more than 0 and at most {MAX_TTL_HOURS:g} hours")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    when = now.astimezone(dt.timezone.utc) + dt.timedelta(hours=ttl_hours)
    return when.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
