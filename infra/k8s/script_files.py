"""Pod scripts as files: read from `infra/k8s/scripts/`, shipped in a ConfigMap, mounted read-only.

Pure. A builder names the scripts a ConfigMap carries; `config_map()` makes the
`v1 ConfigMap`, `volume()` and `volume_mount()` put it at `MOUNT_PATH` in a pod
(mode 0555, read-only), and `content_hash()` of the scripts a pod runs goes in
its template's `HASH_ANNOTATION`, so a changed script changes the template and
the pod is replaced (a Job re-created, the RayCluster's pods recreated).

The ConfigMap's name is fixed. pulumi-kubernetes replaces a ConfigMap whose
data changes, deleting it first when the name stays (its Diff sets
deleteBeforeReplace for a named object); the engine then replaces only the
dependents whose inputs reference the ConfigMap (step_generator.go,
calculateDependentReplacements), and the pods name it as a plain string, so
nothing else is deleted with it. Running pods keep the files they mounted.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
MOUNT_PATH = "/opt/gpu-serving"
VOLUME_NAME = "scripts"
DEFAULT_MODE = 0o555  # read and execute; ConfigMap volumes are read-only whatever the mode
HASH_ANNOTATION = "gpu-serving/scripts-hash"
# The API server refuses a ConfigMap of more than 1 MiB (Kubernetes docs, "ConfigMaps").
MAX_CONFIG_MAP_BYTES = 2**20


@lru_cache(maxsize=None)
def read(name: str) -> str:
    """The text of one script of the folder."""
    path = SCRIPTS_DIR / name
    if path.parent != SCRIPTS_DIR or not path.is_file():
        raise ValueError(f"no script {name!r} in {SCRIPTS_DIR}")
    return path.read_text()


def files(names: Iterable[str]) -> dict[str, str]:
    """File name -> text, as a ConfigMap's `data` holds them."""
    return {name: read(name) for name in sorted(set(names))}


def content_hash(names: Iterable[str]) -> str:
    """A short hash of the scripts' names and text."""
    doc = json.dumps(files(names), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def path(name: str) -> str:
    """Where a pod finds a script."""
    read(name)
    return f"{MOUNT_PATH}/{name}"


def config_map(name: str, namespace: str, names: Iterable[str], labels: Mapping[str, str]) -> dict:
    names = sorted(set(names))
    data = files(names)
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    if size > MAX_CONFIG_MAP_BYTES:
        raise ValueError(f"the scripts of ConfigMap {name} take {size} bytes, more than a ConfigMap holds")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {HASH_ANNOTATION: content_hash(names)},
        },
        "data": data,
    }


def volume(config_map_name: str) -> dict:
    return {"name": VOLUME_NAME, "configMap": {"name": config_map_name, "defaultMode": DEFAULT_MODE}}


def volume_mount() -> dict:
    return {"name": VOLUME_NAME, "mountPath": MOUNT_PATH, "readOnly": True}


def hash_annotation(names: Iterable[str]) -> dict[str, str]:
    """The pod template annotation that changes with the scripts the pod runs."""
    return {HASH_ANNOTATION: content_hash(names)}
