"""infra/k8s/serving_spec.py, raycluster.py, exposure.py, checks.py: the serving manifests against the real schemas and the plan.

- The RayCluster validates against the KubeRay 1.7.0 CRD (the served `v1`
  openAPIV3Schema in tests/fixtures/upstream), made strict: an object schema that
  lists properties rejects any other (the API server would silently prune
  them), `x-kubernetes-int-or-string` takes an integer or a string,
  `x-kubernetes-list-type: map|set` lists must not repeat their keys/items.
  The CRD's two CEL rules (`x-kubernetes-validations`) concern `managedBy` and
  GCS fault tolerance, which the RayCluster never sets (asserted).
- Its pod templates, wrapped in a Pod, and every other manifest validate with
  kubernetes-validate in strict mode against Kubernetes 1.33.
- Cross-layer invariants hold for every stack file, and a changed model or
  instance type changes every dependent figure with no other edit.
- Every script a pod runs comes from the serving ConfigMap, mounted read-only,
  and a changed script replaces exactly the pods that run it (the scripts
  themselves run for real in tests/test_pod_scripts.py).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra.aws import gpu_nodes as efa
from infra.k8s import checks, exposure, network_policies, raycluster, scheduling, script_files, serving_spec, staging
from infra.k8s.scripts import benchmark, efa_allreduce
from infra.catalog.instances import get_instance_type
from infra.config import load_stack_file, read_stack_file
from infra.errors import UserError
from infra.planning.plan import make_plan
from infra.k8s.serving_spec import Clients, ServingSpec
from tests import yaml_text

# What the head adds to the plan's arguments: the API key guard (infra/k8s/scripts/api_guard.py).
API_GUARD = ["--middleware", serving_spec.API_GUARD_MIDDLEWARE]

REPO = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.33.0"
STACKS = ["prod", "test"]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-serving/vllm:0.34.0-ray2.60.0"
RAY_VERSION = "2.60.0"
VLLM_VERSION = "0.34.0"
VPC_CIDR = "10.0.0.0/16"  # what the stack passes for a VPC it creates
# Kubernetes quantity (apimachinery resource.Quantity's regular form).
QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$")


# --- Plans and specs --------------------------------------------------------------


# The plan's JSON (what the assertions compare with) -> the same plan's typed figures
# (what the builders take): the two edges of one Plan, checked against each other.
_DEPLOYMENTS: dict[str, object] = {}


def _key(plan_json: dict) -> str:
    return json.dumps(plan_json, sort_keys=True)


def plan_for(config_root: Path, stack: str) -> dict:
    plan = make_plan(load_stack_file(stack, config_root).plan_request())
    doc = plan.to_json_dict()
    if plan.feasible:
        _DEPLOYMENTS[_key(doc)] = plan.deployment()
    return doc


@lru_cache(maxsize=None)
def stack_plan_json(stack: str) -> str:
    return json.dumps(plan_for(REPO, stack))


def stack_plan(stack: str) -> dict:
    return json.loads(stack_plan_json(stack))


@lru_cache(maxsize=None)
def thresholds(stack: str = "prod") -> dict:
    """The benchmark's thresholds, from the stack config that owns them."""
    cfg = load_stack_file(stack, REPO)
    return {"ttft_p99_ms": cfg.serving.sla.ttft_p99_ms, "tpot_p99_ms": cfg.serving.sla.tpot_p99_ms,
            "nccl_busbw_floor_gbps": cfg.checks.nccl_bus_bandwidth_floor_gbps}


def make_spec(plan: dict, **overrides) -> ServingSpec:
    base = dict(deployment=_DEPLOYMENTS[_key(plan)], namespace="gpu-serving", image=IMAGE, ray_version=RAY_VERSION, pvc_name="model-weights",
                vllm_version=VLLM_VERSION, production=True, vpc_cidr=VPC_CIDR, **thresholds())  # fmt: skip
    base.update(overrides)
    return ServingSpec(**base)


def manifests(spec: ServingSpec) -> list[dict]:
    """Every object components/serving.py creates for `spec`, from the builders."""
    out = [raycluster.scripts_config_map(spec)]
    if spec.efa_check:
        out += [checks.efa_check_service(spec), checks.efa_check_job(spec)]
    out += [raycluster.raycluster(spec), exposure.service(spec), exposure.pdb(spec)]
    if spec.monitoring == "podmonitor":
        out.append(exposure.pod_monitor(spec))
    if spec.benchmark:
        out.append(checks.benchmark_job(spec))
    return out + network_policies.serving_policies(spec)


def all_checks(plan: dict, **overrides) -> ServingSpec:
    """Every optional object on (the EFA check only where it can run), and clients of every port."""
    can_check_efa = plan["layout"]["nodes"] >= 2 and plan["pod"]["efa_interfaces"] > 0
    clients = dict(
        api_clients=serving_spec.Clients(namespaces=("apps",), cidrs=("10.20.0.0/16",)),
        metrics_clients=serving_spec.Clients(namespaces=("monitoring",)),
        dashboard_clients=serving_spec.Clients(cidrs=("10.30.0.0/24",)),
    )
    return make_spec(plan, efa_check=can_check_efa, benchmark=True, monitoring="podmonitor", **{**clients, **overrides})


def served(container: dict) -> list[str]:
    """The serving command the head's script ends by exec-ing: its arguments from `vllm` on."""
    args = container["args"]
    return args[args.index("vllm") :]


def modified_config(tmp_path: Path, model: str, instance: str) -> Path:
    """Pulumi.prod.yaml with another model and instance type, nothing else edited."""
    cfg = read_stack_file("prod", REPO)
    cfg["gpu-serving:model"]["name"] = model
    cfg["gpu-serving:gpu"]["instanceType"] = instance
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": cfg}))
    return tmp_path


# --- The KubeRay CRD, strict ---------------------------------------------------------


def _strict(schema):
    """The CRD's structural schema as strict JSON Schema (see the module doc)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _list_type(validator, list_type, instance, schema):
    if not isinstance(instance, list):
        return
    if list_type == "set" and len({json.dumps(i, sort_keys=True) for i in instance}) != len(instance):
        yield jsonschema.ValidationError("x-kubernetes-list-type set: duplicate items")
    if list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen = [tuple(item.get(k) for k in keys) for item in instance if isinstance(item, dict)]
        if len(set(seen)) != len(seen):
            yield jsonschema.ValidationError(f"x-kubernetes-list-type map: duplicate keys {keys}")


StrictCRDValidator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"x-kubernetes-list-type": _list_type})


@pytest.fixture(scope="module")
def crd(fixture_file) -> dict:
    doc = yaml_text.safe_load(fixture_file("upstream", "kuberay-operator-1.7.0", "ray.io_rayclusters.yaml").read_text())
    (served,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1" and v["served"]]
    return served["schema"]["openAPIV3Schema"]


def crd_errors(crd_schema: dict, manifest: dict) -> list[str]:
    validator = StrictCRDValidator(_strict(crd_schema))
    return [f"{e.message} at {'/'.join(map(str, e.absolute_path))}" for e in validator.iter_errors(manifest)]


def k8s_errors(manifest: dict) -> list[str]:
    try:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{manifest['kind']}: {exc.message} at {'/'.join(map(str, exc.path))}"]
    return []


def as_pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}


def pod_templates(rc: dict) -> list[dict]:
    return [rc["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in rc["spec"].get("workerGroupSpecs", [])]


def quantities(doc) -> list[str]:
    """Every resource amount and emptyDir size in a manifest."""
    found = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("requests", "limits") and isinstance(value, dict):
                found += [str(v) for v in value.values()]
            elif key == "sizeLimit":
                found.append(str(value))
            else:
                found += quantities(value)
    elif isinstance(doc, list):
        for item in doc:
            found += quantities(item)
    return found


# --- Schemas ---------------------------------------------------------------------------


def test_strict_crd_schema_catches_what_pruning_would_hide(crd):
    rc = raycluster.raycluster(make_spec(stack_plan("prod")))
    bad = copy.deepcopy(rc)
    bad["spec"]["headGroupSpec"]["rayStartparams"] = {}  # misspelt
    bad["spec"]["workerGroupSpecs"][0]["replicas"] = "3"
    bad["spec"]["upgradeStrategy"]["type"] = "Rolling"
    errors = "\n".join(crd_errors(crd, bad))
    assert "rayStartparams" in errors and "'3' is not of type 'integer'" in errors and "Rolling" in errors


@pytest.mark.parametrize("stack", STACKS)
def test_raycluster_validates_against_the_kuberay_crd(stack, crd):
    rc = raycluster.raycluster(all_checks(stack_plan(stack)))
    assert crd_errors(crd, rc) == []
    # The CRD's CEL rules concern fields the stack never sets.
    assert "managedBy" not in rc["spec"] and "gcsFaultToleranceOptions" not in rc["spec"]
    assert k8s_errors({"apiVersion": "v1", "kind": "ConfigMap", "metadata": rc["metadata"]}) == []


@pytest.mark.parametrize("stack", STACKS)
def test_pod_templates_are_valid_pods(stack):
    for monitoring in serving_spec.MONITORING_KINDS:
        rc = raycluster.raycluster(make_spec(stack_plan(stack), monitoring=monitoring))
        for template in pod_templates(rc):
            assert k8s_errors(as_pod(template)) == []


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("service_type", serving_spec.SERVICE_TYPES)
def test_every_other_manifest_validates_strictly(stack, service_type):
    spec = all_checks(stack_plan(stack), service_type=service_type)
    docs = [d for d in manifests(spec) if d["kind"] not in ("RayCluster", "PodMonitor")]
    assert {d["kind"] for d in docs} >= {"Service", "PodDisruptionBudget", "Job", "NetworkPolicy"}
    for doc in docs:
        assert k8s_errors(doc) == []
    for doc in manifests(spec):
        bad = [q for q in quantities(doc) if not QUANTITY.match(q)]
        assert not bad, (doc["kind"], bad)


def test_strict_validation_rejects_unknown_fields():
    svc = exposure.service(make_spec(stack_plan("prod")))
    svc["spec"]["selectr"] = {}
    assert k8s_errors(svc)


def test_pod_monitor_shape():
    spec = make_spec(stack_plan("prod"), monitoring="podmonitor", monitor_labels={"release": "kube-prometheus-stack"})
    pm = exposure.pod_monitor(spec)
    assert (pm["apiVersion"], pm["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pm["spec"]["selector"] == {"matchLabels": {"ray.io/cluster": spec.name}}
    assert pm["spec"]["namespaceSelector"] == {"matchNames": [spec.namespace]}
    ports = {e["port"]: e["path"] for e in pm["spec"]["podMetricsEndpoints"]}
    assert ports == {"http": "/metrics", "metrics": "/metrics"}
    # The port names exist on the containers they scrape.
    rc = raycluster.raycluster(spec)
    head_ports = {p["name"]: p["containerPort"] for p in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    worker_ports = {p["name"] for p in rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["ports"]}
    assert head_ports["http"] == 8000 and head_ports["metrics"] == 8080 and "metrics" in worker_ports
    # No scrape annotations when a PodMonitor scrapes.
    assert not any("prometheus.io/scrape" in (t["metadata"].get("annotations") or {}) for t in pod_templates(rc))


def test_scrape_annotations_when_chosen():
    rc = raycluster.raycluster(make_spec(stack_plan("prod"), monitoring="annotations"))
    head, worker = pod_templates(rc)
    assert head["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    assert worker["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    assert all(t["metadata"]["annotations"]["prometheus.io/path"] == "/metrics" for t in (head, worker))
    assert "PodMonitor" not in {d["kind"] for d in manifests(make_spec(stack_plan("prod")))}


# --- Cross-layer invariants ---------------------------------------------------------


def ray_containers(rc: dict) -> list[dict]:
    return [t["spec"]["containers"][0] for t in pod_templates(rc)]


def pod_count(rc: dict) -> int:
    return 1 + sum(g["replicas"] for g in rc["spec"].get("workerGroupSpecs", []))


def bytes_of(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * factor
    return int(q)


@pytest.mark.parametrize("stack", STACKS)
def test_gpus_per_pod_times_pods_is_the_layout(stack):
    plan = stack_plan(stack)
    rc = raycluster.raycluster(make_spec(plan))
    lay = plan["layout"]
    per_pod = {int(c["resources"]["limits"]["nvidia.com/gpu"]) for c in ray_containers(rc)}
    assert per_pod == {lay["gpus_per_node"]}
    assert pod_count(rc) == lay["nodes"]
    assert lay["gpus_per_node"] * pod_count(rc) == lay["tp"] * lay["pp"] * lay["dp"]
    # One pod per node, the head included; no autoscaling.
    assert rc["spec"]["enableInTreeAutoscaling"] is False
    for group in rc["spec"].get("workerGroupSpecs", []):
        assert group["groupName"] == "gpu"
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == lay["nodes"] - 1


@pytest.mark.parametrize("stack", STACKS)
def test_efa_per_pod_matches_the_plan_and_the_launch_template(stack):
    plan = stack_plan(stack)
    rc = raycluster.raycluster(make_spec(plan))
    itype = get_instance_type(plan["instance"]["type"])
    template_efa = efa.efa_interface_count(efa.efa_interfaces(itype, ["sg"]))
    assert plan["pod"]["efa_interfaces"] == template_efa
    for c in ray_containers(rc):
        res = c["resources"]
        assert res["requests"] == res["limits"]
        if template_efa:
            assert int(res["limits"]["vpc.amazonaws.com/efa"]) == template_efa
        else:
            assert "vpc.amazonaws.com/efa" not in res["limits"]


@pytest.mark.parametrize("stack", STACKS)
def test_cpu_memory_and_shm_come_from_the_plan_and_fit_the_node(stack):
    plan = stack_plan(stack)
    rc = raycluster.raycluster(make_spec(plan))
    node_memory = get_instance_type(plan["instance"]["type"]).memory_bytes
    for template in pod_templates(rc):
        c = template["spec"]["containers"][0]
        memory = bytes_of(c["resources"]["limits"]["memory"])
        assert memory == plan["pod"]["memory_bytes"]
        assert int(c["resources"]["limits"]["cpu"]) == plan["pod"]["cpu"]
        (shm,) = [v for v in template["spec"]["volumes"] if v["name"] == raycluster.SHM_VOLUME]
        assert shm["emptyDir"]["medium"] == "Memory"
        shm_bytes = bytes_of(shm["emptyDir"]["sizeLimit"])
        assert shm_bytes == plan["pod"]["shm_bytes"] >= plan["pod"]["object_store_bytes"]
        assert {"name": raycluster.SHM_VOLUME, "mountPath": "/dev/shm"} in c["volumeMounts"]
        # A memory-backed emptyDir is charged to the pod's memory limit (Kubernetes
        # API, EmptyDirVolumeSource.sizeLimit: "the minimum value between the
        # SizeLimit specified here and the sum of memory limits of all containers"),
        # so /dev/shm lives inside the pod's memory, which lives inside the node's.
        assert shm_bytes <= memory <= node_memory
        init = template["spec"]["initContainers"]
        assert memory + sum(bytes_of(i["resources"]["limits"]["memory"]) for i in init) <= node_memory
    if stack == "prod":
        # On the p5 nodes there is room even if /dev/shm were counted on top.
        assert plan["pod"]["memory_bytes"] + plan["pod"]["shm_bytes"] <= node_memory


@pytest.mark.parametrize("stack", STACKS)
def test_tolerations_and_node_selection_match_the_gpu_nodes(stack):
    plan = stack_plan(stack)
    spec = all_checks(plan)
    itype = get_instance_type(plan["instance"]["type"])
    node_labels = scheduling.gpu_labels(itype)
    taints = scheduling.gpu_taints()
    pod_specs = [t["spec"] for t in pod_templates(raycluster.raycluster(spec))]
    pod_specs += [d["spec"]["template"]["spec"] for d in manifests(spec) if d["kind"] == "Job"]
    for ps in pod_specs:
        assert [(t["key"], t["value"], t["effect"]) for t in ps["tolerations"]] == [
            (t["key"], t["value"], {"NO_SCHEDULE": "NoSchedule"}[t["effect"]]) for t in taints
        ]
        assert all(t["operator"] == "Equal" for t in ps["tolerations"])
        assert ps["nodeSelector"] == {
            scheduling.ROLE_LABEL: "gpu",
            scheduling.INSTANCE_TYPE_LABEL: plan["instance"]["type"],
        }
        assert all(node_labels[k] == v for k, v in ps["nodeSelector"].items())
        assert ps["enableServiceLinks"] is False


@pytest.mark.parametrize("stack", STACKS)
def test_vllm_serve_arguments_are_the_plans(stack):
    plan = stack_plan(stack)
    spec = make_spec(plan)
    head = raycluster.raycluster(spec)["spec"]["headGroupSpec"]["template"]
    argv = served(head["spec"]["containers"][0])
    model_path = f"/models/{plan['model']['checkpoint']}"
    assert argv[:5] == ["vllm", "serve", model_path, "--served-model-name", plan["model"]["checkpoint"]]
    assert argv[5:] == plan["vllm_args"] + API_GUARD  # the plan's arguments, then the API key guard
    # The weights path is the one mounted read-only from the claim.
    assert {"name": raycluster.WEIGHTS_VOLUME, "mountPath": "/models", "readOnly": True} in head["spec"]["containers"][0]["volumeMounts"]
    (weights,) = [v for v in head["spec"]["volumes"] if v["name"] == raycluster.WEIGHTS_VOLUME]
    assert weights["persistentVolumeClaim"] == {"claimName": "model-weights", "readOnly": True}


@pytest.mark.parametrize("stack", STACKS)
def test_head_runs_its_own_command_and_workers_keep_kuberays(stack):
    spec = make_spec(stack_plan(stack))
    rc = raycluster.raycluster(spec)
    head = rc["spec"]["headGroupSpec"]["template"]
    assert head["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert head["spec"]["containers"][0]["command"][1].startswith(script_files.MOUNT_PATH + "/")
    # Workers run their check, then KubeRay's generated, blocking command (the run: test_pod_scripts.py).
    for group in rc["spec"].get("workerGroupSpecs", []):
        c = group["template"]["spec"]["containers"][0]
        assert c["command"] == ["/bin/bash", f"{script_files.MOUNT_PATH}/ray_worker.sh"]
        assert group["template"]["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"


def binary_quantity_bytes(q: str) -> int:
    """A Kubernetes quantity with a binary suffix (or none), in bytes."""
    for i, suffix in enumerate(("Ki", "Mi", "Gi", "Ti"), start=1):
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * 1024**i
    return int(q)


@pytest.mark.parametrize("stack", STACKS)
def test_every_ray_pod_keeps_its_compile_cache_for_the_pods_life(stack):
    spec = make_spec(stack_plan(stack))
    for template in pod_templates(raycluster.raycluster(spec)):
        ps = template["spec"]
        (vol,) = [v for v in ps["volumes"] if v["name"] == raycluster.COMPILE_CACHE_VOLUME]
        # An emptyDir on the node's disk: it outlives the container (a restart skips compilation), bounded
        # within the root volume's allowance (past it the kubelet evicts the pod, the node's disk never fills).
        assert set(vol) == {"name", "emptyDir"} and "medium" not in vol["emptyDir"]
        assert binary_quantity_bytes(vol["emptyDir"]["sizeLimit"]) < stack_plan(stack)["node"]["root_volume_gib"] * 2**30
        c = ps["containers"][0]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == raycluster.COMPILE_CACHE_VOLUME]
        env = {e["name"]: e.get("value") for e in c["env"]}
        for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH"):
            assert env[name].startswith(mount["mountPath"]), name
        assert not any("hostPath" in v for v in ps["volumes"])


@pytest.mark.parametrize("stack", STACKS)
def test_efa_pods_lock_memory_without_a_capability_and_check_it(stack):
    plan = stack_plan(stack)
    spec = all_checks(plan)
    efa = plan["pod"]["efa_interfaces"] > 0
    rc = raycluster.raycluster(spec)
    jobs = [d["spec"]["template"] for d in manifests(spec) if d["kind"] == "Job" and "efa" in d["metadata"]["name"]]
    pods = [t["spec"] for t in pod_templates(rc)] + [j["spec"] for j in jobs]
    for ps in pods:
        assert ps["securityContext"]["runAsNonRoot"] is True and ps["securityContext"]["runAsUser"] != 0
        for c in ps["containers"]:
            assert "add" not in c["securityContext"]["capabilities"] and "privileged" not in c["securityContext"]
            assert "runAsUser" not in c["securityContext"]  # the pod's non-root user
            # Python's getpass.getuser() (torch Inductor, vLLM) needs a name for a UID the image's passwd lacks.
            assert any(e["name"] == "USER" and e.get("value") for e in c["env"])
    head, *workers = ray_containers(rc)
    assert head["args"][3] == ("1" if efa else "0")  # ray_head.sh REQUIRE_MEMLOCK
    assert all(w["args"] == ["1" if efa else "0"] for w in workers)


@pytest.mark.parametrize("production, level", [(True, "WARN"), (False, "INFO")])
def test_nccl_logs_warnings_only_in_production(production, level):
    spec = make_spec(stack_plan("prod"), production=production, efa_check=True)
    for c in ray_containers(raycluster.raycluster(spec)):
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["NCCL_DEBUG"] == level
        assert ("NCCL_DEBUG_SUBSYS" in env) is (level == "INFO")
    # The EFA check reads NCCL's transport lines: INFO whatever the stack.
    check_env = {e["name"]: e["value"] for e in checks.efa_check_job(spec)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert check_env["NCCL_DEBUG"] == "INFO" and check_env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"


def test_a_serving_command_the_release_refuses_is_refused():
    import dataclasses

    plan = stack_plan("prod")
    spec = make_spec(plan)
    serve = dataclasses.replace(spec.deployment.serve, vllm_args=(*spec.vllm_args, "--tool-call-parser", "deepseek-v4"))
    with pytest.raises(UserError, match="vLLM 0.34.0 would refuse the serving command: .*--tool-call-parser 'deepseek-v4'"):
        ServingSpec(**{**spec.__dict__, "deployment": dataclasses.replace(spec.deployment, serve=serve)})
    with pytest.raises(UserError, match="bin/vllm-flag-reference 0.99.0"):
        make_spec(plan, vllm_version="0.99.0")


@pytest.mark.parametrize("stack", STACKS)
def test_startup_probe_budget_covers_the_cold_start(stack):
    plan = stack_plan(stack)
    spec = make_spec(plan)
    c = raycluster.raycluster(spec)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    startup = c["startupProbe"]
    budget = startup["failureThreshold"] * startup["periodSeconds"]
    su = plan["startup"]
    cold = plan["storage"]["estimated_cold_start_s"]
    assert su["cold_start_s"] == cold
    # The probe covers the Ray join and the engine's share, which is vLLM's own engine-ready timeout ...
    assert su["engine_ready_timeout_s"] >= cold
    assert budget == su["startup_budget_s"] >= su["ray_join_timeout_s"] + su["engine_ready_timeout_s"]
    assert budget < su["ray_join_timeout_s"] + su["engine_ready_timeout_s"] + startup["periodSeconds"]
    # ... and the head waits for Ray exactly as long as the probe's Ray share.
    assert c["args"][2] == str(su["ray_join_timeout_s"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == str(su["engine_ready_timeout_s"])
    assert int(env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]) == su["execute_model_timeout_s"] > 300  # vLLM's default
    for worker in ray_containers(raycluster.raycluster(spec))[1:]:
        wenv = {e["name"]: e.get("value") for e in worker["env"]}
        assert wenv["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == serving_spec.API_PORT == 8000
    # Liveness runs only after startup succeeded; it tolerates a minute of failures.
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 60
    if stack == "prod":
        # Prod's target is 750 s: the store is sized to read 4 x 865 GB in 750 - 180 = 570 s
        # (1,447 MiB/s per node, under one NFS client's 1,500), + 180 s engine init = 750 s;
        # 600 s Ray join + ceil(1.5 x 750 s) = 1,725 s, in whole 10 s periods.
        assert round(cold) == 750 and budget == 1730


@pytest.mark.parametrize("stack", STACKS)
def test_ray_start_params_are_the_plans(stack):
    plan = stack_plan(stack)
    rc = raycluster.raycluster(make_spec(plan))
    # The dashboard and job API answer on the head pod's loopback only (KubeRay would bind them to 0.0.0.0).
    assert rc["spec"]["headGroupSpec"]["rayStartParams"] == {**plan["ray_start_params"], "dashboard-host": "127.0.0.1"}
    for group in rc["spec"].get("workerGroupSpecs", []):
        assert group["rayStartParams"] == plan["ray_start_params"]
    for params in [rc["spec"]["headGroupSpec"]["rayStartParams"]] + [g["rayStartParams"] for g in rc["spec"].get("workerGroupSpecs", [])]:
        assert all(isinstance(v, str) for v in params.values())
    assert rc["spec"]["rayVersion"] == RAY_VERSION
    assert rc["spec"]["upgradeStrategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("stack", STACKS)
def test_environment_and_weights_wait(stack):
    plan = stack_plan(stack)
    spec = make_spec(plan)
    for template in pod_templates(raycluster.raycluster(spec)):
        c = template["spec"]["containers"][0]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["VLLM_HOST_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["HF_HUB_OFFLINE"] == "1"
        assert env["NCCL_DEBUG"] == ("WARN" if spec.production else "INFO")
        assert ("FI_EFA_USE_HUGE_PAGE" in env) == (plan["pod"]["efa_interfaces"] > 0)
        for unneeded in ("FI_EFA_USE_DEVICE_RDMA", "FI_PROVIDER", "NCCL_PROTO", "RDMAV_FORK_SAFE", "LD_LIBRARY_PATH"):
            assert unneeded not in env
        init = [i for i in template["spec"]["initContainers"] if i["name"] == "wait-for-weights"][0]
        # It waits for the marker where the staging Job writes it (the wait itself runs in test_pod_scripts.py).
        assert spec.marker == staging.marker_path("/models", plan["model"]["checkpoint"], "hf")
        assert spec.marker in init["args"]
        assert {"name": raycluster.WEIGHTS_VOLUME, "mountPath": "/models", "readOnly": True} in init["volumeMounts"]
        assert init["resources"]["requests"] == init["resources"]["limits"]  # Guaranteed QoS kept


def pod_templates_by_role(spec: ServingSpec) -> dict[str, dict]:
    rc = raycluster.raycluster(spec)
    out = {"head": rc["spec"]["headGroupSpec"]["template"]}
    out.update({f"worker {g['groupName']}": g["template"] for g in rc["spec"].get("workerGroupSpecs", [])})
    out.update({d["metadata"]["name"]: d["spec"]["template"] for d in manifests(spec) if d["kind"] == "Job"})
    return out


SCRIPT_NAME = re.compile(r"[A-Za-z0-9_]+\.(?:py|sh)\b")


@pytest.mark.parametrize("stack", STACKS)
def test_every_script_a_pod_runs_is_mounted_read_only_from_the_serving_config_map(stack):
    spec = all_checks(stack_plan(stack))
    config_map = raycluster.scripts_config_map(spec)
    data = config_map["data"]
    assert config_map["metadata"]["namespace"] == spec.namespace
    ran = set()
    for role, template in pod_templates_by_role(spec).items():
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod.get("initContainers", []) + pod["containers"]:
            if "command" not in c:
                continue  # a worker's Ray container: KubeRay's own command
            interpreter, program = c["command"]
            assert interpreter in ("sh", "/bin/bash", "python3") and program.startswith(script_files.MOUNT_PATH + "/"), (role, c["command"])
            (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == script_files.MOUNT_PATH]
            assert mount["readOnly"] is True
            source = volumes[mount["name"]]["configMap"]
            assert source["name"] == config_map["metadata"]["name"] and source["defaultMode"] == 0o555
            name = program.rsplit("/", 1)[1]
            # The script and every script it calls (a shell script's commands name them) are in the ConfigMap.
            code = [line for line in data[name].splitlines() if name.endswith(".sh") and not line.lstrip().startswith("#")]
            calls = {n for n in SCRIPT_NAME.findall("\n".join(code)) if (script_files.SCRIPTS_DIR / n).is_file()}
            # ... and the modules its command loads by import path (`vllm serve --middleware module.Class`).
            args = c.get("args") or []
            calls |= {args[i + 1].split(".")[0] + ".py" for i, a in enumerate(args[:-1]) if a == "--middleware"}
            assert {name, *calls} <= set(data), (role, name, calls)
            ran |= {name, *calls}
        assert script_files.HASH_ANNOTATION in template["metadata"]["annotations"], role
    if spec.efa_check and spec.benchmark:
        assert ran == set(data), "the ConfigMap carries nothing that no pod runs"


def _edited_scripts(tmp_path: Path, monkeypatch, name: str) -> None:
    edited = tmp_path / "scripts"
    edited.mkdir()
    for path in script_files.SCRIPTS_DIR.iterdir():
        if path.is_file():
            (edited / path.name).write_text(path.read_text())
    (edited / name).write_text((edited / name).read_text() + "# edited\n")
    monkeypatch.setattr(script_files, "SCRIPTS_DIR", edited)
    script_files.read.cache_clear()


@pytest.mark.parametrize(
    "name, replaced",
    [
        ("benchmark.py", {"vllm-benchmark"}),
        ("efa_allreduce.py", {"vllm-efa-check"}),
        # What is served changed: the benchmark runs again (its RayCluster hash).
        ("ray_wait.py", {"head", "vllm-benchmark"}),
        ("wait_for_weights.sh", {"head", "worker gpu", "vllm-benchmark"}),
    ],
)
def test_a_changed_script_replaces_exactly_the_pods_that_run_it(tmp_path, monkeypatch, name, replaced):
    spec = all_checks(stack_plan("prod"))
    before, data_before = pod_templates_by_role(spec), raycluster.scripts_config_map(spec)["data"]
    _edited_scripts(tmp_path, monkeypatch, name)
    try:
        after, data_after = pod_templates_by_role(spec), raycluster.scripts_config_map(spec)["data"]
    finally:
        script_files.read.cache_clear()
    assert {k for k, v in data_after.items() if data_before[k] != v} == {name}
    assert {role for role in before if before[role] != after[role]} == replaced


KUBELET_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@pytest.mark.parametrize("stack", STACKS)
def test_no_command_is_rewritten_by_the_kubelet(stack):
    """The kubelet expands `$(NAME)` in command/args; scripts must not contain that form."""
    spec = all_checks(stack_plan(stack))
    texts = []
    for doc in manifests(spec):
        for ps in [t["spec"] for t in (pod_templates(doc) if doc["kind"] == "RayCluster" else [])] + (
            [doc["spec"]["template"]["spec"]] if doc["kind"] == "Job" else []
        ):
            for c in ps.get("initContainers", []) + ps["containers"]:
                texts += c.get("command", []) + c.get("args", [])
    assert texts and not [m for t in texts for m in KUBELET_REF.findall(t)]


# --- Service, PDB ----------------------------------------------------------------------


def test_service_selects_the_head_by_kuberays_labels():
    spec = make_spec(stack_plan("prod"))
    svc = exposure.service(spec)
    # KubeRay 1.7.0 utils/constant.go: RayClusterLabelKey, RayNodeTypeLabelKey; rayv1.HeadNode = "head".
    assert svc["spec"]["selector"] == {"ray.io/cluster": "vllm", "ray.io/node-type": "head"}
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert "annotations" not in svc["metadata"]
    # Never a Service called `vllm` (its VLLM_* link variables would clash with vLLM's).
    assert svc["metadata"]["name"] == "vllm-api" != "vllm"
    assert spec.endpoint == "http://vllm-api.gpu-serving.svc.cluster.local:8000/v1"


def test_internal_load_balancer():
    clients = Clients(cidrs=("10.8.0.0/16", "10.9.0.0/24"))
    svc = exposure.service(make_spec(stack_plan("prod"), service_type="internal-lb", api_clients=clients))
    assert svc["spec"]["type"] == "LoadBalancer"
    # Only the named clients, with their addresses kept for the NetworkPolicy (valid fields of a v1 Service: the
    # schema test of the synthesized manifests covers them).
    assert svc["spec"]["loadBalancerSourceRanges"] == ["10.8.0.0/16", "10.9.0.0/24"]
    assert svc["spec"]["externalTrafficPolicy"] == "Local"
    ann = svc["metadata"]["annotations"]
    assert ann["service.beta.kubernetes.io/aws-load-balancer-internal"] == "true"
    assert ann["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    assert ann["service.beta.kubernetes.io/aws-load-balancer-type"] == "nlb"
    assert "loadBalancerClass" not in svc["spec"]


def test_pdb_allows_no_voluntary_disruption():
    spec = make_spec(stack_plan("prod"))
    doc = exposure.pdb(spec)
    assert doc["spec"]["maxUnavailable"] == 0 and "minAvailable" not in doc["spec"]
    assert doc["spec"]["selector"] == {"matchLabels": {"ray.io/cluster": spec.name}}
    assert doc["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


# --- Checks ------------------------------------------------------------------------------


def test_efa_check_job_owns_two_whole_gpu_nodes():
    plan = stack_plan("prod")
    spec = make_spec(plan, efa_check=True)
    job, svc = checks.efa_check_job(spec), checks.efa_check_service(spec)
    js = job["spec"]
    assert js["completionMode"] == "Indexed" and js["completions"] == js["parallelism"] == 2
    ps = js["template"]["spec"]
    assert ps["subdomain"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= js["template"]["metadata"]["labels"].items()
    c = ps["containers"][0]
    assert c["resources"] == raycluster.gpu_pod_resources(spec)
    # Pod 0 of the Job, by the headless Service's DNS name, is the rendezvous (the run: test_pod_scripts.py).
    assert f"{job['metadata']['name']}-0.{svc['metadata']['name']}.gpu-serving.svc.cluster.local" in c["args"]


def test_efa_check_needs_two_nodes_with_efa():
    with pytest.raises(UserError, match="2 GPU nodes"):
        make_spec(stack_plan("test"), efa_check=True)


def test_bus_bandwidth_is_nccl_tests_formula():
    # The verdict itself runs on captured NCCL logs in tests/test_efa_check.py.
    assert efa_allreduce.allreduce_bus_bandwidth_gbps(2 * 10**9, 0.01, 16) == pytest.approx(200 * 2 * 15 / 16)


SAMPLE_RESULT = {
    "date": "20261202-120000",
    "backend": "openai",
    "model_id": "/models/deepseek-ai/DeepSeek-V4-Pro",
    "num_prompts": 200,
    "completed": 200,
    "total_input_tokens": 204800,
    "total_output_tokens": 51200,
    "request_throughput": 3.1,
    "output_throughput": 790.0,
    "mean_ttft_ms": 120.5,
    "median_ttft_ms": 110.2,
    "std_ttft_ms": 30.1,
    "p99_ttft_ms": 231.7,
    "mean_tpot_ms": 25.3,
    "median_tpot_ms": 24.9,
    "std_tpot_ms": 2.2,
    "p99_tpot_ms": 33.8,
}


def test_benchmark_checker_passes_and_fails_on_sample_results():
    assert benchmark.check_benchmark_result(SAMPLE_RESULT, 250, 40, 200) == []
    slow = {**SAMPLE_RESULT, "p99_ttft_ms": 250.0, "p99_tpot_ms": 41.5}
    problems = benchmark.check_benchmark_result(slow, 250, 40, 200)
    assert len(problems) == 2 and "TTFT 250.0 ms is not below 250" in problems[0] and "TPOT 41.5" in problems[1]
    failed = {**SAMPLE_RESULT, "completed": 190}
    assert benchmark.check_benchmark_result(failed, 250, 40, 200) == ["10 of 200 requests failed"]
    missing = {k: v for k, v in SAMPLE_RESULT.items() if k != "p99_tpot_ms"}
    assert "no p99_tpot_ms" in benchmark.check_benchmark_result(missing, 250, 40, 200)[0]


def test_benchmark_command_targets_the_service_with_the_plans_model():
    plan = stack_plan("prod")
    spec = make_spec(plan, benchmark=True)
    argv = checks.benchmark_argv(spec)
    assert argv[:3] == ["vllm", "bench", "serve"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--base-url"] == "http://vllm-api.gpu-serving.svc.cluster.local:8000"
    assert flags["--served-model-name"] == plan["model"]["checkpoint"]
    assert "--save-result" in argv and argv[argv.index("--percentile-metrics") + 1] == "ttft,tpot"
    # p50 and p99: the median and the tail, both printed beside the plan's prediction.
    assert argv[argv.index("--metric-percentiles") + 1] == "50,99"
    # The Job's script runs it after `--` (the run: test_pod_scripts.py).
    args = checks.benchmark_job(spec)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--") + 1 :] == argv
    # Re-run whenever what is served changes.
    other = make_spec(plan, benchmark=True, image=IMAGE + "-2")
    key = serving_spec.SPEC_HASH_ANNOTATION
    ann = lambda s: checks.benchmark_job(s)["spec"]["template"]["metadata"]["annotations"][key]  # noqa: E731
    assert ann(spec) != ann(other)


def test_bad_settings_are_refused_with_the_reason():
    plan = stack_plan("prod")
    with pytest.raises(UserError, match="service type"):
        make_spec(plan, service_type="nodeport")
    with pytest.raises(UserError, match="monitoring"):
        make_spec(plan, monitoring="scrape")
    with pytest.raises(UserError, match="DNS-1035"):
        make_spec(plan, name="VLLM")
    # A plan that does not fit has no deployment to hand to the serving layer.
    cfg = load_stack_file("prod", REPO)
    small = make_plan(cfg.plan_request().replace(instance_type="g6e.xlarge", nodes=1, tp=None, pp=None))
    assert not small.feasible
    with pytest.raises(UserError, match="does not fit"):
        small.deployment()


# --- A changed stack file changes every dependent figure -----------------------------------


def figures_from_manifests(rc: dict) -> dict:
    head = rc["spec"]["headGroupSpec"]
    c = head["template"]["spec"]["containers"][0]
    lim = c["resources"]["limits"]
    (shm,) = [v for v in head["template"]["spec"]["volumes"] if v["name"] == raycluster.SHM_VOLUME]
    argv = served(c)
    workers = rc["spec"].get("workerGroupSpecs", [])
    return {
        "instance_type": head["template"]["spec"]["nodeSelector"][scheduling.INSTANCE_TYPE_LABEL],
        "pods": pod_count(rc),
        "gpus": int(lim["nvidia.com/gpu"]),
        "efa": int(lim.get("vpc.amazonaws.com/efa", 0)),
        "cpu": int(lim["cpu"]),
        "memory": bytes_of(lim["memory"]),
        "shm": bytes_of(shm["emptyDir"]["sizeLimit"]),
        "ray_params": {k: v for k, v in head["rayStartParams"].items() if k != "dashboard-host"},
        "worker_ray_params": workers[0]["rayStartParams"] if workers else None,
        "model_path": argv[2],
        "served_model_name": argv[4],
        "vllm_args": argv[5:],
        "startup_threshold": c["startupProbe"]["failureThreshold"],
    }


def figures_from_plan(plan: dict) -> dict:
    su = plan["startup"]
    budget = su["ray_join_timeout_s"] + su["engine_ready_timeout_s"]
    return {
        "instance_type": plan["instance"]["type"],
        "pods": plan["layout"]["nodes"],
        "gpus": plan["pod"]["gpus"],
        "efa": plan["pod"]["efa_interfaces"],
        "cpu": plan["pod"]["cpu"],
        "memory": plan["pod"]["memory_bytes"],
        "shm": plan["pod"]["shm_bytes"],
        "ray_params": plan["ray_start_params"],
        "worker_ray_params": plan["ray_start_params"] if plan["layout"]["nodes"] > 1 else None,
        "model_path": f"/models/{plan['model']['checkpoint']}",
        "served_model_name": plan["model"]["checkpoint"],
        "vllm_args": plan["vllm_args"] + API_GUARD,
        "startup_threshold": math.ceil(budget / su["startup_probe_period_s"]),
    }


@pytest.mark.parametrize(
    "model, instance",
    [("kimi-k3", "p5e.48xlarge"), ("qwen3-0.6b", "g5.12xlarge"), ("deepseek-v4-pro", "p5en.48xlarge")],
)
def test_changing_model_or_instance_changes_every_dependent_figure(tmp_path, crd, model, instance):
    prod_plan = stack_plan("prod")
    new_plan = plan_for(modified_config(tmp_path, model, instance), "prod")
    assert new_plan["feasible"], new_plan["errors"]
    before = figures_from_manifests(raycluster.raycluster(make_spec(prod_plan)))
    after = figures_from_manifests(raycluster.raycluster(make_spec(new_plan)))
    # Every figure follows the plan, and a figure changed exactly where the plan's did.
    assert before == figures_from_plan(prod_plan)
    assert after == figures_from_plan(new_plan)
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {k for k in after if figures_from_plan(new_plan)[k] != figures_from_plan(prod_plan)[k]}
    assert "instance_type" in changed
    if model != "deepseek-v4-pro":
        assert {"model_path", "served_model_name", "vllm_args"} <= changed
    # And the new cluster is still valid.
    spec = all_checks(new_plan)
    assert crd_errors(crd, raycluster.raycluster(spec)) == []
    for template in pod_templates(raycluster.raycluster(spec)):
        assert k8s_errors(as_pod(template)) == []


def test_model_and_marker_paths_from_the_storage_layer():
    """An S3-staged checkpoint lives where infra.k8s.staging puts it; serving follows, the served name stays the checkpoint."""
    plan = stack_plan("prod")
    s3 = "s3://weights-bucket/models/DeepSeek-V4-Pro"
    spec = make_spec(
        plan,
        model_path=staging.model_path("/models", s3, "s3"),
        marker_path=staging.marker_path("/models", s3, "s3"),
    )
    rc = raycluster.raycluster(spec)
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    argv = served(head["containers"][0])
    assert argv[2] == staging.model_path("/models", s3, "s3") and argv[4] == plan["model"]["checkpoint"]
    assert staging.marker_path("/models", s3, "s3") in head["initContainers"][-1]["args"]
    assert argv[5:] == plan["vllm_args"] + API_GUARD  # the plan's arguments, then the API key guard


def test_internal_load_balancer_carries_the_stack_tags():
    # Kubernetes, not Pulumi, creates the NLB: the sweeper only recognises it by these tags.
    from infra.config import load_stack_file
    from infra.planning import make_plan
    from infra.k8s.exposure import service
    from infra.aws.tags import default_tags

    cfg = load_stack_file("test")
    tags = default_tags(project="gpu-serving", stack="eph-1", owner="ci", production=False, expires_at="2026-12-31T23:00:00Z")
    spec = ServingSpec(
        deployment=make_plan(cfg.plan_request()).deployment(), namespace="gpu-serving", image="img:1", ray_version="2.60.0",
        pvc_name="model-weights", service_type="internal-lb", load_balancer_tags=tags, vpc_cidr=cfg.network.vpc_cidr,
        api_clients=Clients(cidrs=("10.8.0.0/16",)),
        ttft_p99_ms=cfg.serving.sla.ttft_p99_ms, tpot_p99_ms=cfg.serving.sla.tpot_p99_ms,
        nccl_busbw_floor_gbps=cfg.checks.nccl_bus_bandwidth_floor_gbps, vllm_version=cfg.serving.vllm_version,
        production=cfg.lifecycle.production,
    )  # fmt: skip
    annotation = service(spec)["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags"]
    assert dict(pair.split("=", 1) for pair in annotation.split(",")) == tags


def test_the_internal_load_balancers_service_is_a_valid_v1_service():
    import kubernetes_validate

    version = load_stack_file("prod").kubernetes_version(dt.date(2026, 12, 3)) + ".0"
    svc = exposure.service(make_spec(stack_plan("prod"), service_type="internal-lb", api_clients=Clients(cidrs=("10.8.0.0/16",))))
    kubernetes_validate.validate(svc, version, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({**svc, "spec": {**svc["spec"], "loadBalancerSourceRanges": "10.8.0.0/16"}}, version, strict=True)
