"""Pre-flight check 11 (infra/ops/preflight_image.py): the serving image `pulumi up` runs by digest is in ECR.

Against a real moto server: ECR CreateRepository, PutImage (moto gives the pushed manifest a digest) and DescribeImages as moto answers them, including its RepositoryNotFoundException and
ImageNotFoundException.
"""

from __future__ import annotations

import dataclasses
import json

import boto3

from infra.aws import names
from infra.aws.tags import cluster_name
from infra.catalog.instances import get_instance_type
from infra.config import load_stack_file
from infra.config.areas import PROJECT
from infra.k8s.serving_image import serving_image_tag
from infra.ops import preflight as pf
from infra.ops import preflight_image as pfi
from tests.moto_server import REGION, aws, moto_server  # noqa: F401  (pytest fixtures)


def _target() -> pf.Target:
    """prod's repository and tag, as `target_from_stack` gives them (the stack file's config)."""
    repository, tag = pfi.image_to_check(load_stack_file("prod"), "prod")
    return pf.Target(stack="prod", region=REGION, instance=get_instance_type("p5.48xlarge"), nodes=4, zone=f"{REGION}a",
                     capacity_type="on-demand", reservation_id=None, kubernetes_version="1.35", production=True,
                     image_repository=repository, image_tag=tag)  # fmt: skip


def test_the_check_asks_for_what_the_stack_runs():
    cfg = load_stack_file("prod")
    repository, tag = pfi.image_to_check(cfg, "prod")
    # The repository components/stack.py creates, and the tag bin/build-image pushes (and the stack asks ECR for).
    assert repository == names.image_repository_name(cluster_name(PROJECT, "prod")) == "gpu-serving-prod/vllm"
    assert tag == serving_image_tag(cfg.serving.vllm_version, cfg.serving.ray_version)
    own = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"image": "registry/vllm@sha256:" + "a" * 64})})
    assert pfi.image_to_check(own, "prod") == (None, None)
    assert pfi.check_serving_image(None, dataclasses.replace(_target(), image_repository=None, image_tag=None)).ok is True


def test_a_new_stack_is_a_go_with_a_warning_to_push_beside_the_first_up(aws):
    check = pfi.check_serving_image(boto3.client("ecr", region_name=REGION), _target())
    assert check.ok is True and "does not exist yet" in check.detail
    assert "bin/build-image" in check.warning and "STACK=prod bin/build-image" in check.fix


def test_a_repository_without_the_tag_is_a_no_go_and_with_it_a_go(aws):
    ecr = boto3.client("ecr", region_name=REGION)
    t = _target()
    ecr.create_repository(repositoryName=t.image_repository, imageTagMutability="IMMUTABLE")
    missing = pfi.check_serving_image(ecr, t)
    assert missing.ok is False and f"{t.image_repository}:{t.image_tag} is not in ECR" in missing.detail
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": {"digest": "sha256:" + "1" * 64, "size": 1}, "layers": []})  # fmt: skip
    digest = ecr.put_image(repositoryName=t.image_repository, imageManifest=manifest, imageTag=t.image_tag)["image"]["imageId"]["imageDigest"]
    pushed = pfi.check_serving_image(ecr, t)
    assert digest.startswith("sha256:") and pushed.ok is True and pushed.detail == f"{t.image_repository}:{t.image_tag} is {digest}"
    # Another tag in the repository does not count.
    other = pfi.check_serving_image(ecr, dataclasses.replace(t, image_tag="0.33.0-ray2.60.0-000000000000"))
    assert other.ok is False
