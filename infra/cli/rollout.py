"""`python -m infra rollout`: follow a stack from `pulumi up` to an endpoint that answers.

    python -m infra rollout --stack prod [--kubeconfig PATH] [--namespace NS] [--timeout S] [--once]

`pulumi up` creates the weight-staging Job and the RayCluster and moves on
(`pulumi.com/skipAwait`: components/storage.py, infra/k8s/raycluster.py). This
command watches the rest through the same way in (the stack's kubeconfig; with
private-ssm, the tunnel), one step after the other:

1. staging: the newest staging Job (labels of components/storage.py) and the
   progress lines its pod prints (infra/k8s/scripts/stage_weights.py,
   PROGRESS_PREFIX): bytes and files done, rate, time left;
2. pods: the RayCluster's pods (KubeRay labels them `ray.io/cluster=<name>`,
   `ray.io/node-type=head|worker`: ray-operator/controllers/ray/common/pod.go),
   each placed and past its init containers (the wait for the weights);
3. ray: every GPU joined, from the head's log (the "Ray reports G/G GPUs on
   N/N nodes" lines of infra/k8s/scripts/ray_wait.py, read from the log's start
   with `limitBytes`);
4. vllm: the head's container Ready, i.e. its readiness probe on vLLM's /health
   passes (KubeRay 1.7.0 mirrors it as the RayCluster's HeadPodReady condition);
5. endpoint: `GET /v1/models` through the API server's Service proxy
   (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/...`, Kubernetes docs,
   "Access services running on clusters") lists the served model name (vLLM's
   OpenAI-compatible model list: `data[].id`).

It only reads (GET): stop it and run it again at any time. Exit status: 0 the
endpoint answered; 1 a step failed (a Job failed, a pod crash-loops or cannot
start: the step, the pod and its last log lines are printed) or the time ran
out; 2 a usage error or an API that cannot be reached; 3 the head serves but
the API server cannot reach port 8000 to ask (the serving namespace's
NetworkPolicies admit only `gpu-serving:serving.apiClients` there, and the
Service proxy's connections come from the control plane's interfaces in the
VPC); with `--once`, 4 while the rollout is still under way.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from infra.errors import UserError
from infra.k8s import raycluster as rc_builder
from infra.k8s.scripts.stage_weights import PROGRESS_PREFIX
from infra.k8s.serving_spec import (
    API_PORT_NAME,
    HEAD_CONTAINER,
    RAY_CLUSTER_LABEL,
    RAY_NODE_TYPE_LABEL,
    ServingSpec,
)
from infra.k8s.staging import staging_await_timeout_s, staging_deadline_s
from infra.ops.kubeapi import ApiError, KubeApi, NotFound, Unreachable

EXIT_READY, EXIT_FAILED, EXIT_UNVERIFIED, EXIT_IN_PROGRESS = 0, 1, 3, 4
STEPS = ("staging", "pods", "ray", "vllm", "endpoint")

# The staging Job's labels (components/storage.py: the weights' labels and STAGING_COMPONENT) and
# its program's container (infra/k8s/staging.py, staging_pod_spec).
STAGING_SELECTOR = "app.kubernetes.io/name=model-weights,app.kubernetes.io/component=weight-staging"
STAGING_CONTAINER = "stage"
# What the pods of a Job carry when its selector is not readable (Kubernetes docs, "Well-Known Labels").
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# infra/k8s/scripts/ray_wait.py prints this whenever what Ray sees changes.
RAY_JOIN = re.compile(r"Ray reports (\d+)/(\d+) GPUs on (\d+)/(\d+) nodes")
POLL_S = 10.0
STAGING_LOG_LINES = 200  # enough to hold the newest progress line between the "fetched" lines
LOG_TAIL_LINES = 20  # what a failure shows of its pod's log
HEAD_LOG_START_BYTES = 256 * 1024  # the head's log from its start: Ray's start and the join lines come first
PROXY_TIMEOUT_S = 45.0  # longer than the API server's own dial timeout to a pod (30 s)
UNREACHABLE_POLLS = 2  # proxy failures in a row, with the head Ready, before concluding
API_RETRIES = 3  # polls in a row the API may fail (an SSM session drops) before giving up
# Container states no wait will clear (kubelet reasons; ImagePullBackOff is left out: the image may
# still be pushed by bin/build-image while the pods wait).
FATAL_WAITING = ("CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "InvalidImageName", "RunContainerError")


# ---- what to watch --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """The stack's names and figures, from the functions the program uses."""

    namespace: str
    raycluster: str
    service: str
    service_port: str
    served_model_name: str
    nodes: int
    gpus: int
    weights_init: str  # the serving pods' init container that waits for the weights
    startup_budget_s: int
    staging_timeout_s: int  # the staging Job's deadline and margin
    ready_timeout_s: int  # the head, once placed (the plan's ready_wait_s)

    @property
    def timeout_s(self) -> int:
        return self.staging_timeout_s + self.ready_timeout_s


def targets_for_stack(stack: str, root: Optional[Path] = None, namespace: Optional[str] = None) -> Targets:
    """What `pulumi up` of Pulumi.<stack>.yaml creates, named as components/stack.py names it."""
    from infra.config import load_stack_file
    from infra.planning import make_plan

    cfg = load_stack_file(stack, root)
    deployment = make_plan(cfg.plan_request()).deployment()
    spec = ServingSpec(
        deployment=deployment,
        namespace=namespace or cfg.serving.namespace,
        image=None,
        ray_version=cfg.serving.ray_version,
        pvc_name="model-weights",
        ttft_p99_ms=cfg.serving.sla.ttft_p99_ms,
        tpot_p99_ms=cfg.serving.sla.tpot_p99_ms,
        nccl_busbw_floor_gbps=cfg.checks.nccl_bus_bandwidth_floor_gbps,
        vllm_version=cfg.serving.vllm_version,
        production=cfg.lifecycle.production,
    )
    storage = deployment.storage
    return Targets(
        namespace=spec.namespace,
        raycluster=spec.name,
        service=spec.service_name,
        service_port=API_PORT_NAME,
        served_model_name=spec.served_model_name,
        nodes=spec.nodes,
        gpus=spec.total_gpus,
        weights_init=rc_builder.wait_for_weights_container(spec)["name"],
        startup_budget_s=deployment.startup.startup_budget_s,
        staging_timeout_s=staging_await_timeout_s(staging_deadline_s(storage.checkpoint_bytes, storage.cold_start_target_s)),
        ready_timeout_s=deployment.startup.ready_wait_s,
    )


# ---- what the API shows ------------------------------------------------------------------------


@dataclass
class ProxyAnswer:
    kind: str  # "ok" | "guarded" | "no-endpoints" | "unreachable" | "error"
    detail: str = ""
    models: tuple[str, ...] = ()


@dataclass
class Observation:
    now: dt.datetime
    staging_jobs: list[dict] = field(default_factory=list)
    staging_pods: list[dict] = field(default_factory=list)
    staging_log: Optional[str] = None
    raycluster: Optional[dict] = None
    ray_pods: list[dict] = field(default_factory=list)
    head_log_start: Optional[str] = None
    head_log_tail: Optional[str] = None
    models: Optional[ProxyAnswer] = None


def _items(doc: Any) -> list[dict]:
    return list(doc.get("items") or []) if isinstance(doc, dict) else []


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def read_log(api: KubeApi, namespace: str, pod: str, container: str, **options: Any) -> Optional[str]:
    """A container's log (PodLogOptions: tailLines, limitBytes, previous), or None when there is none yet."""
    # A false flag is left out (the API's default), a true one is "true".
    query = {"container": container, **{k: "true" if v is True else v for k, v in options.items() if v is not False}}
    try:
        return api.get_text(f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query)
    except (NotFound, ApiError):  # 400 while the container has not started, or no previous instance
        return None


def ask_models(api: KubeApi, t: Targets) -> ProxyAnswer:
    """GET /v1/models through the API server's Service proxy, classified."""
    path = f"/api/v1/namespaces/{t.namespace}/services/{t.service}:{t.service_port}/proxy/v1/models"
    try:
        response = api.get(path, timeout=PROXY_TIMEOUT_S)
    except Unreachable as err:
        if err.timed_out:
            return ProxyAnswer("unreachable", f"the API server gave no answer within {PROXY_TIMEOUT_S:.0f} s")
        raise
    message = response.status_message()
    if response.status == 200:
        try:
            return ProxyAnswer("ok", models=tuple(str(m.get("id")) for m in response.json().get("data") or []))
        except (ValueError, AttributeError):
            return ProxyAnswer("error", f"/v1/models answered something that is not a model list: {message[:120]}")
    if response.status == 401:
        # The API key guard (infra/k8s/scripts/api_guard.py) refused a request without the key, which is all this
        # command can send: the API server's authentication removes the Authorization header from a request it has
        # authenticated (k8s.io/apiserver, endpoints/filters/authentication.go), so a key never reaches the proxy.
        return ProxyAnswer("guarded", "GET /v1/models without the API key: 401")
    if response.status == 503 and "no endpoints available" in message:
        return ProxyAnswer("no-endpoints", "the Service has no ready endpoint yet")
    if response.status == 403:
        return ProxyAnswer("unreachable", f"not allowed to use the Service proxy (services/proxy, 403): {message}")
    if response.status in (502, 503, 504):
        return ProxyAnswer("unreachable", f"the API server could not reach the Service ({response.status}: {message})")
    return ProxyAnswer("error", f"/v1/models answered {response.status}: {message}")


def observe(api: KubeApi, t: Targets, now: dt.datetime) -> Observation:
    """One look at everything the steps need (GETs only)."""
    ns = t.namespace
    obs = Observation(now=now)
    obs.staging_jobs = _items(api.get_json(f"/apis/batch/v1/namespaces/{ns}/jobs", {"labelSelector": STAGING_SELECTOR}))
    job = newest(j for j in obs.staging_jobs if not j["metadata"].get("deletionTimestamp"))
    if job is not None:
        match = ((job.get("spec") or {}).get("selector") or {}).get("matchLabels")
        selector = _selector(match) if match else f"{JOB_NAME_LABEL}={job['metadata']['name']}"
        obs.staging_pods = _items(api.get_json(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": selector}))
        pod = newest(obs.staging_pods)
        if pod is not None:
            obs.staging_log = read_log(api, ns, pod["metadata"]["name"], STAGING_CONTAINER, tailLines=STAGING_LOG_LINES)
    try:
        obs.raycluster = api.get_json(f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{t.raycluster}")
    except NotFound:
        obs.raycluster = None
    obs.ray_pods = _items(api.get_json(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"{RAY_CLUSTER_LABEL}={t.raycluster}"}))
    head = head_pod(obs.ray_pods)
    status = container_status(head, HEAD_CONTAINER) if head else None
    if head is not None and status and not status.get("ready") and ("running" in status.get("state", {}) or status.get("restartCount")):
        name = head["metadata"]["name"]
        obs.head_log_start = read_log(api, ns, name, HEAD_CONTAINER, limitBytes=HEAD_LOG_START_BYTES)
        obs.head_log_tail = read_log(api, ns, name, HEAD_CONTAINER, tailLines=LOG_TAIL_LINES)
    if head is not None and status and status.get("ready"):
        obs.models = ask_models(api, t)
    return obs


# ---- reading the objects (pure) ----------------------------------------------------------------


def newest(items: Iterable[dict]) -> Optional[dict]:
    """The most recently created object (RFC 3339 timestamps sort as strings)."""
    return max(items, key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"].get("name", "")), default=None)


def condition(obj: Optional[dict], kind: str) -> Optional[dict]:
    """The object's condition of that type when its status is "True"."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def container_status(pod: dict, name: str) -> Optional[dict]:
    status = pod.get("status") or {}
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        if cs.get("name") == name:
            return cs
    return None


def head_pod(pods: list[dict]) -> Optional[dict]:
    return newest(p for p in pods if p["metadata"].get("labels", {}).get(RAY_NODE_TYPE_LABEL) == "head")


def parse_progress(log: Optional[str]) -> Optional[dict]:
    """The newest progress line of a staging pod's log (stage_weights.py, PROGRESS_PREFIX)."""
    for line in reversed((log or "").splitlines()):
        if line.startswith(PROGRESS_PREFIX):
            try:
                return json.loads(line[len(PROGRESS_PREFIX):])
            except ValueError:
                continue
    return None


def parse_ray_join(log: Optional[str]) -> Optional[tuple[int, int, int, int]]:
    """The last (GPUs, of GPUs, nodes, of nodes) ray_wait.py reported."""
    found = RAY_JOIN.findall(log or "")
    return tuple(int(x) for x in found[-1]) if found else None  # type: ignore[return-value]


def last_line(log: Optional[str]) -> str:
    lines = [ln.strip() for ln in (log or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


# ---- formatting --------------------------------------------------------------------------------


def size(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def progress_text(p: dict) -> str:
    total = p.get("bytes_total") or 0
    share = f" ({100 * p['bytes_done'] / total:.1f}%)" if total else ""
    text = f"{size(p['bytes_done'])} of {size(total)}{share}, {p['files_done']} of {p['files_total']} files"
    if p.get("rate_bytes_per_s"):
        text += f", {size(p['rate_bytes_per_s'])}/s"
    if p.get("eta_s") is not None and p.get("state") == "running":
        text += f", about {duration(p['eta_s'])} left"
    return text


# ---- the steps (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    state: str  # "waiting" | "running" | "done" | "failed"
    detail: str


@dataclass(frozen=True)
class Failure:
    step: str
    message: str
    pod: Optional[str] = None
    container: Optional[str] = None
    previous: bool = False  # the log of the container's last terminated instance


def pod_waiting_reason(pod: dict, weights_init: str) -> str:
    """Why a pod is not running yet, in a few words."""
    status = pod.get("status") or {}
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False":
        return f"not placed: {scheduled.get('message') or scheduled.get('reason', 'pending')}"
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
            return f"image not pulled yet ({waiting['reason']}; bin/build-image pushes it): {waiting.get('message', '')}".rstrip(": ")
        if "running" in state and cs["name"] == weights_init:
            return "waiting for the weights (staging)"
        if "running" in state and cs in (status.get("initContainerStatuses") or []):
            return f"init container {cs['name']} running"
        if waiting.get("reason"):
            return waiting["reason"]
    return status.get("phase", "Pending")


@dataclass(frozen=True)
class Crash:
    container: Optional[str]
    why: str
    init: bool = False  # an init container (the pod's own preparation, not Ray or vLLM)
    previous: bool = False  # its log is the last terminated instance's


def crash(pod: dict) -> Optional[Crash]:
    """A container of a serving pod that waiting will not mend (restartPolicy Always: a non-zero exit is a crash)."""
    status = pod.get("status") or {}
    inits = status.get("initContainerStatuses") or []
    for cs in inits + (status.get("containerStatuses") or []):
        state = cs.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        if waiting.get("reason") in FATAL_WAITING:
            why = f"{waiting['reason']} after {cs.get('restartCount', 0)} restarts"
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if last:
                why += f" (last exit {last.get('exitCode')}, {last.get('reason', 'Error')})"
            return Crash(cs["name"], why, cs in inits, waiting["reason"] == "CrashLoopBackOff")
        if terminated.get("exitCode", 0) != 0:
            return Crash(cs["name"], f"exited {terminated['exitCode']} ({terminated.get('reason', 'Error')})", cs in inits)
    if status.get("phase") == "Failed":  # e.g. evicted
        return Crash(None, f"pod failed: {status.get('reason', '')} {status.get('message', '')}".strip())
    return None


def staging_step(t: Targets, obs: Observation) -> tuple[Step, Optional[Failure]]:
    job = newest(j for j in obs.staging_jobs if not j["metadata"].get("deletionTimestamp"))
    if job is None:
        if any(_finished_ok(p, t.weights_init) for p in obs.ray_pods):
            return Step("staging", "done", "the weights are staged (no staging Job left to show)"), None
        return Step("staging", "waiting", f"no staging Job in {t.namespace} yet (`pulumi up` creates it)"), None
    name, status = job["metadata"]["name"], job.get("status") or {}
    progress = parse_progress(obs.staging_log)
    if condition(job, "Complete"):
        done = f": {progress_text(progress)}" if progress and progress.get("state") == "complete" else ""
        return Step("staging", "done", f"Job {name} complete{done}"), None
    failed = condition(job, "Failed") or condition(job, "FailureTarget")
    pod = newest(obs.staging_pods)
    if failed:
        message = f"Job {name} failed: {failed.get('reason', '')}: {failed.get('message', '')}".rstrip(": ")
        problem = crash(pod) if pod else None
        container = problem.container if problem and problem.container else STAGING_CONTAINER
        return Step("staging", "failed", message), Failure("staging", message, pod["metadata"]["name"] if pod else None, container)
    if progress and progress.get("state") == "running":
        detail = progress_text(progress)
    elif pod is not None and (pod.get("status") or {}).get("phase") == "Running":
        detail = "listing the source"
    elif pod is not None:
        detail = pod_waiting_reason(pod, t.weights_init)
    else:
        detail = f"Job {name} created, no pod yet"
    retries = status.get("failed") or 0
    if retries:
        limit = (job.get("spec") or {}).get("backoffLimit")
        allowed = f" of {limit + 1} allowed" if isinstance(limit, int) else ""
        detail += f" (after {retries} failed pod{'s' if retries > 1 else ''}{allowed}; each retry resumes)"
    return Step("staging", "running", detail), None


def _finished_ok(pod: dict, container: str) -> bool:
    cs = container_status(pod, container)
    return bool(cs and ((cs.get("state") or {}).get("terminated") or {}).get("exitCode") == 0)


def pods_failure(t: Targets, obs: Observation, joined: bool) -> Optional[Failure]:
    """KubeRay's ReplicaFailure, or a crashed container, with the step it belongs to."""
    replica = condition(obs.raycluster, "ReplicaFailure")
    if replica:
        return Failure("pods", f"KubeRay cannot create the pods: {replica.get('message') or replica.get('reason', '')}")
    for pod in sorted(obs.ray_pods, key=lambda p: p["metadata"]["name"]):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        problem = crash(pod)
        if problem is None:
            continue
        if problem.init or problem.container is None:
            step = "pods"
        elif problem.container == HEAD_CONTAINER:
            step = "vllm" if joined else "ray"
        else:
            step = "ray"
        name = pod["metadata"]["name"]
        where = f"pod {name}" + (f", container {problem.container}" if problem.container else "")
        return Failure(step, f"{where}: {problem.why}", name, problem.container, problem.previous)
    return None


def pods_step(t: Targets, obs: Observation) -> Step:
    if obs.raycluster is None:
        return Step("pods", "waiting", f"RayCluster {t.raycluster} not created yet (`pulumi up` creates it)")
    for kind in ("RayClusterSuspending", "RayClusterSuspended"):
        if condition(obs.raycluster, kind):
            return Step("pods", "waiting", f"KubeRay reports {kind} (the RayCluster's spec.suspend)")
    pods = [p for p in obs.ray_pods if not p["metadata"].get("deletionTimestamp")]
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) >= t.nodes and head_pod(running) is not None:
        nodes = {(p.get("spec") or {}).get("nodeName") for p in running}
        return Step("pods", "done", f"head and {len(running) - 1} workers running on {len(nodes)} nodes")
    if not pods:
        return Step("pods", "waiting", "KubeRay has created no pod yet")
    waiting = sorted((p for p in pods if p not in running), key=lambda p: p["metadata"]["name"])
    why = f"; {waiting[0]['metadata']['name']}: {pod_waiting_reason(waiting[0], t.weights_init)}" if waiting else ""
    return Step("pods", "running", f"{len(running)} of {t.nodes} pods running{why}")


def ray_step(t: Targets, obs: Observation, joined: bool) -> Step:
    if joined:
        return Step("ray", "done", f"Ray reports {t.gpus}/{t.gpus} GPUs on {t.nodes}/{t.nodes} nodes")
    join = parse_ray_join(obs.head_log_start)
    if join:
        return Step("ray", "running", f"Ray reports {join[0]}/{t.gpus} GPUs on {join[2]}/{t.nodes} nodes")
    return Step("ray", "running", "starting Ray on the head")


def vllm_step(t: Targets, obs: Observation, head: dict) -> Step:
    status = container_status(head, HEAD_CONTAINER) or {}
    if status.get("ready"):
        return Step("vllm", "done", "the head passes vLLM's /health (Ready)")
    started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
    up = ""
    if started:
        elapsed = (obs.now - dt.datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()
        up = f" (container up {duration(max(elapsed, 0))} of its {duration(t.startup_budget_s)} startup budget)"
    line = last_line(obs.head_log_tail)
    return Step("vllm", "running", f"loading{up}" + (f": {line}" if line else ""))


def endpoint_step(t: Targets, obs: Observation) -> tuple[Step, Optional[Failure]]:
    answer = obs.models or ProxyAnswer("no-endpoints", "not asked yet")
    if answer.kind == "ok" and t.served_model_name in answer.models:
        return Step("endpoint", "done", f"GET /v1/models answers {t.served_model_name}"), None
    if answer.kind == "guarded":
        return Step("endpoint", "done", "the API answers and refuses a request without its key (GET /v1/models: 401); "
                    "with the key (pulumi stack output apiKey --show-secrets) it lists the models"), None  # fmt: skip
    if answer.kind == "ok":
        message = f"/v1/models lists {', '.join(answer.models) or 'nothing'}, not {t.served_model_name}"
        return Step("endpoint", "failed", message), Failure("endpoint", message)
    return Step("endpoint", "running", answer.detail), None


@dataclass(frozen=True)
class Assessment:
    steps: tuple[Step, ...]
    failure: Optional[Failure] = None

    @property
    def current(self) -> Step:
        """The first step not done (the failed one, if any)."""
        return next((s for s in self.steps if s.state != "done"), self.steps[-1])

    @property
    def ready(self) -> bool:
        return all(s.state == "done" for s in self.steps)


def assess(t: Targets, obs: Observation) -> Assessment:
    """Where the rollout is, step by step (each after the one before is done), and the first failure."""
    head = head_pod(obs.ray_pods)
    head_ready = bool(head and (container_status(head, HEAD_CONTAINER) or {}).get("ready"))
    join = parse_ray_join(obs.head_log_start)
    joined = head_ready or bool(join and join[0] >= t.gpus and join[2] >= t.nodes)
    staging, failure = staging_step(t, obs)
    failure = failure or pods_failure(t, obs, joined)
    steps = [staging, pods_step(t, obs)]
    if steps[-1].state == "done" and head is not None:
        steps.append(ray_step(t, obs, joined))
        if steps[-1].state == "done":
            steps.append(vllm_step(t, obs, head))
            if steps[-1].state == "done":
                endpoint, endpoint_failure = endpoint_step(t, obs)
                steps.append(endpoint)
                failure = failure or endpoint_failure
    steps += [Step(name, "waiting", "") for name in STEPS[len(steps):]]
    if failure:  # the failed step says why; the ones after it wait
        at = STEPS.index(failure.step)
        steps = steps[:at] + [Step(failure.step, "failed", failure.message)] + [Step(n, "waiting", "") for n in STEPS[at + 1:]]
    return Assessment(tuple(steps), failure)


# ---- following ------------------------------------------------------------------------------------


def render(step: Step) -> str:
    return f"{step.name:<9} {step.state:<8} {step.detail}".rstrip()


def failure_lines(api: KubeApi, t: Targets, failure: Failure) -> list[str]:
    """The failed step and its pod's last log lines."""
    lines = [f"{failure.step} failed: {failure.message}"]
    if failure.pod and failure.container:
        log = read_log(api, t.namespace, failure.pod, failure.container, tailLines=LOG_TAIL_LINES, previous=failure.previous)
        if log is None and failure.previous:
            log = read_log(api, t.namespace, failure.pod, failure.container, tailLines=LOG_TAIL_LINES)
        lines.append(f"last log lines of {failure.pod} ({failure.container}):")
        lines += ["  " + ln for ln in (log or "(no log)").rstrip("\n").splitlines()[-LOG_TAIL_LINES:]]
    return lines


def follow(
    api: KubeApi,
    t: Targets,
    *,
    timeout_s: Optional[float] = None,
    once: bool = False,
    poll_s: float = POLL_S,
    out: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
) -> int:
    """Watch until the endpoint answers, a step fails or the time runs out; the exit status (module doc)."""
    start = clock()
    limit = t.timeout_s if timeout_s is None else timeout_s
    shown: dict[str, Step] = {}
    unreachable = api_failures = 0
    while True:
        try:
            obs = observe(api, t, now())
            api_failures = 0
        except Unreachable as err:
            api_failures += 1
            if once or api_failures > API_RETRIES:
                raise
            out(f"[{duration(clock() - start):>12}] lost the API ({err}); retrying")
            sleep(poll_s)
            continue
        result = assess(t, obs)
        stamp = f"[{duration(clock() - start):>12}]"
        for step in result.steps:
            if once or (step.state != "waiting" and shown.get(step.name) != step):
                out(f"{stamp} {render(step)}")
                shown[step.name] = step
        if result.failure:
            for line in failure_lines(api, t, result.failure):
                out(line)
            return EXIT_FAILED
        if result.ready:
            guarded = obs.models is not None and obs.models.kind == "guarded"
            out(f"ready: {t.served_model_name} answers at the Service {t.namespace}/{t.service}"
                + (", behind its API key" if guarded else ""))  # fmt: skip
            return EXIT_READY
        unreachable = unreachable + 1 if obs.models and obs.models.kind == "unreachable" else 0
        if obs.models and obs.models.kind == "unreachable" and (once or unreachable >= UNREACHABLE_POLLS):
            out(
                f"serving, not verified: the head passes /health, but {obs.models.detail}. The Service proxy's "
                f"connections come from the control plane, which the namespace's NetworkPolicies do not admit to port 8000 "
                f"unless gpu-serving:serving.apiClients names its addresses; check it with `kubectl -n {t.namespace} "
                f"port-forward svc/{t.service} 8000` and `curl localhost:8000/v1/models`"
            )
            return EXIT_UNVERIFIED
        if once:
            return EXIT_IN_PROGRESS
        if clock() - start >= limit:
            current = result.current
            out(f"timed out after {duration(clock() - start)} at step {current.name}: {current.detail or current.state}")
            if current.name in ("ray", "vllm") and obs.head_log_tail:
                out("last log lines of the head:")
                out("\n".join("  " + ln for ln in obs.head_log_tail.rstrip("\n").splitlines()[-LOG_TAIL_LINES:]))
            out("run it again to keep watching (it only reads), with a longer --timeout")
            return EXIT_FAILED
        sleep(poll_s)
