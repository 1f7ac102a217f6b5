"""The Pulumi program of the GPU serving stack.

Thin on purpose: load the stack config, make the plan, build the stack from
both (components/stack.py), export. Every number the cloud and serving layers
need comes out of the plan (see infra/planning).

A config mistake or an infeasible plan ends the program with one message
(`pulumi.RunError`), never a stack trace.
"""

import pulumi

from components.stack import build
from infra.config import from_pulumi_config
from infra.errors import UserError
from infra.planning import make_plan


def main() -> None:
    try:
        cfg = from_pulumi_config()  # its messages name the stack file and key
    except UserError as exc:
        raise pulumi.RunError(str(exc)) from None
    try:
        plan = make_plan(cfg.plan_request())
    except UserError as exc:
        raise pulumi.RunError(f"stack {cfg.stack}: {exc}") from None

    if not plan.feasible:
        problems = "\n".join(f"  - {e}" for e in plan.errors) or "  - (no reason given)"
        raise pulumi.RunError(
            f"stack {cfg.stack}: no feasible plan for {cfg.model.name} on "
            f"{cfg.gpu.nodes} x {cfg.gpu.instance_type}:\n{problems}"
        )

    doc = plan.to_json_dict()
    for warning in doc.get("warnings") or []:
        pulumi.log.warn(warning)

    try:
        stack = build(cfg, plan)
    except UserError as exc:
        raise pulumi.RunError(f"stack {cfg.stack}: {exc}") from None

    layout, kv, cost = doc["layout"], doc["kv_cache"], doc["cost"]
    pulumi.export("clusterName", stack.cluster.cluster_name)
    pulumi.export("endpoint", stack.cluster.endpoint)
    pulumi.export("kubeconfig", stack.cluster.kubeconfig)  # a secret
    if stack.cluster.api_tunnel_command is not None:  # private-ssm: open it before kubectl, helm or pulumi
        pulumi.export("apiTunnelCommand", stack.cluster.api_tunnel_command)
    pulumi.export("gpuNodeGroup", stack.gpu_nodes.node_group_name)
    pulumi.export("imageRepository", stack.image_repository.repository_url)
    pulumi.export("servingEndpoint", stack.serving.endpoint)  # OpenAI-compatible, inside the cluster
    pulumi.export("servedModelName", stack.serving.served_model_name)
    pulumi.export("apiKey", stack.serving.api_key)  # a secret: `Authorization: Bearer <apiKey>` on every request
    pulumi.export("weightsFileSystemId", stack.storage.file_system_id)
    pulumi.export("plan", doc)
    pulumi.export("model", doc["model"]["name"])
    pulumi.export("instanceType", (doc.get("instance") or {}).get("type", cfg.gpu.instance_type))
    pulumi.export("nodes", layout["nodes"])
    pulumi.export("tensorParallel", layout["tp"])
    pulumi.export("pipelineParallel", layout["pp"])
    pulumi.export("kvCacheTokens", kv["tokens"])
    pulumi.export("maxConcurrency", kv["max_concurrency"])
    pulumi.export("vllmArgs", doc["vllm_args"])
    pulumi.export("hourlyCostUsd", cost["hourly_usd"])
    pulumi.export("monthlyCostUsd", cost["monthly_usd"])
    # What the plan predicts at the SLA capacity (null without an SLA); the benchmark Job measures it.
    capacity = (doc.get("performance") or {}).get("sla_capacity") or {}
    pulumi.export("slaCapacityConcurrency", capacity.get("concurrency"))
    pulumi.export("slaCapacityRequestsPerSecond", capacity.get("requests_per_s"))
    pulumi.export("predictedOutputTokensPerSecond", cost["predicted_tokens_per_s"])
    per_mtok = cost["usd_per_million_tokens"]
    pulumi.export("predictedCostPerMillionTokensUsd", per_mtok["tco"] if per_mtok["tco"] is not None else per_mtok["cloud"])


main()
