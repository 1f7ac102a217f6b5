"""The serving image's reference: its tag in the stack's repository, and a digest to run it by.

`bin/build-image` builds `images/vllm/` (FROM the vLLM image's digest, the EFA
installer checked against its sha256, Ray installed by hash from
`requirements-ray.txt`) and pushes it at `serving_image_tag(...)`: the vLLM and
Ray versions and a hash of the files it is built from, so a changed pin or
Dockerfile is a new tag in the repository (whose tags are immutable), never a
re-push of an old one. The pods never run that tag alone: the stack asks the
repository for the digest the tag holds (the one `bin/build-image` pushed and
printed) and runs `<repository>:<tag>@<digest>`, so a restarted pod gets the
same image whatever happens to the tag. An image of one's own
(`gpu-serving:serving.image`) is given by digest in production
(`infra/config/stack.py`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from infra.errors import UserError

SERVING_IMAGE_DIR = Path(__file__).resolve().parents[2] / "images" / "vllm"
SERVING_IMAGE_FILES = ("Dockerfile", "requirements-ray.txt")

# `name@sha256:<64 hex>` or `name:tag@sha256:<64 hex>`: the registry resolves the digest, never the tag.
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def pinned_ray_version(image_dir: Path = SERVING_IMAGE_DIR) -> str:
    """The Ray release `requirements-ray.txt` installs (by hash)."""
    text = (image_dir / "requirements-ray.txt").read_text()
    found = re.findall(r"^ray==(\S+)", text, re.M)
    if len(found) != 1:
        raise ValueError(f"{image_dir / 'requirements-ray.txt'} should pin ray exactly once, found {found}")
    return found[0]


def serving_image_tag(vllm_version: str, ray_version: str, image_dir: Path = SERVING_IMAGE_DIR) -> str:
    """`<vllmVersion>-ray<rayVersion>-<hash of images/vllm>`: what bin/build-image pushes."""
    pinned = pinned_ray_version(image_dir)
    if pinned != ray_version:
        raise UserError(
            f"gpu-serving:serving.rayVersion is {ray_version}, but the serving image installs Ray {pinned} by hash "
            f"({image_dir.name}/requirements-ray.txt): set rayVersion to {pinned}, or pin the new release there first"
        )
    texts = {name: (image_dir / name).read_text() for name in SERVING_IMAGE_FILES}
    digest = hashlib.sha256("\0".join(f"{n}\0{t}" for n, t in sorted(texts.items())).encode()).hexdigest()[:12]
    return f"{vllm_version}-ray{ray_version}-{digest}"


def has_digest(image: str) -> bool:
    return bool(DIGEST.search(image))


def by_digest(repository_url: str, tag: str, digest: str) -> str:
    """`<repository>:<tag>@<digest>`: the tag for people, the digest for the registry."""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"{digest!r} is not an image digest (sha256:<64 hex digits>)")
    return f"{repository_url}:{tag}@{digest}"
