"""What a roll or replacement of a GPU node group does to serving, for the synth diff's callouts.

Every serving pod is one TP x PP engine spread over all GPU nodes, so replacing
any node stops it; how long serving is down follows from the node group's
update settings and the plan's cold start (exported with the plan). Pure
functions of the synthesized documents (infra/preview/synth.py).
"""

from __future__ import annotations

import math
import re
from typing import Any


def _at(obj: Any, path: str) -> Any:
    """The value at a dotted path, or None."""
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
# ASSUMPTION: one GPU node replaced in about 10 minutes (an instance of the size of a p5 launched, joined to
# the cluster, and the GPU operator's driver, toolkit and device plugins ready on it); not measured here.
NODE_REPLACE_S = 600.0
SUSPEND_KEY = "gpu-serving:serving.suspended"


def is_gpu_group(r: dict | None) -> bool:
    """A node group whose nodes carry the GPU taint (infra/k8s/scheduling.py gpu_taints)."""
    from infra.k8s.scheduling import GPU_TAINT_KEY

    taints = ((r or {}).get("inputs") or {}).get("taints") or []
    return any(isinstance(t, dict) and t.get("key") == GPU_TAINT_KEY for t in taints)


def serving_suspended(doc: dict) -> bool:
    """The serving RayCluster is suspended (`spec.suspend`: KubeRay keeps no pod), or there is none."""
    clusters = [r for r in doc["resources"] if r["type"] == RAYCLUSTER]
    return all(_at(r.get("inputs") or {}, "spec.suspend") is True for r in clusters)


def cold_start_s(doc: dict) -> float | None:
    """The plan's cold start (weights read, engine start), from the exported plan."""
    value = ((doc.get("outputs") or {}).get("plan") or {}).get("startup", {}).get("cold_start_s")
    return float(value) if isinstance(value, (int, float)) else None


def outage_s(group: dict, doc: dict) -> float | None:
    """How long serving is down for a roll of `group`: its nodes replaced in batches of updateConfig's
    maxUnavailable (NODE_REPLACE_S each, an assumption), then the plan's cold start."""
    cold = cold_start_s(doc)
    if cold is None:
        return None
    inputs = group.get("inputs") or {}
    nodes = _at(inputs, "scalingConfig.desiredSize")
    batch = _at(inputs, "updateConfig.maxUnavailable")
    nodes = nodes if isinstance(nodes, (int, float)) else 1
    batch = batch if isinstance(batch, (int, float)) and batch > 0 else 1
    return math.ceil(nodes / batch) * NODE_REPLACE_S + cold


def _minutes(seconds: float) -> str:
    return f"about {round(seconds / 60):,} minutes"


# KubeRay's `upgradeStrategy: Recreate` deletes every pod and creates new ones when the hash of the
# RayCluster's spec changes (ray-operator/controllers/ray/raycluster_controller.go
# shouldRecreatePodsForUpgrade; utils/util.go GenerateHashWithoutReplicasAndWorkersToDelete, which
# leaves out these fields, kept here as patterns of the synth document's paths). `spec.suspend` is
# the procedure itself (suspending deletes the pods anyway), not a change to call out.
NOT_RECREATING = (r"inputs\.spec\.workerGroupSpecs\[\d+\]\.(replicas|minReplicas|maxReplicas|scaleStrategy\.workersToDelete)\b",
                  r"inputs\.spec\.upgradeStrategy\b", r"inputs\.spec\.suspend$")  # fmt: skip


def recreates_serving(paths: list[str], base: dict, head: dict) -> bool:
    """A change of these RayCluster fields recreates the serving pods of a running stack: serving is up
    on both sides (a suspended side has no pod to recreate) and a field of the hashed spec moved."""
    if serving_suspended(base) or serving_suspended(head):
        return False
    return any(p.startswith("inputs.spec.") and not any(re.match(x, p) for x in NOT_RECREATING) for p in paths)


def recreate_text(head: dict) -> str:
    """How long serving is down when KubeRay recreates every pod: the plan's cold start."""
    cold = cold_start_s(head)
    length = f" for {_minutes(cold)} (the plan's cold start of {cold:,.0f} s)" if cold else ""
    return (f"KubeRay's `upgradeStrategy: Recreate` deletes every serving pod and starts new ones: **serving goes "
            f"down**{length} while vLLM loads the weights again. To choose when, merge it in a quiet hour "
            "(docs/operating.md, Changing a running stack).")  # fmt: skip


def block_cleanup_text(group: dict) -> str:
    """What a delete-first replacement inside a Capacity Block adds to the outage: the new group's instances
    launch only once EC2 has cleaned up the terminated ones ("it takes several minutes to clean up your
    instance before you can launch another instance to replace it", EC2 User Guide, Launch instances using
    Capacity Blocks). Not a figure AWS gives, so not in outage_s."""
    if _at(group.get("inputs") or {}, "capacityType") != "CAPACITY_BLOCK":
        return ""
    return (" The new nodes launch only once EC2 has cleaned up the terminated instances, which takes "
            "\"several minutes\" per the EC2 User Guide (Launch instances using Capacity Blocks): add them to the outage.")


def serving_text(group: dict, base: dict, head: dict) -> tuple[str, bool]:
    """What a roll or replacement of a GPU node group does to serving, and whether it would stall.

    Every serving pod is one TP x PP engine spread over all GPU nodes: replacing any node stops
    it. A node EKS drains while a serving pod runs on it stalls on the serving PodDisruptionBudget
    (maxUnavailable 0, infra/k8s/exposure.py) until EKS fails the update (PodEvictionFailure), so
    serving must be suspended by an `up` of its own first: Pulumi updates the node group before the
    RayCluster, which is deployed after the nodes."""
    down = outage_s(group, head)
    length = f"for {_minutes(down)} (node replacements, then the plan's cold start of {cold_start_s(head):,.0f} s)" if down else ""
    if serving_suspended(base):
        return (f" Serving is suspended (`{SUSPEND_KEY}: true`): nothing to drain. Serving stays down until it is "
                f"resumed (`{SUSPEND_KEY}: false`) and vLLM is ready" + (f", {length}" if length else "") + ".", False)  # fmt: skip
    return (f" **Serving goes down** {length}, and the update stalls: the serving PodDisruptionBudget blocks every "
            f"eviction, so EKS fails it after its drain timeout (PodEvictionFailure). First `pulumi up` with only "
            f"`{SUSPEND_KEY}: true` (KubeRay deletes the serving pods), then this change, then `{SUSPEND_KEY}: false` "
            "(docs/operating.md, Changing a running stack).", True)  # fmt: skip
