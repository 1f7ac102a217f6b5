"""Pod templates of the stack's workloads, and the serving-pod rule: helpers the Kubernetes rules share.

Standard library only, like the rest of the pack (see `policies/rules.py`, which
re-exports what is here). A workload's pod templates: every template of a
RayCluster (head and worker groups; also inside a RayService or RayJob), and the
template of a Pod, Job, CronJob, Deployment, StatefulSet, DaemonSet or
ReplicaSet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

if __package__:  # imported as policies.workloads
    from .values import UNKNOWN, _list, _map, is_unknown
else:  # run by the policy analyzer from the pack's directory
    from values import UNKNOWN, _list, _map, is_unknown  # type: ignore[no-redef]

GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
WORKLOAD_KINDS = ("Pod", "Job", "CronJob", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
CONTAINER_KEYS = ("containers", "initContainers", "ephemeralContainers")


def _truthy(value: Any) -> Optional[bool]:
    """True/False for a boolean the SDKs write as a bool or a string ("true"); None if unknown or unset."""
    if value is None or is_unknown(value):
        return None
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _kind(resource_type: str) -> str:
    return resource_type.rsplit(":", 1)[-1]


def _gpu_count(quantity: Any) -> Optional[int]:
    if quantity is None:
        return 0
    if is_unknown(quantity):
        return None
    try:
        return int(str(quantity))
    except ValueError:
        return None


def pod_gpus(pod_spec: Mapping) -> Optional[int]:
    """The GPUs a pod asks for: the sum of its containers' nvidia.com/gpu limits (requests if no limit)."""
    total = 0
    for c in _list(pod_spec.get("containers")):
        res = _map(_map(c).get("resources"))
        amount = _map(res.get("limits")).get(GPU, _map(res.get("requests")).get(GPU))
        n = _gpu_count(amount)
        if n is None:
            return None
        total += n
    return total


def raycluster_spec(resource_type: str, props: Mapping) -> Optional[Mapping]:
    """The RayCluster spec of a RayCluster (or the one inside a RayService / RayJob)."""
    kind = _kind(resource_type)
    spec = _map(props.get("spec"))
    if not resource_type.startswith("kubernetes:ray.io/"):
        return None
    if kind == "RayCluster":
        return spec
    if kind == "RayService":
        return _map(spec.get("rayClusterConfig"))
    if kind == "RayJob":
        return _map(spec.get("rayClusterSpec"))
    return None


def ray_pod_templates(spec: Mapping) -> list[tuple[str, Mapping]]:
    """(where, pod template) for the head and every worker group of a RayCluster spec."""
    out = [("head template", _map(_map(spec.get("headGroupSpec")).get("template")))]
    for group in _list(spec.get("workerGroupSpecs")):
        group = _map(group)
        out.append((f"worker group {group.get('groupName', '?')!s} template", _map(group.get("template"))))
    return out


def pod_templates(resource_type: str, props: Mapping) -> list[tuple[str, Mapping, Mapping]]:
    """(where, metadata, spec) of every pod template a workload resource holds (none for other resources)."""
    ray = raycluster_spec(resource_type, props)
    if ray is not None:
        return [(where, _map(t.get("metadata")), _map(t.get("spec"))) for where, t in ray_pod_templates(ray)]
    if not resource_type.startswith("kubernetes:") or _kind(resource_type) not in WORKLOAD_KINDS:
        return []
    kind, spec = _kind(resource_type), _map(props.get("spec"))
    if kind == "Pod":
        return [("pod", _map(props.get("metadata")), spec)]
    if kind == "CronJob":
        template = _map(_map(_map(spec.get("jobTemplate")).get("spec")).get("template"))
    else:
        template = _map(spec.get("template"))
    return [("pod template", _map(template.get("metadata")), _map(template.get("spec")))]


def containers(pod: Mapping) -> list[tuple[str, Mapping]]:
    """(kind, container) for every container, init container and ephemeral container of a pod spec."""
    return [(key, _map(c)) for key in CONTAINER_KEYS for c in _list(pod.get(key))]


def requests_resource(pod: Mapping, name: str) -> bool:
    """Whether a container of the pod asks for an extended resource (`vpc.amazonaws.com/efa`, ...)."""
    for _, c in containers(pod):
        res = _map(c.get("resources"))
        for amount in (_map(res.get("limits")).get(name), _map(res.get("requests")).get(name)):
            if amount not in (None, "", 0, "0") and not is_unknown(amount):
                return True
    return False


# --- Serving pods (rule 7 of policies/rules.py) -----------------------------------------------------------------------------------


def workload_pod_templates(resource_type: str, props: Mapping) -> list[tuple[str, Mapping]]:
    """(where, pod spec) of the pods a resource runs that this rule checks.

    Every pod template of a RayCluster (or RayService/RayJob); for other
    workloads (Pod, Job, CronJob, Deployment, ...) the pod templates that
    request nvidia.com/gpu.
    """
    ray = raycluster_spec(resource_type, props)
    if ray is not None:
        return [(where, _map(t.get("spec"))) for where, t in ray_pod_templates(ray)]
    if not resource_type.startswith("kubernetes:") or _kind(resource_type) not in WORKLOAD_KINDS:
        return []
    kind, spec = _kind(resource_type), _map(props.get("spec"))
    if kind == "Pod":
        pod = spec
    elif kind == "CronJob":
        pod = _map(_map(_map(_map(spec.get("jobTemplate")).get("spec")).get("template")).get("spec"))
    else:
        pod = _map(_map(spec.get("template")).get("spec"))
    gpus = pod_gpus(pod)
    return [("pod template", pod)] if gpus else []


# A serving pod gets its devices from the device plugins and nothing else from the node: no added capability
# (EFA's locked-memory limit comes from the nodes' containerd base runtime spec, infra/aws/gpu_nodes.py), no
# host path (the compile cache is an emptyDir), no root: infra/k8s/pod_security.py.


def _host_path_problems(where: str, pod: Mapping) -> list[str]:
    return [
        f"{where}: volume {_map(v).get('name', '?')} mounts host path {_map(_map(v).get('hostPath')).get('path', '')!r}: "
        "serving pods mount nothing from the node (an emptyDir holds the compile cache)"
        for v in _list(pod.get("volumes")) if _map(v).get("hostPath") is not None
    ]  # fmt: skip


def _run_as(sc: Mapping, pod_sc: Mapping, key: str) -> Any:
    """A container's effective securityContext field: its own, else the pod's."""
    return sc.get(key) if sc.get(key) is not None else pod_sc.get(key)


def _root_problem(where: str, name: str, sc: Mapping, pod_sc: Mapping) -> Optional[str]:
    user, non_root = _run_as(sc, pod_sc, "runAsUser"), _run_as(sc, pod_sc, "runAsNonRoot")
    if is_unknown(user) or is_unknown(non_root):
        return None
    if user is not None and int(user) == 0:
        return f"{where}, {name}: runs as root (runAsUser 0): serving pods run as a non-root user"
    if not _truthy(non_root) and user is None:
        return f"{where}, {name}: may run as root (neither runAsUser nor runAsNonRoot says otherwise): set runAsNonRoot and a runAsUser"
    return None


def _container_problems(where: str, pod: Mapping) -> list[str]:
    out: list[str] = _host_path_problems(where, pod)
    volumes = {_map(v).get("name"): _map(v) for v in _list(pod.get("volumes"))}
    pod_sc = _map(pod.get("securityContext"))
    for init, key in ((False, "containers"), (True, "initContainers")):
        for c in _list(pod.get(key)):
            c = _map(c)
            name = f"{'init container' if init else 'container'} {c.get('name', '?')}"
            if not init:
                mounts = [_map(m) for m in _list(c.get("volumeMounts")) if str(_map(m).get("mountPath", "")).rstrip("/") == "/dev/shm"]
                if not mounts:
                    out.append(
                        f"{where}, {name}: no /dev/shm mount: mount an emptyDir with medium Memory at /dev/shm "
                        "(NCCL and Ray use shared memory; the container runtime's default /dev/shm is 64 MiB)"
                    )
                else:
                    vol = volumes.get(mounts[0].get("name"))
                    if vol is not None and _map(vol.get("emptyDir")).get("medium") != "Memory":
                        out.append(f"{where}, {name}: /dev/shm is volume {mounts[0].get('name')}, not a memory-backed emptyDir (emptyDir.medium: Memory)")
                    elif vol is None:
                        out.append(f"{where}, {name}: /dev/shm mounts volume {mounts[0].get('name')}, which the pod does not define")
            sc = _map(c.get("securityContext"))
            if _truthy(sc.get("privileged")):
                out.append(
                    f"{where}, {name}: runs privileged (securityContext.privileged: true): the device plugins already "
                    "give a pod the GPUs and EFA devices it asks for; privileged hands it every device and the host"
                )
            if _truthy(sc.get("allowPrivilegeEscalation")):
                out.append(f"{where}, {name}: allows privilege escalation (securityContext.allowPrivilegeEscalation: true)")
            extra = sorted({str(c).upper().removeprefix("CAP_") for c in _list(_map(sc.get("capabilities")).get("add"))})
            if extra:
                out.append(f"{where}, {name}: adds capabilities {', '.join(extra)}: serving pods add none (EFA's locked-memory "
                           "limit comes from the nodes' containerd base runtime spec)")
            root = _root_problem(where, name, sc, pod_sc)
            if root:
                out.append(root)
            res = c.get("resources")
            if is_unknown(res):
                continue
            limits = _map(_map(res).get("limits"))
            wanted = ("cpu", "memory") if init else ("cpu", "memory", GPU)
            absent = [k for k in wanted if limits.get(k) in (None, "")]
            if absent:
                out.append(f"{where}, {name}: no resource limit for {', '.join(absent)} (set resources.limits)")
    return out


def check_serving_pods(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """Serving pods: memory-backed /dev/shm, resource limits, not privileged: no added capability, no host path, not root."""
    out: list[str] = []
    for where, pod in workload_pod_templates(resource_type, props):
        if is_unknown(pod) or not pod:
            continue
        out.extend(_container_problems(where, pod))
    return out
