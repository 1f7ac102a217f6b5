"""The images' pinned inputs (issue 19 item 6): base by digest, installer by checksum, pip by hash.

These read the real build files (images/vllm, images/staging) and what bin/build-image does with
them; the data each pin came from is named beside it in those files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra.errors import UserError
from infra.k8s.serving_image import SERVING_IMAGE_DIR, by_digest, has_digest, pinned_ray_version, serving_image_tag

REPO = Path(__file__).resolve().parent.parent
VLLM = REPO / "images" / "vllm"
STAGING = REPO / "images" / "staging"


def _requirements(path: Path) -> dict[str, list[str]]:
    """name==version -> its hashes, from a pip requirements file with backslash continuations."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#")))
    out = {}
    for line in filter(None, (line.strip() for line in text.splitlines())):
        pin, *options = line.split()
        out[pin] = [o.removeprefix("--hash=sha256:") for o in options]
    return out


@pytest.mark.parametrize("path", [VLLM / "requirements-ray.txt", STAGING / "requirements.txt"])
def test_every_pip_install_is_one_version_with_its_wheels_sha256(path):
    reqs = _requirements(path)
    assert reqs
    for pin, hashes in reqs.items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*==[0-9][0-9a-z.]*", pin), pin
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), pin


def test_the_ray_set_is_complete_for_ray_default():
    """--require-hashes needs every package Ray's `default` extra brings: each named in Ray's own metadata is pinned."""
    names = {pin.split("==")[0] for pin in _requirements(VLLM / "requirements-ray.txt")}
    # ray 2.60.0's Requires-Dist (base and extra == "default"), as its wheel's METADATA lists them.
    ray_default = {"click", "filelock", "jsonschema", "msgpack", "packaging", "protobuf", "pyyaml", "requests",
                   "aiohttp", "aiohttp-cors", "colorful", "py-spy", "grpcio", "opencensus", "opentelemetry-sdk",
                   "opentelemetry-exporter-prometheus", "opentelemetry-proto", "pydantic", "prometheus-client",
                   "smart-open", "virtualenv"}  # fmt: skip
    assert ray_default <= names, ray_default - names
    assert pinned_ray_version() == "2.60.0"


def test_the_serving_dockerfile_installs_only_pinned_inputs():
    text = (VLLM / "Dockerfile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}$", code, re.M)  # the digest bin/build-image resolved
    assert '*@sha256:*) ;; *) echo' in code  # and a tag alone fails the build
    sha = re.search(r"^ARG EFA_INSTALLER_SHA256=([0-9a-f]{64})$", code, re.M)
    assert sha and 'sha256sum -c -' in code and code.index("sha256sum -c -") < code.index("tar -xf efa.tar.gz")
    # Every pip install goes through the hash-pinned file, and the result is checked.
    installs = re.findall(r"pip install[^\n]*", code)
    assert installs and all("--require-hashes" in i and "-r /tmp/requirements-ray.txt" in i for i in installs)
    assert "pip check" in code


def test_bin_build_image_builds_both_images_from_a_digest_and_prints_what_it_pushed():
    script = (REPO / "bin" / "build-image").read_text()
    assert '--build-arg VLLM_IMAGE="$vllm_base_digest"' in script
    assert '--build-arg PYTHON_IMAGE="$base_digest"' in script
    assert "serving_image_tag(" in script and "imageDigest" in script


def test_the_serving_tag_follows_what_the_image_is_built_from(tmp_path):
    for name in ("Dockerfile", "requirements-ray.txt"):
        (tmp_path / name).write_text((SERVING_IMAGE_DIR / name).read_text())
    tag = serving_image_tag("0.34.0", "2.60.0")
    assert tag.startswith("0.34.0-ray2.60.0-") and serving_image_tag("0.34.0", "2.60.0", tmp_path) == tag
    (tmp_path / "Dockerfile").write_text((SERVING_IMAGE_DIR / "Dockerfile").read_text() + "\n# changed\n")
    assert serving_image_tag("0.34.0", "2.60.0", tmp_path) != tag


def test_a_ray_version_the_image_does_not_install_is_refused_naming_the_key():
    with pytest.raises(UserError, match=r"gpu-serving:serving.rayVersion is 2.59.0.*installs Ray 2.60.0"):
        serving_image_tag("0.34.0", "2.59.0")


def test_image_references_by_digest():
    digest = "sha256:" + "0123456789abcdef" * 4
    ref = by_digest("123456789012.dkr.ecr.us-east-1.amazonaws.com/c/vllm", "t", digest)
    assert ref.endswith(":t@" + digest) and has_digest(ref)
    assert not has_digest("vllm/vllm-openai:v0.34.0")
    with pytest.raises(ValueError):
        by_digest("r", "t", "sha256:short")
