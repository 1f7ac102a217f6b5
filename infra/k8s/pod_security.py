"""Security contexts of every pod the stack creates, and the namespace's Pod Security labels.

Pure. Every container drops ALL capabilities, never escalates privileges
(`allowPrivilegeEscalation: false`: the kernel's no_new_privs, so no setuid
binary or file capability gives anything back) and has a read-only root file
system (what it writes goes to emptyDirs or, for staging, the weights
volume); every pod uses the runtime's default seccomp profile and mounts no
service-account token (none of them calls the Kubernetes API). What each pod
adds back, and why:

- on FSx for Lustre, the weight-staging Job's init container: `CHOWN`, as
  root, to hand the checkpoint's directory on the shared file system (whose
  root directory FSx creates owned by root, mode 0755) to the unprivileged
  user the program runs as (`staging_owner.sh`). On EFS there is no such
  step: the staging access point creates the checkpoint's directory for that
  user and enforces it (infra/k8s/staging.py, module doc);
- nothing else. The Ray containers, the EFA check, the benchmark and the
  staging program run as a non-root user (`NONROOT_UID`) with no capability at
  all. On EFA nodes libfabric pins host memory, which the kernel refuses beyond
  RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK (Linux
  `drivers/infiniband/core/umem.c`, `ib_umem_get`); Kubernetes cannot raise a
  container's limit, so the nodes do: containerd's base runtime spec gives
  every container a limit beyond the node's memory (infra/aws/gpu_nodes.py,
  `node_config`; Bottlerocket does it itself on EFA nodes), and the Ray
  containers check it before Ray starts (memlock_check.py). NCCL needs nothing
  else: its transports use the device nodes the device plugins mount, which a
  non-root user may open (the kernel creates EFA's `uverbs` nodes mode 0666,
  drivers/infiniband/core/uverbs_main.c `uverbs_devnode`; the NVIDIA driver its
  nodes 0666 by default, `NVreg_DeviceFileMode`; the container runtime keeps
  the host's mode), shared memory (`/dev/shm`) and sockets between the pods.

Pod Security admission (`namespace_labels`): the namespace enforces the
strictest level every pod in it passes: `restricted` when the weights are on
EFS (every pod passes it: no hostPath, no added capability, non-root, the
staging Job included), `baseline` on FSx for Lustre (the staging Job's
ownership step runs as root with CHOWN, which `restricted` forbids); it warns
and audits at `restricted` (whoever creates a pod that would not pass it is
told so). The policy pack (policies/pod_security.py) evaluates every pod
template against these levels and fails when the enforced level is weaker than
what the pods need, or stricter than what they pass, or weaker than
`baseline`; policies/workloads.py refuses a serving pod that adds a
capability, mounts a host path or runs as root.
"""

from __future__ import annotations

from typing import Iterable, Optional

# The unprivileged user of the staging program and the benchmark (the "nonroot"
# UID of distroless images; above 10000, so it maps to no user of a node).
NONROOT_UID = 65532
SECCOMP = {"type": "RuntimeDefault"}

# The namespace labels `pod-security.kubernetes.io/<mode>` and `<mode>-version` (modes
# enforce, warn, audit; a version `v1.<minor>` or `latest`): Kubernetes docs, "Pod
# Security Admission" (k8s.io/pod-security-admission api/constants.go).
# What the namespace enforces, by where the weights are (module doc): FSx's staging Job keeps a root init container.
PSA_ENFORCE_BY_STORAGE = {"efs": "restricted", "fsx": "baseline"}
PSA_ENFORCE = "baseline"  # the weakest of them: what every stack's namespace enforces at least
PSA_WARN = "restricted"
PSA_AUDIT = "restricted"
PSA_PREFIX = "pod-security.kubernetes.io/"
LEVELS = ("privileged", "baseline", "restricted")  # weakest to strictest


def container_security_context(add: Iterable[str] = (), *, run_as_user: Optional[int] = None) -> dict:
    """No privilege escalation, every capability dropped but `add`, a read-only root file system.

    `run_as_user`: 0 for a container that must run as root when the pod runs as
    a non-root user (the staging Job's ownership step); None: the pod's user.
    """
    caps: dict = {"drop": ["ALL"]}
    if add:
        caps["add"] = sorted(set(add))
    sc: dict = {"allowPrivilegeEscalation": False, "capabilities": caps, "readOnlyRootFilesystem": True}
    if run_as_user is not None:
        sc["runAsUser"] = run_as_user
        sc["runAsNonRoot"] = run_as_user != 0
    return sc


def pod_security_context(run_as_user: Optional[int] = None) -> dict:
    """The runtime's default seccomp profile; with `run_as_user`, that user and group, required to be non-root."""
    sc: dict = {"seccompProfile": dict(SECCOMP)}
    if run_as_user is not None:
        sc.update(runAsUser=run_as_user, runAsGroup=run_as_user, runAsNonRoot=True)
    return sc


def hardened_pod(run_as_user: Optional[int] = None) -> dict:
    """The pod-level fields every pod of the stack carries."""
    return {"automountServiceAccountToken": False, "securityContext": pod_security_context(run_as_user)}


def enforced_level(storage_kind: str) -> str:
    """The level the serving namespace enforces for a stack whose weights are on `storage_kind` (module doc)."""
    if storage_kind not in PSA_ENFORCE_BY_STORAGE:
        raise ValueError(f"storage kind {storage_kind!r}: one of {', '.join(PSA_ENFORCE_BY_STORAGE)}")
    return PSA_ENFORCE_BY_STORAGE[storage_kind]


def namespace_labels(kubernetes_version: str, storage_kind: str) -> dict[str, str]:
    """Pod Security admission labels, each pinned to the cluster's version (`v1.33`): a later
    Kubernetes release does not change what the levels mean for this namespace until the
    cluster runs it and the labels follow. Enforced: `enforced_level(storage_kind)`."""
    version = f"v{kubernetes_version}"
    labels = {}
    for mode, level in (("enforce", enforced_level(storage_kind)), ("warn", PSA_WARN), ("audit", PSA_AUDIT)):
        labels[f"{PSA_PREFIX}{mode}"] = level
        labels[f"{PSA_PREFIX}{mode}-version"] = version
    return labels
