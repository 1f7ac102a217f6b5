"""The Pod Security Standards as a pure function: which level a pod spec passes, and why not a stricter one.

Standard library only. The controls and their allowed values are those the
built-in Pod Security admission controller checks, one file per control in
`k8s.io/pod-security-admission`, `policy/check_*.go` (named below), as of
Kubernetes 1.35, the newest release the stack deploys; the Kubernetes docs,
"Pod Security Standards" (https://kubernetes.io/docs/concepts/security/pod-security-standards/),
table them. Admission judges a pod at the version its namespace pins
(`pod-security.kubernetes.io/enforce-version: v1.N`; "latest", none or a
malformed one: the newest, `api/helpers.go` ParseVersion), with the newest
form of each control that version has: `version` here, the minor N (None for
latest). Versions before 1.25 are not modelled (the stack deploys 1.33 to
1.35). Values are compared as written (`CAP_SYS_ADMIN` and `all` are not
SYS_ADMIN and ALL to admission).

Baseline
- HostProcess (check_windowsHostProcess.go): `windowsOptions.hostProcess` of
  the pod and every container unset or false.
- Host namespaces (check_hostNamespaces.go): `hostNetwork`, `hostPID`,
  `hostIPC` unset or false.
- Privileged containers (check_privileged.go): `securityContext.privileged`
  unset or false.
- Capabilities (check_capabilities_baseline.go): `capabilities.add` only from
  AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD,
  NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP, SETUID, SYS_CHROOT (the
  container runtime's default set).
- HostPath volumes (check_hostPathVolumes.go): none.
- Host ports (check_hostPorts.go): `ports[*].hostPort` unset or 0.
- Host probes and lifecycle hooks (check_hostProbesAndhostLifecycle.go, from
  1.34): `httpGet.host` and `tcpSocket.host` of every liveness, readiness and
  startup probe and postStart and preStop handler unset or "".
- AppArmor (check_appArmorProfile.go): `appArmorProfile.type` of the pod and
  every container unset, RuntimeDefault or Localhost; the
  `container.apparmor.security.beta.kubernetes.io/*` annotations "",
  `runtime/default` or `localhost/*`.
- SELinux (check_seLinuxOptions.go): `seLinuxOptions.type` unset, "",
  container_t, container_init_t, container_kvm_t, or (from 1.31)
  container_engine_t; `.user` and `.role` unset or "".
- /proc mount type (check_procMount_baseline.go): `procMount` unset or Default;
  from 1.35 any value in a pod with its own user namespace (`hostUsers: false`).
- Seccomp (check_seccompProfile_baseline.go): `seccompProfile.type` of the pod
  and every container not Unconfined (the seccomp annotations count only at
  versions before 1.19).
- Sysctls (check_sysctls.go): only kernel.shm_rmid_forced,
  net.ipv4.ip_local_port_range, net.ipv4.tcp_syncookies,
  net.ipv4.ping_group_range, net.ipv4.ip_unprivileged_port_start; from 1.27
  net.ipv4.ip_local_reserved_ports; from 1.29 net.ipv4.tcp_keepalive_time,
  net.ipv4.tcp_fin_timeout, net.ipv4.tcp_keepalive_intvl,
  net.ipv4.tcp_keepalive_probes; from 1.32 net.ipv4.tcp_rmem, net.ipv4.tcp_wmem.

Restricted (everything of baseline, and)
- Volume types (check_restrictedVolumes.go): only configMap, csi,
  downwardAPI, emptyDir, ephemeral, image, persistentVolumeClaim, projected,
  secret.
- Privilege escalation (check_allowPrivilegeEscalation.go):
  `allowPrivilegeEscalation` false in every container.
- Running as non-root (check_runAsNonRoot.go): the pod's `runAsNonRoot` not
  false, and every container's (its own, or else the pod's) true.
- Running as non-root user (check_runAsUser.go): `runAsUser` of the pod and
  every container not 0.
- Seccomp (check_seccompProfile_restricted.go): every container's profile (its
  own, else the pod's) RuntimeDefault or Localhost.
- Capabilities (check_capabilities_restricted.go): every container drops ALL
  and adds nothing but NET_BIND_SERVICE.
- /proc mount type (check_procMount_restricted.go): `procMount` unset or
  Default, user namespace or not.
A Windows pod (`os.name: windows`) is exempt from the privilege escalation,
seccomp and capabilities controls; from 1.35 a pod with its own user namespace
is exempt from both non-root controls.

Containers are `containers`, `initContainers` and `ephemeralContainers`
(policy/visitor.go). A pod's level is the strictest whose controls it passes
("privileged" passes always). Values the caller cannot see yet
(`<computed>`) make the pod unjudgeable (`level` returns None).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

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
# The safe sysctls, and the minor version that added each group (check_sysctls.go).
SAFE_SYSCTLS_SINCE = (
    (0, ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
         "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start")),
    (27, ("net.ipv4.ip_local_reserved_ports",)),
    (29, ("net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
          "net.ipv4.tcp_keepalive_probes")),
    (32, ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")),
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SELINUX_TYPES_1_31 = SELINUX_TYPES | {"container_engine_t"}
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim", "projected", "secret"}
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HANDLERS = ("postStart", "preStop")
_VERSION = re.compile(r"v1\.([0-9]|[1-9][0-9]*)")  # api/helpers.go, versionRegexp


def policy_version(label: Any) -> Optional[int]:
    """The minor version a `pod-security.kubernetes.io/<mode>-version` label pins (`v1.33` -> 33); None for latest,
    which is also what admission makes of an absent or malformed label."""
    m = _VERSION.fullmatch(label) if isinstance(label, str) else None
    return int(m[1]) if m else None


def _since(version: Optional[int], minor: int) -> bool:
    return version is None or version >= minor


def _user_namespace(pod: Mapping, version: Optional[int]) -> bool:
    """Whether the 1.35 relaxations for a pod in its own user namespace apply (policy/helpers.go, relaxPolicyForUserNamespacePod)."""
    return _since(version, 35) and pod.get("hostUsers") is False


def _windows(pod: Mapping, version: Optional[int]) -> bool:
    """Whether the 1.25 exemptions of a Windows pod apply (the `_1_25` checks of privilege escalation, seccomp, capabilities)."""
    return _since(version, 25) and _map(pod.get("os")).get("name") == "windows"


def _containers(pod: Mapping) -> list[tuple[str, Mapping]]:
    """(`container app`, `initContainer init`, ...: how a message names it, container) for every container of the pod."""
    return [(f"{key[:-1]} {c.get('name', '?')}", c) for key, c in containers(pod)]


def judgeable(pod: Mapping, metadata: Optional[Mapping] = None) -> bool:
    """Whether every field a control reads is known (no `<computed>` in them)."""
    fields = [pod.get(k) for k in ("securityContext", "volumes", "hostNetwork", "hostPID", "hostIPC", "hostUsers", "os")]
    for _, c in _containers(pod):
        fields += [c.get(k) for k in ("securityContext", "ports", "lifecycle", *PROBES)]
    fields.append(_map(metadata).get("annotations"))
    return not any(has_unknown(f) for f in fields) and not any(has_unknown(pod.get(k)) for k in CONTAINER_KEYS)


def _caps(sc: Mapping, key: str) -> set[str]:
    return {str(c) for c in _list(_map(sc.get("capabilities")).get(key))}


def _probe_hosts(c: Mapping) -> list[str]:
    """The hosts the container's probes and lifecycle handlers name (check_hostProbesAndhostLifecycle.go)."""
    handlers = [_map(c.get(p)) for p in PROBES] + [_map(_map(c.get("lifecycle")).get(h)) for h in LIFECYCLE_HANDLERS]
    return [str(host) for h in handlers for action in ("httpGet", "tcpSocket") if (host := _map(h.get(action)).get("host"))]


def _proc_mount(where: str, sc: Mapping) -> list[str]:
    mount = sc.get("procMount")
    return [] if mount in (None, "Default") else [f"/proc mount type: {where} sets procMount {mount}"]


def baseline_violations(pod: Mapping, metadata: Optional[Mapping] = None, version: Optional[int] = None) -> list[str]:
    """The baseline controls the pod spec breaks at Pod Security version 1.`version` (None: latest; module doc)."""
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
    selinux_types = SELINUX_TYPES_1_31 if _since(version, 31) else SELINUX_TYPES
    out += _selinux("the pod", psc, selinux_types)
    safe_sysctls = {name for since, names in SAFE_SYSCTLS_SINCE if _since(version, since) for name in names}
    for sysctl in (_map(s) for s in _list(psc.get("sysctls"))):
        if sysctl.get("name") not in safe_sysctls:
            out.append(f"sysctls: {sysctl.get('name')} is not in the safe set")
    for key, value in annotations.items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (value in ("", "runtime/default") or str(value).startswith("localhost/")):
            out.append(f"AppArmor: annotation {key} is {value!r}")
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
        if not _user_namespace(pod, version):
            out += _proc_mount(where, sc)
        out += _selinux(where, sc, selinux_types)
        if _since(version, 34):
            for host in _probe_hosts(c):
                out.append(f"host probes and lifecycle hooks: {where} sends a probe or lifecycle handler to host {host}")
    return out


def _selinux(where: str, sc: Mapping, types: frozenset[str]) -> list[str]:
    opts = sc.get("seLinuxOptions")
    if opts is None:
        return []
    opts = _map(opts)
    out = []
    if opts.get("type") not in (None, *types):
        out.append(f"SELinux: {where} sets type {opts.get('type')}")
    for key in ("user", "role"):
        if opts.get(key) not in (None, ""):
            out.append(f"SELinux: {where} sets {key} {opts.get(key)}")
    return out


def restricted_violations(pod: Mapping, metadata: Optional[Mapping] = None, version: Optional[int] = None) -> list[str]:
    """The restricted controls the pod spec breaks, baseline's included, at Pod Security version 1.`version` (module doc)."""
    out = baseline_violations(pod, metadata, version)
    psc = _map(pod.get("securityContext"))
    windows, user_namespace = _windows(pod, version), _user_namespace(pod, version)
    for v in (_map(v) for v in _list(pod.get("volumes"))):
        kinds = sorted(k for k in v if k != "name")
        if not kinds or kinds[0] not in RESTRICTED_VOLUMES:
            out.append(f"volume types: volume {v.get('name', '?')} is a {kinds[0] if kinds else 'typeless'} volume")
    if not user_namespace:
        if psc.get("runAsNonRoot") is False:
            out.append("running as non-root: the pod sets runAsNonRoot false")
        if psc.get("runAsUser") == 0:
            out.append("running as non-root user: the pod's runAsUser is 0")
    pod_seccomp = _map(psc.get("seccompProfile")).get("type")
    for where, c in _containers(pod):
        sc = _map(c.get("securityContext"))
        if user_namespace:
            out += _proc_mount(where, sc)  # baseline lets it pass, restricted does not (check_procMount_restricted.go)
        else:
            if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
                out.append(f"running as non-root: runAsNonRoot is not true for {where} (its own, or else the pod's)")
            if sc.get("runAsUser") == 0:
                out.append(f"running as non-root user: {where}'s runAsUser is 0")
        if windows:
            continue
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"privilege escalation: {where} does not set allowPrivilegeEscalation: false")
        seccomp = _map(sc.get("seccompProfile")).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccomp: {where} runs without the RuntimeDefault (or a Localhost) profile")
        if "ALL" not in _caps(sc, "drop"):
            out.append(f"capabilities: {where} does not drop ALL")
        extra = sorted(_caps(sc, "add") - RESTRICTED_CAPABILITIES)
        if extra:
            out.append(f"capabilities: {where} adds {', '.join(extra)} (restricted allows NET_BIND_SERVICE only)")
    return out


def violations(pod: Mapping, level: str, metadata: Optional[Mapping] = None, version: Optional[int] = None) -> list[str]:
    """What keeps the pod spec from passing `level` at Pod Security version 1.`version` (None: latest)."""
    if level == PRIVILEGED:
        return []
    if level == BASELINE:
        return baseline_violations(pod, metadata, version)
    if level == RESTRICTED:
        return restricted_violations(pod, metadata, version)
    raise ValueError(f"unknown Pod Security level {level!r}; one of {', '.join(LEVELS)}")


def level(pod: Mapping, metadata: Optional[Mapping] = None, version: Optional[int] = None) -> Optional[str]:
    """The strictest level the pod spec passes at Pod Security version 1.`version`; None when a field it needs is not known yet."""
    if not judgeable(pod, metadata):
        return None
    if not restricted_violations(pod, metadata, version):
        return RESTRICTED
    if not baseline_violations(pod, metadata, version):
        return BASELINE
    return PRIVILEGED


def weakest(levels: Sequence[str]) -> str:
    """The strictest level all of these pass (the weakest of them); restricted for none."""
    return min(levels, key=LEVELS.index) if levels else RESTRICTED


def stricter_or_equal(a: str, b: str) -> bool:
    return LEVELS.index(a) >= LEVELS.index(b)
