"""components/serving.py under the recording engine: what reaches each Kubernetes object.

The mocks turn integers into floats, so manifests are compared numerically
(`==` between 8000 and 8000.0 holds).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pulumi
import pytest

from components.serving import TYPE, Serving, ServingArgs
from infra.k8s import checks, exposure, raycluster, serving_spec
from infra.k8s.scripts import benchmark
from infra.config import load_stack_file
from infra.planning.plan import make_plan
from infra.preview.recording import Recording, record
from infra.k8s.serving_spec import ServingSpec

REPO = Path(__file__).resolve().parent.parent
RC = "kubernetes:ray.io/v1:RayCluster"
SVC = "kubernetes:core/v1:Service"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"
JOB = "kubernetes:batch/v1:Job"
PM = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
CM = "kubernetes:core/v1:ConfigMap"
NP = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
DEP = "test:index:Prerequisite"
SECRET = "kubernetes:core/v1:Secret"


@lru_cache(maxsize=None)
def _deployment(stack: str):
    return make_plan(load_stack_file(stack, REPO).plan_request()).deployment()


def spec(stack: str = "prod", **overrides) -> ServingSpec:
    checks_config = load_stack_file(stack, REPO).checks
    base = dict(
        deployment=_deployment(stack),
        namespace="gpu-serving",
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving/vllm:0.34.0-ray2.60.0",
        ray_version="2.60.0",
        pvc_name="model-weights",
        ttft_p99_ms=load_stack_file(stack, REPO).serving.sla.ttft_p99_ms,  # the SLA the plan sizes for
        tpot_p99_ms=load_stack_file(stack, REPO).serving.sla.tpot_p99_ms,
        nccl_busbw_floor_gbps=checks_config.nccl_bus_bandwidth_floor_gbps,
        vllm_version=load_stack_file(stack, REPO).serving.vllm_version,
        production=load_stack_file(stack, REPO).lifecycle.production,
        vpc_cidr=load_stack_file(stack, REPO).network.vpc_cidr,
    )
    base.update(overrides)
    return ServingSpec(**base)


class Prerequisite(pulumi.CustomResource):
    """Stands in for an operator's Helm release or the weights' claim."""

    def __init__(self, name: str) -> None:
        super().__init__(DEP, name, {})


def run(s: ServingSpec, image=None) -> tuple[Recording, dict]:
    seen: dict = {}

    def program() -> None:
        deps = [Prerequisite("kuberay-operator"), Prerequisite("gpu-operator"), Prerequisite("weights-pvc")]
        img = pulumi.Output.from_input(image) if image is not None else None
        serving = Serving("vllm", ServingArgs(spec=s, depends_on=deps, image=img))
        seen["deps"] = deps
        pulumi.Output.all(serving.service_name, serving.endpoint, serving.served_model_name).apply(
            lambda v: seen.update(service_name=v[0], endpoint=v[1], served_model_name=v[2])
        )

    return record(program), seen


def urn_of(rec: Recording, name: str, typ: str) -> str:
    (r,) = [r for r in rec.resources if r.name == name and r.type == typ]
    return r.urn


def policy_urns(rec: Recording) -> set[str]:
    """The serving layer's NetworkPolicies: every pod they select waits for all of them."""
    return {r.urn for r in rec.of_type(NP)}


def test_creates_the_raycluster_service_and_pdb_from_the_builders():
    s = spec()
    rec, seen = run(s)
    comp = rec.one(TYPE)
    rc = rec.one(RC)
    assert rc.parent == comp.urn
    expected = raycluster.raycluster(s)
    assert rc.inputs["apiVersion"] == "ray.io/v1" and rc.inputs["kind"] == "RayCluster"
    assert rc.inputs["metadata"] == expected["metadata"]
    assert rc.inputs["spec"] == expected["spec"]
    (svc,) = [r for r in rec.of_type(SVC) if r.name == "vllm-api"]
    assert svc.inputs["spec"] == exposure.service(s)["spec"]
    assert svc.inputs["metadata"] == exposure.service(s)["metadata"]
    pdb = rec.one(PDB)
    assert pdb.inputs["spec"] == exposure.pdb(s)["spec"]
    assert seen["service_name"] == "vllm-api"
    assert seen["endpoint"] == "http://vllm-api.gpu-serving.svc.cluster.local:8000/v1"
    assert seen["served_model_name"] == "deepseek-ai/DeepSeek-V4-Pro"


def test_the_scripts_config_map_comes_first():
    s = spec()
    rec, _ = run(s)
    cm = rec.one(CM)
    assert cm.parent == rec.one(TYPE).urn
    expected = raycluster.scripts_config_map(s)
    assert cm.inputs["metadata"] == expected["metadata"] and cm.inputs["data"] == expected["data"]
    # After the namespace and the other prerequisites; the pods' volume names it.
    deps = {urn_of(rec, n, DEP) for n in ("kuberay-operator", "gpu-operator", "weights-pvc")}
    assert set(cm.options["depends_on"]) == deps
    head = rec.one(RC).inputs["spec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "scripts", "configMap": {"name": expected["metadata"]["name"], "defaultMode": 0o555}} in head["volumes"]


def test_raycluster_depends_on_the_given_resources_and_is_not_awaited():
    s = spec()
    rec, _ = run(s)
    rc = rec.one(RC)
    deps = {urn_of(rec, n, DEP) for n in ("kuberay-operator", "gpu-operator", "weights-pvc")}
    assert set(rc.options["depends_on"]) == deps | {rec.one(CM).urn, rec.one(SECRET).urn} | policy_urns(rec)
    assert [r.name for r in rec.of_type(NP)] == ["vllm-np-vllm-ray"]  # no client configured: the RayCluster's own only
    # `pulumi up` creates it and moves on: no readiness wait, no timeout to outlast the weights' staging
    # (python -m infra rollout follows the rest); the pods wait for the weights themselves.
    annotations = rc.inputs["metadata"]["annotations"]
    assert annotations["pulumi.com/skipAwait"] == "true" and "pulumi.com/waitFor" not in annotations
    assert "custom_timeouts" not in rc.options or not rc.options["custom_timeouts"]
    pods = raycluster.raycluster(s)["spec"]
    for template in [pods["headGroupSpec"]["template"], *(g["template"] for g in pods["workerGroupSpecs"])]:
        assert template["spec"]["initContainers"][-1]["name"] == "wait-for-weights"


def test_no_checks_and_annotations_by_default():
    s = spec()
    rec, _ = run(s)
    assert rec.of_type(JOB) == [] and rec.of_type(PM) == []
    assert [r.name for r in rec.of_type(SVC)] == ["vllm-api"]
    head = rec.one(RC).inputs["spec"]["headGroupSpec"]["template"]
    assert head["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_pod_monitor_when_chosen():
    s = spec(monitoring="podmonitor", monitor_labels={"release": "kube-prometheus-stack"})
    rec, _ = run(s)
    pm = rec.one(PM)
    assert pm.inputs["spec"] == exposure.pod_monitor(s)["spec"]
    assert pm.inputs["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    head = rec.one(RC).inputs["spec"]["headGroupSpec"]["template"]
    assert "prometheus.io/scrape" not in head["metadata"]["annotations"]


def test_the_efa_check_never_holds_up_the_raycluster():
    s = spec(efa_check=True)

    def program() -> None:
        operators = [Prerequisite("kuberay-operator"), Prerequisite("gpu-operator")]
        weights = Prerequisite("weights-pvc")
        Serving("vllm", ServingArgs(spec=s, depends_on=[*operators, weights], check_depends_on=operators))

    rec = record(program)
    (job,) = rec.of_type(JOB)
    assert job.name == "vllm-efa-check"
    assert job.inputs["spec"] == checks.efa_check_job(s)["spec"]
    headless = urn_of(rec, "vllm-efa-check", SVC)
    operators = {urn_of(rec, n, DEP) for n in ("kuberay-operator", "gpu-operator")}
    scripts = rec.one(CM).urn
    # It needs the device plugins and its scripts, not the weights: it runs while they are staged.
    assert set(job.options["depends_on"]) == operators | {headless, scripts} | policy_urns(rec)
    assert urn_of(rec, "vllm-np-vllm-efa-check", NP) in job.options["depends_on"]
    assert job.options["delete_before_replace"] is True
    # Pulumi creates it and moves on, and the RayCluster does not wait for it.
    assert job.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    # skipAwait skips a Job's deletion wait too, so the Job must be gone at once for its replacement
    # of the same name: background propagation, which the pulumi-kubernetes provider otherwise makes foreground.
    assert job.inputs["metadata"]["annotations"]["pulumi.com/deletionPropagationPolicy"] == "background"
    rc = rec.one(RC)
    assert job.urn not in rc.options["depends_on"]
    assert set(rc.options["depends_on"]) == operators | {urn_of(rec, "weights-pvc", DEP), scripts, rec.one(SECRET).urn} | policy_urns(rec)
    # The policies need the namespace (among the checks' prerequisites), not the weights.
    for np in rec.of_type(NP):
        assert set(np.options["depends_on"]) == operators


def test_benchmark_runs_after_the_raycluster():
    s = spec(benchmark=True)
    rec, _ = run(s)
    (job,) = rec.of_type(JOB)
    assert job.name == "vllm-benchmark"
    assert job.inputs["spec"] == checks.benchmark_job(s)["spec"]
    assert set(job.options["depends_on"]) == {rec.one(RC).urn, urn_of(rec, "vllm-api", SVC), rec.one(CM).urn, rec.one(SECRET).urn} | policy_urns(rec)
    assert {"vllm-np-vllm-benchmark", "vllm-np-vllm-api"} <= {r.name for r in rec.of_type(NP)}
    minutes = int(job.options["custom_timeouts"]["create"].rstrip("m"))
    assert minutes * 60 >= job.inputs["spec"]["activeDeadlineSeconds"]


def test_internal_load_balancer_option():
    rec, _ = run(spec(service_type="internal-lb", api_clients=serving_spec.Clients(cidrs=("10.8.0.0/16",))))
    (svc,) = [r for r in rec.of_type(SVC) if r.name == "vllm-api"]
    assert svc.inputs["spec"]["type"] == "LoadBalancer"
    assert svc.inputs["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-internal"] == "true"


def test_single_node_stack_has_no_worker_group():
    s = spec("test")
    rec, seen = run(s)
    rc = rec.one(RC)
    assert "workerGroupSpecs" not in rc.inputs["spec"]
    assert seen["served_model_name"] == "Qwen/Qwen3-0.6B"


def test_benchmark_checker_on_sample_json():
    result = {"completed": 100, "p99_ttft_ms": 180.0, "p99_tpot_ms": 30.0, "mean_ttft_ms": 90.0}
    assert benchmark.check_benchmark_result(result, 250.0, 40.0, 100) == []
    failing = {**result, "p99_ttft_ms": 400.0}
    assert benchmark.check_benchmark_result(failing, 250.0, 40.0, 100) == ["p99 TTFT 400.0 ms is not below 250 ms"]


def test_image_known_only_as_an_output():
    """The stack's ECR image URL is an Output: the pod specs take it, names and metadata do not wait for it."""
    import dataclasses

    s = spec(image=None, efa_check=True, benchmark=True)
    ecr = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving/vllm:0.34.0-ray2.60.0"
    rec, _ = run(s, image=ecr)
    with_image = dataclasses.replace(s, image=ecr)
    assert rec.one(RC).inputs["spec"] == raycluster.raycluster(with_image)["spec"]
    jobs = {j.name: j for j in rec.of_type(JOB)}
    assert jobs["vllm-efa-check"].inputs["spec"] == checks.efa_check_job(with_image)["spec"]
    assert jobs["vllm-benchmark"].inputs["spec"] == checks.benchmark_job(with_image)["spec"]
    images = {c["image"] for t in [rec.one(RC).inputs["spec"]["headGroupSpec"]["template"]] for c in t["spec"]["containers"] + t["spec"]["initContainers"]}
    assert images == {ecr}


def test_the_image_is_given_exactly_once():
    """One source for the serving image: the spec's string or the component's Output, never both or neither."""
    with pytest.raises(ValueError, match="once"):
        ServingArgs(spec=spec(image=None))
    with pytest.raises(ValueError, match="once"):
        ServingArgs(spec=spec(), image=pulumi.Output.from_input("other:1"))
