"""The Pod Security Standards as a pure function: which level a pod spec passes, and why not a stricter one.

Standard library only. The controls and their allowed values are those of the
Kubernetes documentation, "Pod Security Standards" (the profiles' tables for
Kubernetes 1.33), which the built-in Pod Security admission controller
implements (`k8s.io/pod-security-admission/policy`, one check per control):

Baseline
- HostProcess: `windowsOptions.hostProcess` of the pod and every container unset or false.
- Host namespaces: `hostNetwork`, `hostPID`, `hostIPC` unset or false.
- Privileged containers: `securityContext.privileged` unset or false.
- Capabilities: `capabilities.add` only from AUDIT_WRITE, CHOWN, DAC_OVERRIDE,
  FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP,
  SETUID, SYS_CHROOT (the container runtime's default set).
- HostPath volumes: none.
- Host ports: `ports[*].hostPort` unset or 0.
- AppArmor: `appArmorProfile.type` unset, RuntimeDefault or Localhost; the
  `container.apparmor.security.beta.kubernetes.io/*` annotations unset,
  `runtime/default` or `localhost/*`.
- SELinux: `seLinuxOptions.type` unset, "", container_t, container_init_t,
  container_kvm_t or container_engine_t; `.user` and `.role` unset or "".
- /proc mount type: `procMount` unset or Default.
- Seccomp: `seccompProfile.type` of the pod and every container not Unconfined.
- Sysctls: only kernel.shm_rmid_forced, net.ipv4.ip_local_port_range,
  net.ipv4.ip_local_reserved_ports, net.ipv4.tcp_syncookies,
  net.ipv4.ping_group_range, net.ipv4.ip_unprivileged_port_start,
  net.ipv4.tcp_keepalive_time, net.ipv4.tcp_fin_timeout,
  net.ipv4.tcp_keepalive_intvl, net.ipv4.tcp_keepalive_probes.

Restricted (everything of baseline, and)
- Volume types: only configMap, csi, downwardAPI, emptyDir, ephemeral,
  persistentVolumeClaim, projected, secret.
- Privilege escalation: `allowPrivilegeEscalation` false in every container.
- Running as non-root: `runAsNonRoot` true on the pod or on every container
  (a container's value overrides the pod's).
- Running as non-root user: `runAsUser` of the pod and every container not 0.
- Seccomp: every container's profile (its own, else the pod's) RuntimeDefault or Localhost.
- Capabilities: every container drops ALL and adds nothing but NET_BIND_SERVICE.

Containers are `containers`, `initContainers` and `ephemeralContainers`. A
pod's level is the strictest whose controls it passes ("privileged" passes
always). Values the caller cannot see yet (`<computed>`) make the pod
unjudgeable (`level` returns None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

if __package__:  # imported as policies.pod_security
    from .values import _list, _map, has_unknown
    from .workloads import CONTAINER_KEYS, containers
else:  # run by the policy analyzer from the pack's directory
    from values import _list, _map, has_unknown  # type: ignore[no-redef]
    from workloads import CONTAINER_KEYS, containers  # type: ignore[no-redef]

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)  # weakest to strictest

BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_local_reserved_ports",
     "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
     "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
     "net.ipv4.tcp_keepalive_probes"}
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"


def _containers(pod: Mapping) -> list[tuple[str, Mapping]]:
    """(`container app`, `initContainer init`, ...: how a message names it, container) for every container of the pod."""
    return [(f"{key[:-1]} {c.get('name', '?')}", c) for key, c in containers(pod)]


def judgeable(pod: Mapping, metadata: Optional[Mapping] = None) -> bool:
    """Whether every field a control reads is known (no `<computed>` in them)."""
    fields = [pod.get(k) for k in ("securityContext", "volumes", "hostNetwork", "hostPID", "hostIPC")]
    for _, c in _containers(pod):
        fields += [c.get("securityContext"), c.get("ports")]
    fields.append(_map(metadata).get("annotations"))
    return not any(has_unknown(f) for f in fields) and not any(has_unknown(pod.get(k)) for k in CONTAINER_KEYS)


def _caps(sc: Mapping, key: str) -> set[str]:
    return {str(c).upper().removeprefix("CAP_") for c in _list(_map(sc.get("capabilities")).get(key))}


def baseline_violations(pod: Mapping, metadata: Optional[Mapping] = None) -> list[str]:
    """The baseline controls the pod spec breaks (module doc)."""
    out: list[str] = []
    psc = _map(pod.get("securityContext"))
    annotations = _map(_map(metadata).get("annotations"))
    if _map(psc.get("windowsOptions")).get("hostProcess") is True:
        out.append("HostProcess: the pod runs Windows host processes")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key) is True:
            out.append(f"host namespaces: {key} is true")
    for v in (_map(v) for v in _list(pod.get("volumes"))):
        if "hostPath" in v:
            out.append(f"hostPath volumes: volume {v.get('name', '?')} mounts {_map(v['hostPath']).get('path', '?')!r} from the node")
    if _map(psc.get("appArmorProfile")).get("type") == "Unconfined":
        out.append("AppArmor: the pod's profile is Unconfined")
    if _map(psc.get("seccompProfile")).get("type") == "Unconfined":
        out.append("seccomp: the pod's profile is Unconfined")
    out += _selinux("the pod", psc)
    for sysctl in (_map(s) for s in _list(psc.get("sysctls"))):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctls: {sysctl.get('name')} is not in the safe set")
    for key, value in annotations.items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (value in ("", "runtime/default") or str(value).startswith("localhost/")):
            out.append(f"AppArmor: annotation {key} is {value!r}")
        if (key == SECCOMP_POD_ANNOTATION or str(key).startswith(SECCOMP_CONTAINER_ANNOTATION)) and value == "unconfined":
            out.append(f"seccomp: annotation {key} is unconfined")
    for where, c in _containers(pod):
        sc = _map(c.get("securityContext"))
        if _map(sc.get("windowsOptions")).get("hostProcess") is True:
            out.append(f"HostProcess: {where} is a Windows host process")
        if sc.get("privileged") is True:
            out.append(f"privileged containers: {where} is privileged")
        extra = sorted(_caps(sc, "add") - BASELINE_CAPABILITIES)
        if extra:
            out.append(f"capabilities: {where} adds {', '.join(extra)}, beyond the runtime's default set")
        for port in (_map(p) for p in _list(c.get("ports"))):
            if port.get("hostPort") not in (None, 0):
                out.append(f"host ports: {where} binds host port {port.get('hostPort')}")
        if _map(sc.get("appArmorProfile")).get("type") == "Unconfined":
            out.append(f"AppArmor: {where}'s profile is Unconfined")
        if _map(sc.get("seccompProfile")).get("type") == "Unconfined":
            out.append(f"seccomp: {where}'s profile is Unconfined")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"/proc mount type: {where} sets procMount {sc.get('procMount')}")
        out += _selinux(where, sc)
    return out


def _selinux(where: str, sc: Mapping) -> list[str]:
    opts = sc.get("seLinuxOptions")
    if opts is None:
        return []
    opts = _map(opts)
    out = []
    if opts.get("type") not in (None, *SELINUX_TYPES):
        out.append(f"SELinux: {where} sets type {opts.get('type')}")
    for key in ("user", "role"):
        if opts.get(key) not in (None, ""):
            out.append(f"SELinux: {where} sets {key} {opts.get(key)}")
    return out


def restricted_violations(pod: Mapping, metadata: Optional[Mapping] = None) -> list[str]:
    """The restricted controls the pod spec breaks, baseline's included (module doc)."""
    out = baseline_violations(pod, metadata)
    psc = _map(pod.get("securityContext"))
    for v in (_map(v) for v in _list(pod.get("volumes"))):
        kinds = sorted(k for k in v if k != "name")
        if not kinds or kinds[0] not in RESTRICTED_VOLUMES:
            out.append(f"volume types: volume {v.get('name', '?')} is a {kinds[0] if kinds else 'typeless'} volume")
    if psc.get("runAsUser") == 0:
        out.append("running as non-root user: the pod's runAsUser is 0")
    pod_seccomp = _map(psc.get("seccompProfile")).get("type")
    for where, c in _containers(pod):
        sc = _map(c.get("securityContext"))
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"privilege escalation: {where} does not set allowPrivilegeEscalation: false")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"running as non-root: runAsNonRoot is not true for {where} (its own, or else the pod's)")
        if sc.get("runAsUser") == 0:
            out.append(f"running as non-root user: {where}'s runAsUser is 0")
        seccomp = _map(sc.get("seccompProfile")).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccomp: {where} runs without the RuntimeDefault (or a Localhost) profile")
        if "ALL" not in _caps(sc, "drop"):
            out.append(f"capabilities: {where} does not drop ALL")
        extra = sorted(_caps(sc, "add") - RESTRICTED_CAPABILITIES)
        if extra:
            out.append(f"capabilities: {where} adds {', '.join(extra)} (restricted allows NET_BIND_SERVICE only)")
    return out


def violations(pod: Mapping, level: str, metadata: Optional[Mapping] = None) -> list[str]:
    """What keeps the pod spec from passing `level`."""
    if level == PRIVILEGED:
        return []
    if level == BASELINE:
        return baseline_violations(pod, metadata)
    if level == RESTRICTED:
        return restricted_violations(pod, metadata)
    raise ValueError(f"unknown Pod Security level {level!r}; one of {', '.join(LEVELS)}")


def level(pod: Mapping, metadata: Optional[Mapping] = None) -> Optional[str]:
    """The strictest level the pod spec passes; None when a field it needs is not known yet."""
    if not judgeable(pod, metadata):
        return None
    if not restricted_violations(pod, metadata):
        return RESTRICTED
    if not baseline_violations(pod, metadata):
        return BASELINE
    return PRIVILEGED


def weakest(levels: Sequence[str]) -> str:
    """The strictest level all of these pass (the weakest of them); restricted for none."""
    return min(levels, key=LEVELS.index) if levels else RESTRICTED


def stricter_or_equal(a: str, b: str) -> bool:
    return LEVELS.index(a) >= LEVELS.index(b)
