"""What the boto3 tools (pre-flight, leak sweeper) share: the session, AWS's errors, tags, pages.

- `new_session`: a boto3 session from the standard configuration (credentials from
  boto3's chain: environment, shared files, SSO, instance role; `AWS_ENDPOINT_URL`
  honoured like any boto3 setting). The tools call it through this module, so a
  test replaces it in one place.
- `require_credentials`: the one message for "boto3 found no credentials".
- `error`, `error_code`, `error_text`: AWS's error code and message out of a
  botocore `ClientError`, and one line of it for a report.
- `is_denied`, `is_gone`: the two questions the tools ask of an error (no
  permission: say which; already deleted: nothing to do).
- `tag_dict`: an AWS tag list (`[{"Key": k, "Value": v}]`, or KMS's TagKey/TagValue)
  as a dict.
- `pages`: every item of a list operation, paginated where boto3 can.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Mapping, Optional

from infra.errors import UserError

DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedException"})
GONE_CODES = frozenset({"NoSuchEntity", "ResourceNotFoundException", "FileSystemNotFound", "MountTargetNotFound"})


def new_session(region: Optional[str] = None):
    """A boto3 session from the standard configuration (tests replace this)."""
    import boto3

    return boto3.session.Session(region_name=region)


def require_credentials(session) -> None:
    """Raise UserError when boto3's standard chain finds no credentials for `session`."""
    if session.get_credentials() is None:
        raise UserError(
            "no AWS credentials: configure them the standard boto3 way (AWS_PROFILE, AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY, SSO, or an instance role)"
        )


def error(exc: Exception) -> tuple[str, str]:
    """(code, message) of an AWS error; ('', text) for anything else."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error") or {}
        return str(err.get("Code", "")), str(err.get("Message", "")) or str(exc)
    return "", str(exc)


def error_code(exc: Exception) -> str:
    """AWS's error code (`DependencyViolation`, `AccessDenied`, ...); '' when `exc` is not an AWS error."""
    return error(exc)[0]


def error_text(exc: Exception, limit: Optional[int] = None) -> str:
    """One line for a report: `Code: message`.

    An error that is not AWS's is named by its type (`EndpointConnectionError: ...`).
    An HTML error page (a proxy, an emulator) is reduced to its title, which says
    it all (`HTTP error page: 500 Internal Server Error`). With `limit`, the
    message is cut to that many characters.
    """
    code, message = error(exc)
    if not isinstance(getattr(exc, "response", None), dict):
        code = type(exc).__name__
    title = re.search(r"<title>(.*?)</title>", message, re.S | re.I)
    if title:
        code, message = "", f"HTTP error page: {title.group(1).strip()}"
    message = " ".join(message.split())
    if limit is not None and len(message) > limit:
        message = message[:limit] + "..."
    return f"{code}: {message}" if code else message


def is_denied(exc: Exception) -> bool:
    """AWS refused the call for lack of permission."""
    return error_code(exc) in DENIED_CODES


def is_gone(exc: Exception) -> bool:
    """AWS says the resource does not exist (any more)."""
    code = error_code(exc)
    return "NotFound" in code or code in GONE_CODES


def tag_dict(items: Optional[Iterable[Mapping[str, Any]]], key: str = "Key", value: str = "Value") -> dict[str, str]:
    """An AWS tag list as a dict (KMS names the fields TagKey/TagValue)."""
    return {str(t[key]): str(t.get(value, "")) for t in items or [] if key in t}


def pages(client, op: str, key: str, **kwargs) -> Iterator[dict]:
    """Every item under `key` of list operation `op`, over all pages where boto3 paginates it."""
    if client.can_paginate(op):
        for page in client.get_paginator(op).paginate(**kwargs):
            yield from page.get(key, [])
    else:
        yield from getattr(client, op)(**kwargs).get(key, [])
