"""How a synth document (`infra.preview.synth`) writes what the offline synthesis cannot know.

- `COMPUTED` ("<computed>"): a value nobody knows before the cloud makes it;
- `SECRET` (`{"<secret>": true}`): a secret, its value left out;
- a placeholder `<kind:NAME>` (`<id:vpc>`, `<key-id:stack-key>`): the recording
  engine's (`infra.preview.recording`) stable answer for an output only the
  cloud knows, `kind` naming the output and NAME the resource.

Standard library only: `diff` and the conversions read documents without
importing Pulumi.
"""

from __future__ import annotations

import re
from typing import Any, Optional

COMPUTED = "<computed>"
SECRET_KEY = "<secret>"
SECRET = {SECRET_KEY: True}
_PLACEHOLDER = re.compile(r"^<([a-z][a-z-]*):(.+)>$")


def placeholder(kind: str, name: str) -> str:
    return f"<{kind}:{name}>"


def parse_placeholder(value: Any) -> Optional[tuple[str, str]]:
    """(kind, resource name) of a placeholder of a lowercase kind (`<id:NAME>`, `<cluster-sg:NAME>`), or None."""
    m = _PLACEHOLDER.match(value) if isinstance(value, str) else None
    return (m.group(1), m.group(2)) if m else None


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SECRET_KEY) is True and len(value) == 1
