"""`python -m infra rollout` against a stand-in Kubernetes API on 127.0.0.1.

The stand-in (`FakeKube`, http.server in a thread) answers the GETs the command
makes, the way the API server does (list with label selectors, pod logs with
tailLines / limitBytes / previous, a custom resource, the Service proxy, Status
objects for errors), and moves one state further at each poll. What it serves
is built from the prod stack's own objects as `pulumi up` would create them
(the synthesised program: the staging Job, the RayCluster and its pod
templates) plus what the API server and the controllers add (uids, selectors,
pods, statuses); every Job, Pod and Status is validated against the Kubernetes
OpenAPI schema of the stack's version (kubernetes-validate, strict) and the
RayCluster against the KubeRay 1.7.0 CRD. The logs are what the pod programs
print when run here: stage_weights.py copying a checkpoint (its progress lines)
or failing on a missing source, ray_wait.py with a stand-in `ray` module.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import io
import json
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import jsonschema
import kubernetes_validate
import pytest
from typer.testing import CliRunner

from infra.catalog.eks_versions import today
from infra.cli import rollout as ro
from infra.cli.app import app
from infra.config import load_stack_file
from infra.k8s import script_files
from infra.k8s.scripts import stage_weights
from infra.ops.kubeapi import KubeApi, load_kubeconfig
from tests import yaml_text
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent
TOKEN = "k8s-aws-v1.test-token"
NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
NODE_NAMES = [f"ip-10-0-64-{10 + i}.ec2.internal" for i in range(4)]


def ts(minutes: float) -> str:
    """An RFC 3339 time `minutes` after two hours ago."""
    return (NOW - dt.timedelta(hours=2) + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the stack's objects, as `pulumi up` creates them ------------------------------------------------


@lru_cache(maxsize=None)
def synthesized() -> dict[str, dict]:
    """kind -> the prod program's manifest of the staging Job, the RayCluster and the API Service."""
    out = {}
    for r in repo_stack("prod")["resources"]:
        kind = {"kubernetes:batch/v1:Job": "Job", "kubernetes:ray.io/v1:RayCluster": "RayCluster"}.get(r["type"])
        if r["type"] == "kubernetes:core/v1:Service" and r["inputs"]["metadata"]["name"].endswith("-api"):
            kind = "Service"
        if kind:
            out[kind] = copy.deepcopy(r["inputs"])
    return out


@lru_cache(maxsize=None)
def targets() -> ro.Targets:
    return ro.targets_for_stack("prod", REPO)


def k8s_version() -> str:
    return load_stack_file("prod", REPO).kubernetes_version(today()) + ".0"


@lru_cache(maxsize=None)
def raycluster_schema() -> dict:
    crd = yaml_text.safe_load((REPO / "tests/fixtures/upstream/kuberay-operator-1.7.0/ray.io_rayclusters.yaml").read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return served["schema"]["openAPIV3Schema"]


def validate_status(doc: dict, version: str) -> None:
    """A metav1.Status against the cluster version's schema. kubernetes-validate files it under its group
    (status-meta-v1.json) while the server writes apiVersion "v1", so it is looked up by hand, the way
    kubernetes_validate.validate does it for every other kind."""
    from kubernetes_validate import utils as kv
    from referencing import Registry, Resource

    schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
    schema = kv.schema_contents(f"{schema_dir}/status-meta-v1.json", version)
    registry = Resource.from_contents(kv.schema_contents(f"{schema_dir}/_definitions.json", version)) @ (
        Resource.from_contents(schema) @ Registry()
    )
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(doc)


def status_doc(code: int, reason: str, message: str) -> dict:
    """A metav1.Status, as the API server answers an error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


def cstatus(name: str, image: str, state: dict, *, ready: bool = False, restarts: int = 0, started: Optional[bool] = None,
            last: Optional[dict] = None) -> dict:  # fmt: skip
    """A ContainerStatus the kubelet reports."""
    out = {"name": name, "image": image, "imageID": "", "ready": ready, "restartCount": restarts, "state": state, "lastState": last or {}}
    if "waiting" not in state:
        out["imageID"] = image.rsplit(":", 1)[0] + "@sha256:" + "ab" * 32
        out["containerID"] = "containerd://" + "cd" * 32
    if started is not None:
        out["started"] = started
    return out


def running(minutes: float) -> dict:
    return {"running": {"startedAt": ts(minutes)}}


def terminated(code: int, minutes: float, reason: Optional[str] = None) -> dict:
    return {"terminated": {"exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                           "startedAt": ts(minutes - 1), "finishedAt": ts(minutes)}}  # fmt: skip


def waiting(reason: str, message: str = "") -> dict:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def conditions(**status: bool) -> list[dict]:
    return [{"type": kind, "status": "True" if ok else "False", "lastProbeTime": None, "lastTransitionTime": ts(1)} for kind, ok in status.items()]


def pod(name: str, template: dict, *, labels: dict, owner: dict, node: Optional[str], phase: str, inits: list[dict],
        containers: list[dict], minutes: float, ready: bool = False, initialized: bool = True) -> dict:  # fmt: skip
    """A Pod made from a template by its controller, with the kubelet's status."""
    spec = copy.deepcopy(template["spec"])
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase, "qosClass": "Guaranteed", "startTime": ts(minutes)}
    if node:
        status.update(hostIP="10.0.64.10", hostIPs=[{"ip": "10.0.64.10"}], podIP="10.0.70.21", podIPs=[{"ip": "10.0.70.21"}])
        status["conditions"] = conditions(PodReadyToStartContainers=True, Initialized=initialized, Ready=ready, ContainersReady=ready, PodScheduled=True)
    else:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
                                 "lastTransitionTime": ts(minutes), "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]  # fmt: skip
    if inits:
        status["initContainerStatuses"] = inits
    if containers:
        status["containerStatuses"] = containers
    metadata = {
        "name": name, "namespace": "gpu-serving", "uid": f"uid-{name}", "resourceVersion": "4711", "creationTimestamp": ts(minutes),
        "labels": labels, "annotations": dict(template["metadata"].get("annotations") or {}),
        "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
    }  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


# ---- the staging Job and its pod -----------------------------------------------------------------------


def job(state: str, *, failed_pods: int = 0) -> dict:
    """The program's staging Job with what the API server adds and the Job controller's status."""
    doc = copy.deepcopy(synthesized()["Job"])
    name = doc["metadata"]["name"]
    uid = "0d3c2b1a-0000-4000-8000-000000000001"
    doc.update(apiVersion="batch/v1", kind="Job")
    doc["metadata"].update(uid=uid, resourceVersion="1234", generation=1, creationTimestamp=ts(0))
    # The API server defaults these and labels the pod template with the Job's identity (Kubernetes docs, "Jobs").
    ids = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name, "controller-uid": uid, "job-name": name}
    spec = doc["spec"]
    spec.update(completions=1, parallelism=1, completionMode="NonIndexed", suspend=False, podReplacementPolicy="Failed",
                manualSelector=False, selector={"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})  # fmt: skip
    spec["template"]["metadata"]["labels"].update(ids)
    status: dict[str, Any] = {"startTime": ts(0), "terminating": 0, "uncountedTerminatedPods": {}, "ready": 0}
    if failed_pods:
        status["failed"] = failed_pods
    if state == "running":
        status.update(active=1, ready=1)
    elif state == "complete":
        status.update(succeeded=1, completionTime=ts(40),
                      conditions=[{"type": "Complete", "status": "True", "lastProbeTime": ts(40), "lastTransitionTime": ts(40)}])  # fmt: skip
    elif state == "failed":
        why = {"reason": "PodFailurePolicy", "lastProbeTime": ts(2), "lastTransitionTime": ts(2),
               "message": f"Container stage for pod gpu-serving/{staging_pod_name()} failed with exit code 3 matching FailJob rule at index 0"}  # fmt: skip
        status.update(failed=1, conditions=[{"type": "FailureTarget", "status": "True", **why}, {"type": "Failed", "status": "True", **why}])
    doc["status"] = status
    return doc


def staging_pod_name() -> str:
    return synthesized()["Job"]["metadata"]["name"] + "-x7k2p"


def staging_pod(state: str) -> dict:
    owner_job = job("running")
    template = owner_job["spec"]["template"]
    image = template["spec"]["containers"][0]["image"]
    own = cstatus("own-dest", image, terminated(0, 1), ready=False)
    stage = {
        "running": cstatus("stage", image, running(1), ready=True, started=True),
        "complete": cstatus("stage", image, terminated(0, 40), started=False),
        "failed": cstatus("stage", image, terminated(3, 2), started=False),
    }[state]
    phase = {"running": "Running", "complete": "Succeeded", "failed": "Failed"}[state]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": owner_job["metadata"]["name"], "uid": owner_job["metadata"]["uid"]}
    doc = pod(staging_pod_name(), template, labels=dict(template["metadata"]["labels"]), owner=owner, node="ip-10-0-1-5.ec2.internal",
              phase=phase, inits=[own], containers=[stage], minutes=0.5, ready=state == "running")  # fmt: skip
    doc["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"] if state == "running" else []
    return doc


# ---- the RayCluster and its pods ----------------------------------------------------------------------


def raycluster(ready: bool) -> dict:
    doc = copy.deepcopy(synthesized()["RayCluster"])
    doc.update(apiVersion="ray.io/v1", kind="RayCluster")
    doc["metadata"].update(uid="5e6f7a8b-0000-4000-8000-000000000002", resourceVersion="2345", generation=1, creationTimestamp=ts(1))
    # KubeRay 1.7.0's status (apis/ray/v1/raycluster_types.go, RayClusterStatus and its condition types).
    head_ready = {"reason": "HeadPodRunningAndReady" if ready else "HeadPodNotFound", "message": ""}
    provisioned = {"reason": "AllPodRunningAndReadyFirstTime" if ready else "RayClusterPodsProvisioning", "message": ""}
    doc["status"] = {
        "desiredWorkerReplicas": 3, "minWorkerReplicas": 3, "maxWorkerReplicas": 3,
        "availableWorkerReplicas": 3 if ready else 0, "readyWorkerReplicas": 3 if ready else 0,
        "desiredCPU": "760", "desiredMemory": "7800Gi", "desiredGPU": "32", "desiredTPU": "0",
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
        "head": {"podName": "vllm-head-h4d7q", "podIP": "10.0.70.21", "serviceName": "vllm-head-svc"},
        "lastUpdateTime": ts(50), "observedGeneration": 1,
        "conditions": [
            {"type": "HeadPodReady", "status": "True" if ready else "False", "lastTransitionTime": ts(50), **head_ready},
            {"type": "RayClusterProvisioned", "status": "True" if ready else "False", "lastTransitionTime": ts(50), **provisioned},
        ],
    }  # fmt: skip
    if ready:
        doc["status"].update(state="ready", stateTransitionTimes={"ready": ts(55)})
    return doc


def ray_pod(role: str, index: int, state: str, *, restarts: int = 0) -> dict:
    """A pod KubeRay makes from the RayCluster's template (common/pod.go: its labels, the cluster as owner).

    state: "unplaced", "weights" (waiting for the weights), "starting" (Ray container up, not ready),
    "ready", "crashloop".
    """
    spec = synthesized()["RayCluster"]["spec"]
    template = spec["headGroupSpec"]["template"] if role == "head" else spec["workerGroupSpecs"][0]["template"]
    container = template["spec"]["containers"][0]
    image, main = container["image"], container["name"]
    name = "vllm-head-h4d7q" if role == "head" else f"vllm-gpu-worker-{'abcde'[index]}{index}k9z"
    labels = {**template["metadata"]["labels"], "ray.io/cluster": "vllm", "ray.io/node-type": role,
              "ray.io/group": "headgroup" if role == "head" else "gpu", "ray.io/identifier": f"vllm-{role}",
              "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator", "app.kubernetes.io/name": "kuberay"}  # fmt: skip
    owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "vllm", "uid": "5e6f7a8b-0000-4000-8000-000000000002"}
    if state == "unplaced":
        return pod(name, template, labels=labels, owner=owner, node=None, phase="Pending", inits=[], containers=[], minutes=1)
    if state == "weights":
        inits = [cstatus("wait-for-weights", image, running(3))]
        containers = [cstatus(main, image, waiting("PodInitializing"), started=False)]
        return pod(name, template, labels=labels, owner=owner, node=NODE_NAMES[index], phase="Pending", inits=inits,
                   containers=containers, minutes=1, initialized=False)  # fmt: skip
    inits = [cstatus("wait-for-weights", image, terminated(0, 41))]
    if state == "crashloop":
        back_off = waiting("CrashLoopBackOff", f"back-off 5m0s restarting failed container={main} pod={name}_gpu-serving(uid-{name})")
        containers = [cstatus(main, image, back_off, restarts=restarts, started=False, last=terminated(1, 55))]
    else:
        containers = [cstatus(main, image, running(42), ready=state == "ready", started=state == "ready")]
    return pod(name, template, labels=labels, owner=owner, node=NODE_NAMES[index], phase="Running", inits=inits,
               containers=containers, minutes=1, ready=state == "ready")  # fmt: skip


def ray_pods(head: str, workers: list[str], *, restarts: int = 0) -> list[dict]:
    return [ray_pod("head", 0, head, restarts=restarts)] + [ray_pod("worker", i + 1, s) for i, s in enumerate(workers)]


# ---- what the pod programs print ---------------------------------------------------------------------


@lru_cache(maxsize=None)
def staging_output() -> str:
    """stage_weights.py's own output while copying a checkpoint, each file read slowly enough for progress lines."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dest = Path(tmp, "src"), Path(tmp, "dest")
        for i in range(4):
            (src / f"model-0000{i + 1}-of-00004.safetensors").parent.mkdir(parents=True, exist_ok=True)
            (src / f"model-0000{i + 1}-of-00004.safetensors").write_bytes(bytes([i]) * 400_000)
        (src / "config.json").write_text("{}")
        real_fetch = stage_weights.FileSource.fetch

        def slow_fetch(self, rel, info, out, offset):  # noqa: ANN001
            with open(Path(self.root, rel), "rb") as f:
                f.seek(offset)
                # 20 chunks a file, ~0.8 s in all: dozens of progress lines at 0.03 s even on a loaded machine.
                while chunk := f.read(20_000):
                    out.write(chunk)
                    time.sleep(0.02)
            return info["size"] - offset

        stage_weights.FileSource.fetch = slow_fetch
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer):
                rc = stage_weights.main(["--source", f"file://{src}", "--dest", str(dest), "--workers", "2", "--progress-interval", "0.03"])
        finally:
            stage_weights.FileSource.fetch = real_fetch
        assert rc == 0, buffer.getvalue()
        return buffer.getvalue()


def staging_output_until(share: float) -> str:
    """The log as it stood when the first progress line past `share` of the bytes was printed."""
    lines = staging_output().splitlines(keepends=True)
    for i, line in enumerate(lines):
        p = ro.parse_progress(line)
        if p and p["state"] == "running" and p["bytes_done"] >= share * p["bytes_total"] and p["rate_bytes_per_s"]:
            return "".join(lines[: i + 1])
    raise AssertionError("no such progress line")


@lru_cache(maxsize=None)
def failed_staging_output() -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        rc = stage_weights.main(["--source", "file:///no/such/checkpoint", "--dest", "/tmp/unused-rollout-dest"])
    assert rc == stage_weights.EXIT_SOURCE
    return buffer.getvalue()


FAKE_RAY = """
import os
def init(**kw): pass
def shutdown(): pass
def nodes():
    return [{"Alive": True, "Resources": {"GPU": 8.0}} for _ in range(int(os.environ["FAKE_NODES"]))]
"""


@lru_cache(maxsize=None)
def ray_wait_output(nodes: int) -> tuple[str, str, int]:
    """ray_wait.py 32 4 0 (no patience) when Ray sees `nodes` GPU nodes: (stdout, stderr, exit)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "ray.py").write_text(FAKE_RAY)
        env = {"PYTHONPATH": tmp, "FAKE_NODES": str(nodes), "PATH": "/usr/bin:/bin"}
        done = subprocess.run([sys.executable, str(script_files.SCRIPTS_DIR / "ray_wait.py"), "32", "4", "0"],
                              env=env, capture_output=True, text=True, timeout=30)  # fmt: skip
    return done.stdout, done.stderr, done.returncode


def head_log(nodes: int, *vllm_lines: str) -> str:
    out, _, _ = ray_wait_output(nodes)
    return "starting Ray: ray start --head --num-gpus=8 --metrics-export-port=8080\n" + out + "".join(line + "\n" for line in vllm_lines)


LOADING = "(EngineCore pid=412) INFO 12-03 09:50:11 [default_loader.py:291] Loading weights took 512.40 seconds"
MODELS = {"object": "list", "data": [{"id": "deepseek-ai/DeepSeek-V4-Pro", "object": "model", "created": 1796288400, "owned_by": "vllm",
                                      "root": "/models/deepseek-ai/DeepSeek-V4-Pro", "parent": None, "max_model_len": 131072}]}  # fmt: skip
NO_ENDPOINTS = (503, status_doc(503, "ServiceUnavailable", 'no endpoints available for service "vllm-api"'))
UNREACHABLE = (503, status_doc(503, "ServiceUnavailable", "error trying to reach service: dial tcp 10.0.70.21:8000: i/o timeout"))


def world(*, jobs=(), staging_pods=(), raycluster_doc=None, pods=(), logs=None, proxy=NO_ENDPOINTS) -> dict:  # noqa: ANN001
    return {"jobs": list(jobs), "pods": list(staging_pods) + list(pods), "raycluster": raycluster_doc, "logs": logs or {}, "proxy": proxy}


def staging_logs(text: str) -> dict:
    return {(staging_pod_name(), "stage", False): text}


def head_logs(text: str, previous: Optional[str] = None) -> dict:
    out = {("vllm-head-h4d7q", "ray-head", False): text}
    if previous is not None:
        out[("vllm-head-h4d7q", "ray-head", True)] = previous
    return out


def happy_path() -> list[dict]:
    """From `pulumi up` still running to an endpoint that answers."""
    weights = ["weights"] * 3
    return [
        world(),
        world(jobs=[job("running")], staging_pods=[staging_pod("running")], raycluster_doc=raycluster(False),
              pods=ray_pods("weights", weights), logs=staging_logs(staging_output_until(0.25))),
        world(jobs=[job("running")], staging_pods=[staging_pod("running")], raycluster_doc=raycluster(False),
              pods=ray_pods("weights", weights), logs=staging_logs(staging_output_until(0.7))),
        world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(False),
              pods=[ray_pod("head", 0, "starting"), ray_pod("worker", 1, "starting"), ray_pod("worker", 2, "starting"),
                    ray_pod("worker", 3, "unplaced")],
              logs={**staging_logs(staging_output()), **head_logs(head_log(1))}),
        world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(False),
              pods=ray_pods("starting", ["starting"] * 3), logs={**staging_logs(staging_output()), **head_logs(head_log(1))}),
        world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(False),
              pods=ray_pods("starting", ["ready"] * 3), logs={**staging_logs(staging_output()), **head_logs(head_log(4, LOADING))}),
        world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(True),
              pods=ray_pods("ready", ["ready"] * 3), logs=staging_logs(staging_output()), proxy=(200, MODELS)),
    ]  # fmt: skip


def failed_staging() -> list[dict]:
    return [
        world(jobs=[job("failed")], staging_pods=[staging_pod("failed")], raycluster_doc=raycluster(False),
              pods=ray_pods("weights", ["weights"] * 3), logs=staging_logs(failed_staging_output())),
    ]  # fmt: skip


# ---- the stand-in API server ------------------------------------------------------------------------------


def _matches(obj: dict, selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",") if term))


class FakeKube:
    """The API server's answers to the GETs `rollout` makes; one state further at each list of Jobs (one per poll)."""

    def __init__(self, states: list[dict], *, tls: Optional[ssl.SSLContext] = None) -> None:
        self.states = states
        self.polls = 0
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                fake.requests.append(("GET", self.path))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._json(401, status_doc(401, "Unauthorized", "Unauthorized"))
                url = urllib.parse.urlsplit(self.path)
                code, body = fake.answer(url.path, dict(urllib.parse.parse_qsl(url.query)))
                if isinstance(body, str):
                    return self._send(code, body.encode(), "text/plain")
                return self._json(code, body)

            def do_POST(self) -> None:  # noqa: N802 - the command must never write
                fake.requests.append(("POST", self.path))
                self._json(405, status_doc(405, "MethodNotAllowed", "read-only"))

            do_PUT = do_PATCH = do_DELETE = do_POST

            def _json(self, code: int, doc: dict) -> None:
                self._send(code, json.dumps(doc).encode(), "application/json")

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def __enter__(self) -> "FakeKube":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def state(self) -> dict:
        return self.states[min(max(self.polls - 1, 0), len(self.states) - 1)]

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, Any]:
        ns = "gpu-serving"
        if path == f"/apis/batch/v1/namespaces/{ns}/jobs":
            self.polls += 1
            items = [j for j in self.state["jobs"] if _matches(j, query.get("labelSelector", ""))]
            return 200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {"resourceVersion": "9000"}, "items": items}
        if path == f"/api/v1/namespaces/{ns}/pods":
            items = [p for p in self.state["pods"] if _matches(p, query.get("labelSelector", ""))]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9000"}, "items": items}
        if m := re.fullmatch(rf"/api/v1/namespaces/{ns}/pods/([^/]+)/log", path):
            return self.log(m.group(1), query)
        if path == f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/vllm":
            if self.state["raycluster"] is None:
                return 404, status_doc(404, "NotFound", 'rayclusters.ray.io "vllm" not found')
            return 200, self.state["raycluster"]
        if path == f"/api/v1/namespaces/{ns}/services/vllm-api:http/proxy/v1/models":
            return self.state["proxy"]
        return 404, status_doc(404, "NotFound", "the server could not find the requested resource")

    def log(self, name: str, query: dict[str, str]) -> tuple[int, Any]:
        """PodLogOptions: container, previous, tailLines (the last lines), limitBytes (the first bytes)."""
        pods = {p["metadata"]["name"] for p in self.state["pods"]}
        if name not in pods:
            return 404, status_doc(404, "NotFound", f'pods "{name}" not found')
        key = (name, query.get("container", ""), query.get("previous") == "true")
        if key not in self.state["logs"]:
            what = "previous terminated container" if key[2] else "container"
            return 400, status_doc(400, "BadRequest", f'{what} "{key[1]}" in pod "{name}" is waiting to start: PodInitializing')
        text = self.state["logs"][key]
        if "tailLines" in query:
            text = "".join(text.splitlines(keepends=True)[-int(query["tailLines"]):])
        if "limitBytes" in query:
            text = text.encode()[: int(query["limitBytes"])].decode(errors="ignore")
        return 200, text


def kubeconfig(tmp_path: Path, server: str, **cluster: Any) -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "clusters": [{"name": "prod", "cluster": {"server": server, **cluster}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "prod"}}],
        "users": [{"name": "prod", "user": {"token": TOKEN}}],
    }  # fmt: skip
    path = tmp_path / "kubeconfig.json"
    path.write_text(json.dumps(doc))
    return path


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["rollout", "--stack", "prod", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def follow(states: list[dict], **kwargs: Any) -> tuple[int, list[str], FakeKube]:
    lines: list[str] = []
    with FakeKube(states) as fake:
        api = KubeApi(*load_kubeconfig(kubeconfig_for(fake)))
        code = ro.follow(api, targets(), poll_s=0, out=lines.append, **kwargs)
    return code, lines, fake


def kubeconfig_for(fake: FakeKube) -> Path:
    import tempfile

    return kubeconfig(Path(tempfile.mkdtemp(prefix="rollout-")), fake.url)


# ---- the served objects are real ones ------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [happy_path, failed_staging])
def test_the_stand_in_serves_objects_valid_for_the_clusters_version(scenario):
    version = k8s_version()
    for state in scenario():
        for doc in [*state["jobs"], *state["pods"]]:
            kubernetes_validate.validate(doc, version, strict=True)
        for body in (state["proxy"][1],):
            if body.get("kind") == "Status":
                validate_status(body, version)
        if state["raycluster"] is not None:
            errors = sorted(jsonschema.Draft7Validator(raycluster_schema()).iter_errors(state["raycluster"]), key=str)
            assert not errors, [f"{e.message} at {list(e.path)}" for e in errors]
    validate_status(status_doc(404, "NotFound", "x"), version)
    with pytest.raises(jsonschema.ValidationError):  # the schema is the real one: it refuses a wrong type
        validate_status({**status_doc(404, "NotFound", "x"), "code": "404"}, version)


def test_rollout_watches_what_pulumi_up_creates():
    """Its names come from the same functions as the program's: the synthesised prod stack agrees."""
    t, objs = targets(), synthesized()
    staging = objs["Job"]
    wanted = dict(term.split("=") for term in ro.STAGING_SELECTOR.split(","))
    assert wanted.items() <= staging["metadata"]["labels"].items() and staging["metadata"]["namespace"] == t.namespace
    assert ro.STAGING_CONTAINER in {c["name"] for c in staging["spec"]["template"]["spec"]["containers"]}
    rc = objs["RayCluster"]
    assert (rc["metadata"]["name"], rc["metadata"]["namespace"]) == (t.raycluster, t.namespace)
    templates = [rc["spec"]["headGroupSpec"]["template"], *(g["template"] for g in rc["spec"]["workerGroupSpecs"])]
    assert all(t.weights_init in {c["name"] for c in tpl["spec"]["initContainers"]} for tpl in templates)
    head = templates[0]["spec"]["containers"][0]
    assert head["args"][head["args"].index("--served-model-name") + 1] == t.served_model_name
    gpus_per_pod = int(head["resources"]["limits"]["nvidia.com/gpu"])
    assert 1 + sum(g["replicas"] for g in rc["spec"]["workerGroupSpecs"]) == t.nodes and t.gpus == t.nodes * gpus_per_pod
    svc = objs["Service"]
    assert (svc["metadata"]["name"], svc["metadata"]["namespace"]) == (t.service, t.namespace)
    assert t.service_port in {p["name"] for p in svc["spec"]["ports"]}
    # Nothing left for Pulumi to wait on: rollout does it.
    assert staging["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert rc["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"


# ---- following a rollout ------------------------------------------------------------------------------------


def test_staging_joining_and_ready_end_in_exit_0(tmp_path):
    with FakeKube(happy_path()) as fake:
        code, output = run_cli("--kubeconfig", str(kubeconfig(tmp_path, fake.url)), "--poll", "0")
    assert code == 0, output
    lines = output.splitlines()
    staging = [ln for ln in lines if " staging " in ln and " running " in ln]
    # Staging progress, from the staging program's own lines: bytes and files done, rate, time left.
    assert len(staging) >= 2, output
    assert all(re.search(r"[\d.]+ MB of [\d.]+ MB \([\d.]+%\), \d+ of 5 files, [\d.]+ MB/s, about .+ left", ln) for ln in staging), staging
    assert any("staging   done     Job " in ln and "1.6 MB of 1.6 MB (100.0%), 5 of 5 files" in ln for ln in lines), output
    # The pods: one not placed, then all running.
    assert any("pods      running  3 of 4 pods running; vllm-gpu-worker-d3k9z: not placed: 0/2 nodes are available" in ln for ln in lines)
    assert any("pods      done     head and 3 workers running on 4 nodes" in ln for ln in lines)
    # Ray's GPUs joining, from ray_wait.py's own lines in the head's log; then vLLM loading and ready.
    assert any("ray       running  Ray reports 8/32 GPUs on 1/4 nodes" in ln for ln in lines)
    assert any("ray       done     Ray reports 32/32 GPUs on 4/4 nodes" in ln for ln in lines)
    assert any("vllm      running  loading (container up" in ln and "Loading weights took" in ln for ln in lines), output
    assert any("vllm      done" in ln for ln in lines) and any("endpoint  done     GET /v1/models answers deepseek-ai/DeepSeek-V4-Pro" in ln for ln in lines)
    assert lines[-1] == "ready: deepseek-ai/DeepSeek-V4-Pro answers at the Service gpu-serving/vllm-api"
    # The steps came in order, and the command only read.
    firsts = [next(i for i, ln in enumerate(lines) if re.search(rf"\] {step} ", ln)) for step in ro.STEPS]
    assert firsts == sorted(firsts)
    assert {method for method, _ in fake.requests} == {"GET"}


def test_a_failed_staging_pod_ends_in_exit_1_with_its_log(tmp_path):
    with FakeKube(failed_staging()) as fake:
        code, output = run_cli("--kubeconfig", str(kubeconfig(tmp_path, fake.url)), "--poll", "0")
    assert code == 1, output
    job_name = synthesized()["Job"]["metadata"]["name"]
    assert f"staging failed: Job {job_name} failed: PodFailurePolicy: Container stage for pod" in output
    assert f"last log lines of {staging_pod_name()} (stage):" in output
    assert "  stage: cannot use the source: no such directory: /no/such/checkpoint" in output
    assert "Traceback" not in output
    assert ("GET", f"/api/v1/namespaces/gpu-serving/pods/{staging_pod_name()}/log?container=stage&tailLines=20") in fake.requests


def test_a_crash_looping_head_names_the_step_and_shows_its_last_run():
    out, err, rc = ray_wait_output(3)
    assert rc == 1 and "gave up" in err
    previous = "starting Ray: ray start --head\n" + out + err
    states = [world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(False),
                    pods=ray_pods("crashloop", ["ready", "ready", "unplaced"], restarts=3),
                    logs={**staging_logs(staging_output()), **head_logs("starting Ray: ray start --head\n", previous)})]  # fmt: skip
    code, lines, _ = follow(states)
    assert code == 1
    text = "\n".join(lines)
    assert "ray failed: pod vllm-head-h4d7q, container ray-head: CrashLoopBackOff after 3 restarts (last exit 1, Error)" in text
    assert "last log lines of vllm-head-h4d7q (ray-head):" in text and "  gave up after 0 s: Ray reports 24/32 GPUs on 3/4 nodes" in text


def test_a_proxy_the_network_policies_block_is_said_and_exits_3():
    states = [world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(True),
                    pods=ray_pods("ready", ["ready"] * 3), logs=staging_logs(staging_output()), proxy=UNREACHABLE)]  # fmt: skip
    code, lines, _ = follow(states)
    assert code == ro.EXIT_UNVERIFIED
    assert "serving, not verified: the head passes /health" in lines[-1] and "gpu-serving:serving.apiClients" in lines[-1]
    assert "port-forward svc/vllm-api 8000" in lines[-1]


def test_once_prints_every_step_and_says_it_is_under_way():
    code, lines, fake = follow(happy_path()[1:2], once=True)
    assert code == ro.EXIT_IN_PROGRESS and len(lines) == len(ro.STEPS)
    assert "staging   running" in lines[0] and "pods      running  0 of 4 pods running; vllm-gpu-worker-b1k9z: waiting for the weights" in lines[1]
    assert fake.polls == 1


def test_a_timeout_names_the_step_it_stopped_at():
    ticks = iter(range(0, 10_000, 100))
    code, lines, _ = follow(happy_path()[1:2], timeout_s=250, clock=lambda: next(ticks))
    assert code == 1
    assert any(ln.startswith("timed out after") and "at step staging:" in ln for ln in lines)


# ---- the way in ---------------------------------------------------------------------------------------------------


def test_a_closed_tunnel_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, output = run_cli("--kubeconfig", str(kubeconfig(tmp_path, f"https://localhost:{port}")), "--once")
    assert code == 2
    assert "cannot reach the Kubernetes API at https://localhost:" in output and "open the API tunnel first" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 3


def test_a_missing_kubeconfig_says_how_to_write_it(tmp_path):
    code, output = run_cli("--kubeconfig", str(tmp_path / "nope.json"), "--once")
    assert code == 2 and "pulumi stack output kubeconfig --show-secrets --stack STACK" in output


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a test certificate")
def test_the_stacks_private_ssm_kubeconfig_shape_works(tmp_path):
    """https://localhost:<port> with tls-server-name, the cluster's CA, and a token from an exec plugin (`aws eks get-token`)."""
    host = "0123456789ABCDEF.gr7.us-east-1.eks.amazonaws.com"
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
                    "-subj", "/CN=kube-apiserver", "-addext", f"subjectAltName=DNS:{host.lower()}"], check=True, capture_output=True)  # fmt: skip
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    credential = {"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1beta1", "spec": {},
                  "status": {"expirationTimestamp": ts(180), "token": TOKEN}}  # fmt: skip
    (bin_dir / "aws").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/aws.log\ncat <<'EOF'\n{json.dumps(credential)}\nEOF\n")
    (bin_dir / "aws").chmod(0o755)
    import base64
    import os

    with FakeKube(happy_path()[-1:], tls=server_tls) as fake:
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "gpu-serving-prod",
            "clusters": [{"name": "gpu-serving-prod", "cluster": {
                "server": f"https://localhost:{fake.port}", "tls-server-name": host.lower(),
                "certificate-authority-data": base64.b64encode(cert.read_bytes()).decode()}}],
            "contexts": [{"name": "gpu-serving-prod", "context": {"cluster": "gpu-serving-prod", "user": "gpu-serving-prod"}}],
            "users": [{"name": "gpu-serving-prod", "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws", "interactiveMode": "Never",
                "args": ["eks", "get-token", "--cluster-name", "gpu-serving-prod", "--region", "us-east-1", "--output", "json"]}}}],
        }  # fmt: skip
        path = tmp_path / "kubeconfig.json"
        path.write_text(json.dumps(doc))
        old_path = os.environ["PATH"]
        os.environ["PATH"] = f"{bin_dir}:{old_path}"
        try:
            code, output = run_cli("--kubeconfig", str(path), "--once")
            assert code == 0, output
            assert output.splitlines()[-1].startswith("ready: ")
            # One token for the whole look: the plugin runs once while its token is valid.
            assert (tmp_path / "aws.log").read_text().splitlines() == [" ".join(doc["users"][0]["user"]["exec"]["args"])]
            # Without tls-server-name the certificate does not match localhost: refused, in one line.
            del doc["clusters"][0]["cluster"]["tls-server-name"]
            path.write_text(json.dumps(doc))
            code, output = run_cli("--kubeconfig", str(path), "--once")
            assert code == 2 and "failed TLS verification" in output and "Traceback" not in output
            # No AWS CLI: said so.
            os.environ["PATH"] = "/nonexistent"
            code, output = run_cli("--kubeconfig", str(path), "--once")
            assert code == 2 and "runs `aws` for a token and it is not on PATH: install the AWS CLI v2" in output
        finally:
            os.environ["PATH"] = old_path


def test_an_api_behind_its_key_is_ready():
    """The stack's API refuses a request without its key (infra/k8s/scripts/api_guard.py), and the key cannot
    travel through the Service proxy (the API server drops the Authorization header it authenticated): a 401
    from the guard is the endpoint answering."""
    unauthorized = (401, {"error": "Unauthorized"})
    states = [world(jobs=[job("complete")], staging_pods=[staging_pod("complete")], raycluster_doc=raycluster(True),
                    pods=ray_pods("ready", ["ready"] * 3), logs=staging_logs(staging_output()), proxy=unauthorized)]  # fmt: skip
    code, lines, _ = follow(states)
    assert code == ro.EXIT_READY
    assert any("endpoint  done     the API answers and refuses a request without its key" in ln for ln in lines), lines
    assert lines[-1].endswith("behind its API key")
