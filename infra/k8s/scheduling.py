"""Scheduling vocabulary: the node labels, the GPU taint and the tolerations and selectors that match them.

One owner for these facts. The EKS node groups set the labels and the taint
(components/cluster.py for the system nodes, components/gpu_nodes.py for the GPU
nodes); Helm values (infra/k8s/helm_values.py) and every pod the stack creates
select and tolerate with the functions below, so the two sides cannot drift.

- System nodes: `gpu-serving/role=system`, no taint. Operators and the weight
  staging Job run there.
- GPU nodes: `gpu-serving/role=gpu` plus the instance type, GPU and EFA count,
  and the taint `nvidia.com/gpu=present:NoSchedule`, which keeps everything that
  does not tolerate GPUs off them.

The taint is written twice on purpose, in two spellings of one fact: the EKS
API's (`NO_SCHEDULE`, the node group's `taints`) and Kubernetes' (`NoSchedule`,
a pod's `tolerations`); `tolerations()` derives the second from the first.
"""

from __future__ import annotations

from infra.catalog.instances import InstanceType

ROLE_LABEL = "gpu-serving/role"
INSTANCE_TYPE_LABEL = "gpu-serving/instance-type"
GPU_LABEL = "gpu-serving/gpu"
EFA_LABEL = "gpu-serving/efa-interfaces"
SYSTEM_ROLE = "system"
GPU_ROLE = "gpu"

GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"

# EKS node group taint effects (botocore eks model, TaintEffect) -> Kubernetes (core/v1 Taint.effect).
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


def system_labels() -> dict[str, str]:
    """Labels of the system node group."""
    return {ROLE_LABEL: SYSTEM_ROLE}


def system_node_selector() -> dict[str, str]:
    """A pod's nodeSelector for the system nodes."""
    return system_labels()


def gpu_taints() -> list[dict[str, str]]:
    """The GPU node group's taints, as the EKS API spells them."""
    return [{"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": "NO_SCHEDULE"}]


def gpu_labels(itype: InstanceType) -> dict[str, str]:
    """Labels of a GPU node group of `itype` (role, instance type, GPU, EFA count)."""
    return {
        ROLE_LABEL: GPU_ROLE,
        INSTANCE_TYPE_LABEL: itype.name,
        GPU_LABEL: itype.gpu.name,
        EFA_LABEL: str(itype.max_efa_interfaces),
    }


def gpu_node_selector(itype: InstanceType) -> dict[str, str]:
    """A pod's nodeSelector for the GPU node group of `itype`."""
    labels = gpu_labels(itype)
    return {k: labels[k] for k in (ROLE_LABEL, INSTANCE_TYPE_LABEL)}


def gpu_tolerations() -> list[dict[str, str]]:
    """Kubernetes tolerations for exactly the GPU nodes' taints (`gpu_taints()`)."""
    return [
        {"key": t["key"], "operator": "Equal", "value": t["value"], "effect": TAINT_EFFECTS[t["effect"]]}
        for t in gpu_taints()
    ]
