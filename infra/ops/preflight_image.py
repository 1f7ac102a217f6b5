"""Pre-flight check 11 (infra/ops/preflight.py's module doc): the serving image `pulumi up` will run is in ECR.

The serving pods run the image bin/build-image pushed by the digest its tag holds, which `pulumi up` asks ECR
for (components/stack.py, `_serving_image`); a tag not pushed yet fails the `up` at that lookup, after the
cluster, the nodes and the weight storage are created. Unless `gpu-serving:serving.image` names an image of
the user's own (by digest in production), this asks ECR for the tag first (DescribeImages).
"""

from __future__ import annotations

from typing import Any, Optional

from infra.ops import aws
from infra.ops.preflight import Check, Target

NAME = "serving image pushed"


def image_to_check(cfg: Any, stack: str) -> tuple[Optional[str], Optional[str]]:
    """(ECR repository, tag) of the image bin/build-image pushes for this stack; (None, None) when
    `gpu-serving:serving.image` names the image instead."""
    from infra.aws import names
    from infra.aws.tags import cluster_name
    from infra.config.areas import PROJECT
    from infra.k8s.serving_image import serving_image_tag

    if cfg.serving.image:
        return None, None
    repository = names.image_repository_name(cluster_name(PROJECT, stack))
    return repository, serving_image_tag(cfg.serving.vllm_version, cfg.serving.ray_version)


def check_serving_image(ecr: Any, t: Target) -> Check:
    """Go when the tag is in the repository (its digest shown), or when the repository does not exist yet (a new
    stack: the first `up` creates it, with a warning to push beside it); no-go when the repository exists
    without the tag; unknown when ECR cannot be asked."""
    if t.image_repository is None:
        return Check(NAME, True, "gpu-serving:serving.image names the image (run as given)")
    ref = f"{t.image_repository}:{t.image_tag}"
    fix = f"push it: `STACK={t.stack} bin/build-image` (it builds and pushes {t.image_tag})"
    try:
        found = ecr.describe_images(repositoryName=t.image_repository, imageIds=[{"imageTag": t.image_tag}])
    except Exception as exc:  # noqa: BLE001 - every AWS failure becomes the check's answer
        code = aws.error_code(exc)
        if code == "RepositoryNotFoundException":
            return Check(NAME, True, f"repository {t.image_repository} does not exist yet: the first `pulumi up` creates it",
                         fix, "run bin/build-image beside that `up`: it asks ECR for the tag's digest once the weight "
                              "storage exists, and stops there if the image is not pushed by then")  # fmt: skip
        if code == "ImageNotFoundException":
            return Check(NAME, False, f"{ref} is not in ECR: `pulumi up` would stop when it asks for its digest", fix)
        return Check(NAME, None, f"ECR DescribeImages failed: {aws.error_text(exc, limit=200)}", fix)
    details = found.get("imageDetails") or []
    if not details:
        return Check(NAME, False, f"{ref} is not in ECR: `pulumi up` would stop when it asks for its digest", fix)
    return Check(NAME, True, f"{ref} is {details[0].get('imageDigest', 'pushed')}")
