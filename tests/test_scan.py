"""`python -m infra scan`: the conversions of the synthesis, checkov run offline, the accepted risks.

- The Terraform-plan conversion is checked against the real names: pulumi_aws's own
  Python SDK (the bridge's argument names in snake_case, which types are lists, maps
  and nested blocks, which resources have `tags_all`), over every aws:* resource the
  prod and test stacks declare, and an FSx / admin-access variant for the types only
  options switch on.
- The real checkov (pinned, `venv-scan/`, which bin/test sets up from
  requirements-scan.txt) runs over hand-made insecure and secure resources, over the
  prod synthesis, and under a guard that records any network call it tries. The scans
  of the prod synthesis are run once and shared by the tests that read them
  (tests/checkov_runs.py).
- The CLI's exit codes run the real command with a stand-in checkov that prints a
  canned report in checkov's JSON format.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import runpy
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pulumi_aws
import pytest
import yaml

from infra.config import engine_config
from infra.errors import UserError
from infra.preview import scan
from infra.preview.convert import kubernetes as k8s
from infra.preview.convert import terraform as tf
from infra.preview.recording import record
from infra.preview.synth import document, synthesize
from tests import checkov_runs, cli_in_process
from tests import requirement_files as rf
from tests.synthesized import repo_stack

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}


@functools.lru_cache(maxsize=None)
def synth(stack: str) -> dict:
    return repo_stack(stack)


@functools.lru_cache(maxsize=None)
def variant() -> dict:
    """prod with FSx for Lustre and an admin access entry: the aws types only options declare."""
    config = dict(engine_config("prod", REPO_ROOT))
    for area, changes in (("storage", {"type": "fsx"}),
                          ("cluster", {"fsxCsi": True, "adminPrincipalArns": ["arn:aws:iam::123456789012:role/platform-admin"]})):  # fmt: skip
        value = json.loads(config.get(f"gpu-serving:{area}", "{}"))
        value.update(changes)
        config[f"gpu-serving:{area}"] = json.dumps(value)
    rec = record(lambda: runpy.run_path(str(REPO_ROOT), run_name="__main__"), stack="prod", config=config)
    return document(rec, "gpu-serving", "prod")


def docs() -> list[dict]:
    return [synth("prod"), synth("test"), variant()]


def aws_resources(doc: dict) -> list[dict]:
    return [r for r in doc["resources"] if r["type"].startswith("aws:") and r["custom"]]


# --------------------------------------------------------------------------- pulumi_aws as the reference


def sdk_class(token: str) -> type:
    """The pulumi_aws resource class of a type token (`aws:ec2/vpc:Vpc` -> pulumi_aws.ec2.Vpc)."""
    module = token.split(":")[1].split("/")[0]
    return getattr(getattr(pulumi_aws, module), token.rsplit(":", 1)[1])


def sdk_args(token: str) -> type:
    cls = sdk_class(token)
    return getattr(sys.modules[cls.__module__], f"{cls.__name__}Args")


def parameters(args_class: type) -> dict[str, str]:
    """Argument name -> its annotation as text, of a pulumi_aws `...Args` class."""
    sig = inspect.signature(args_class.__init__)
    return {n: repr(p.annotation) for n, p in list(sig.parameters.items())[1:]}


def nested_class(module: str, annotation: str) -> type | None:
    found = re.search(r"ForwardRef\('(\w+Args)'\)", annotation)
    return getattr(sys.modules[module], found.group(1)) if found else None


def singular(name: str) -> str:
    """How the bridge pluralised a Terraform list block's name, undone (`lifecycle_policies` -> `lifecycle_policy`)."""
    return name[:-3] + "y" if name.endswith("ies") else name[:-1] if name.endswith("s") else name


def expected_names(token: str, args_class: type, inputs: dict, path: str, spec: tf.TerraformType, problems: list[str]) -> dict:
    """The Terraform attribute names of `inputs` from pulumi_aws's arguments; nested blocks recursively."""
    params = parameters(args_class)
    out = {}
    for key, value in inputs.items():
        p = f"{path}.{key}" if path else key
        py = tf.snake(key)
        if py not in params:
            problems.append(f"{token} {p}: snake_case {py!r} is not an argument of pulumi_aws {args_class.__name__} ({sorted(params)})")
            continue
        annotation = params[py]
        is_map = annotation.startswith("typing.Union[typing.Mapping") or "Mapping[str" in annotation.split("ForwardRef")[0]
        treated_as_map = key in ("tags", "tagsAll") or p in spec.maps
        if is_map != treated_as_map:
            problems.append(f"{token} {p}: pulumi_aws says {'a map' if is_map else 'not a map'}, the conversion {'does' if treated_as_map else 'does not'} keep its keys")
        name = spec.renames.get(p, py)
        if p in spec.renames:
            if "Sequence[" not in annotation:
                problems.append(f"{token} {p}: renamed to {name!r} as a pluralised list, but pulumi_aws's {py} is no list")
            if name != singular(py):
                problems.append(f"{token} {p}: renamed to {name!r}, not the singular of {py!r}")
        nested = nested_class(args_class.__module__, annotation)
        has_blocks = isinstance(value, dict) or (isinstance(value, list) and any(isinstance(i, dict) for i in value))
        if nested is not None and not treated_as_map and has_blocks:
            items = value if isinstance(value, list) else [value]
            sub = {}
            for item in items:
                if isinstance(item, dict):
                    sub.update(expected_names(token, nested, item, p, spec, problems))
            out[name] = sub
        else:
            out[name] = None
    return out


def converted_names(values: dict, expressions: dict) -> dict:
    out = {}
    for key in set(values) | set(expressions):
        v, e = values.get(key), expressions.get(key)
        blocks = [b for b in (v if isinstance(v, list) else []) if isinstance(b, dict)]
        eblocks = [b for b in (e if isinstance(e, list) else []) if isinstance(b, dict)]
        if blocks or eblocks:
            sub: dict = {}
            for i in range(max(len(blocks), len(eblocks))):
                sub.update(converted_names(blocks[i] if i < len(blocks) else {}, eblocks[i] if i < len(eblocks) else {}))
            out[key] = sub
        else:
            out[key] = None
    return out


def _drop_empty(names: dict) -> dict:
    return {k: (_drop_empty(v) if isinstance(v, dict) else None) for k, v in names.items()}


def _declared_tokens() -> set[str]:
    """The token of every pulumi_aws resource class the components and infra/aws instantiate."""
    tokens = set()
    for path in [*(REPO_ROOT / "components").glob("*.py"), *(REPO_ROOT / "infra" / "aws").glob("*.py")]:
        for module, name in re.findall(r"\baws\.([a-z0-9]+)\.([A-Z]\w*)\(", path.read_text()):
            cls = getattr(getattr(pulumi_aws, module), name)
            if name.endswith("Args") or not isinstance(cls, type) or name == "Provider":
                continue
            found = re.findall(r"""['"](aws:[\w/]+:\w+)['"]""", inspect.getsource(cls))
            if found:
                tokens.add(found[0])
    return tokens


def test_every_aws_type_of_the_stack_has_a_terraform_type():
    used = {r["type"] for d in docs() for r in aws_resources(d)}
    declared = _declared_tokens()
    assert {"aws:fsx/lustreFileSystem:LustreFileSystem", "aws:eks/accessEntry:AccessEntry"} <= used
    assert used <= declared, f"synthesised but not found in the source: {sorted(used - declared)}"
    missing = sorted(declared - set(tf.TYPES))
    assert not missing, f"no Terraform type for {missing}: add them to infra/preview/convert/terraform.py TYPES"
    for d in docs():
        assert not [g for g in tf.plan(d).gaps if g.blocking]


@pytest.mark.parametrize("token", sorted(tf.TYPES))
def test_terraform_type_follows_the_bridge_and_tags_as_pulumi_aws_says(token):
    spec = tf.TYPES[token]
    cls = sdk_class(token)
    module, name = token.split(":")[1].split("/")[0], tf.snake(token.rsplit(":", 1)[1])
    module = {"amp": "prometheus"}.get(module, module)  # the Terraform provider's AMP resources are aws_prometheus_*
    assert spec.name in {f"aws_{module}_{name}", f"aws_{name}"}, spec.name
    assert spec.taggable == hasattr(cls, "tags_all"), f"{token}: pulumi_aws {'has' if hasattr(cls, 'tags_all') else 'has no'} tags_all"


@pytest.mark.parametrize("stack", ["prod", "test", "variant"])
def test_attribute_names_are_pulumi_aws_arguments_in_terraform_form(stack):
    doc = variant() if stack == "variant" else synth(stack)
    plan = tf.plan(doc)
    by_address = {r["address"]: r for r in plan.resources}
    config = {r["address"]: r for r in plan.document["configuration"]["root_module"]["resources"]}
    problems: list[str] = []
    for r in aws_resources(doc):
        spec = tf.TYPES[r["type"]]
        address = plan.addresses[r["urn"]]
        expected = _drop_empty(expected_names(r["type"], sdk_args(r["type"]), r["inputs"], "", spec, problems))
        got = converted_names(by_address[address]["values"], config[address]["expressions"])
        got.pop("tags_all", None)
        if r["type"] == "aws:ec2/instance:Instance":  # its launch template's effective values (test_scan_aws.py)
            for key in [k for k in tf.TEMPLATE_ATTRIBUTES if k in got and k not in expected]:
                assert key in parameters(sdk_args(r["type"])), f"{key} is not an argument of pulumi_aws Instance"
                got.pop(key)
        if spec.taggable:
            expected.setdefault("tags", None)
        # Keys whose whole value is unknown (<computed>, a secret) are left out of the plan.
        for key in [k for k in expected if k not in got]:
            assert r["inputs"].get(next((c for c in r["inputs"] if spec.renames.get(c, tf.snake(c)) == key), key)) in (tf.COMPUTED, None) \
                or isinstance(r["inputs"].get(key), dict), f"{r['type']} {r['name']}: {key} missing from the plan"
            expected.pop(key)
        if got != expected:
            problems.append(f"{r['type']} {r['name']}: converted {got}, expected {expected}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- the Terraform-plan conversion


def res(typ: str, name: str, inputs: dict, provider: str = "aws", custom: bool = True) -> dict:
    return {"type": typ, "name": name, "urn": f"urn:pulumi:s::p::{typ}::{name}", "parent": "", "custom": custom,
            "inputs": inputs, "options": {"provider": provider}}  # fmt: skip


PROVIDER = res("pulumi:providers:aws", "aws", {"region": "us-east-1", "defaultTags": json.dumps({"tags": {"project": "p", "owner": "o"}})}, provider="")


def planned(doc: dict) -> tuple[dict, dict]:
    p = tf.plan(doc)
    values = {r["address"]: r["values"] for r in p.resources}
    exprs = {r["address"]: r["expressions"] for r in p.document["configuration"]["root_module"]["resources"]}
    return values, exprs


def test_plan_document_is_a_terraform_plan_checkov_reads():
    p = tf.plan({"resources": [PROVIDER, res("aws:ec2/vpc:Vpc", "net", {"cidrBlock": "10.0.0.0/16"})]})
    d = p.document
    assert d["format_version"] and d["terraform_version"] and d["planned_values"]["root_module"]["resources"]
    (r,) = d["planned_values"]["root_module"]["resources"]
    assert r == {"address": "aws_vpc.net", "mode": "managed", "type": "aws_vpc", "name": "net", "provider_name": tf.PROVIDER,
                 "schema_version": 0, "values": {"cidr_block": "10.0.0.0/16", "tags": {}, "tags_all": {"project": "p", "owner": "o"}},
                 "sensitive_values": {}}  # fmt: skip
    assert d["configuration"]["provider_config"]["aws"]["expressions"] == {
        "region": {"constant_value": "us-east-1"}, "default_tags": [{"tags": {"constant_value": {"project": "p", "owner": "o"}}}]}


def test_placeholders_become_references_and_unknowns_are_left_out():
    doc = {"resources": [
        PROVIDER,
        res("aws:ec2/vpc:Vpc", "net", {"cidrBlock": "10.0.0.0/16", "tags": {"Name": "net", "owner": "me"}}),
        res("aws:eks/cluster:Cluster", "eks", {"name": "c", "roleArn": "<arn:role>", "vpcConfig": {"subnetIds": ["<id:a>", "<id:b>"], "endpointPublicAccess": False}}),
        res("aws:iam/role:Role", "role", {"assumeRolePolicy": "{}"}),
        res("aws:ec2/subnet:Subnet", "a", {"vpcId": "<id:net>", "tags": {"kubernetes.io/role/elb": "1"}, "availabilityZone": "<computed>"}),
        res("aws:ec2/subnet:Subnet", "b", {"vpcId": "<id:net>", "cidrBlock": {"<secret>": True}}),
        res("aws:ec2/launchTemplate:LaunchTemplate", "lt", {"networkInterfaces": [{"securityGroups": ["<id:sg>", "<cluster-sg:eks>"]}, {"securityGroups": ["sg-literal", "<id:sg>"]}]}),
        res("aws:ec2/securityGroup:SecurityGroup", "sg", {"vpcId": "<id:nowhere>"}),
    ]}  # fmt: skip
    values, exprs = planned(doc)
    assert values["aws_vpc.net"]["tags_all"] == {"project": "p", "owner": "me", "Name": "net"}  # resource tags over default tags
    assert "vpc_id" not in values["aws_subnet.a"] and "availability_zone" not in values["aws_subnet.a"]
    assert exprs["aws_subnet.a"]["vpc_id"] == {"references": ["aws_vpc.net.id", "aws_vpc.net"]}
    assert values["aws_subnet.a"]["tags"] == {"kubernetes.io/role/elb": "1"}  # map keys are data
    assert "cidr_block" not in values["aws_subnet.b"] and "cidr_block" not in exprs["aws_subnet.b"]
    eks_values, eks_exprs = values["aws_eks_cluster.eks"], exprs["aws_eks_cluster.eks"]
    assert eks_values["vpc_config"] == [{"endpoint_public_access": False}]  # a flattened block is a list of one
    assert eks_exprs["vpc_config"] == [{"subnet_ids": {"references": ["aws_subnet.a.id", "aws_subnet.a", "aws_subnet.b.id", "aws_subnet.b"]}}]
    assert eks_exprs["role_arn"] == {"references": ["aws_iam_role.role.arn", "aws_iam_role.role"]}
    lt_values, lt_exprs = values["aws_launch_template.lt"], exprs["aws_launch_template.lt"]
    assert lt_values["network_interfaces"] == [{}, {"security_groups": ["sg-literal", None]}]
    assert lt_exprs["network_interfaces"][0]["security_groups"]["references"] == [
        "aws_security_group.sg.id", "aws_security_group.sg",
        "aws_eks_cluster.eks.vpc_config[0].cluster_security_group_id", "aws_eks_cluster.eks"]  # fmt: skip
    (gap,) = tf.plan(doc).gaps
    assert gap.resource == "sg" and "<id:nowhere>" in gap.reason and not gap.blocking
    assert "vpc_id" not in values["aws_security_group.sg"] and "vpc_id" not in exprs["aws_security_group.sg"]


def test_renames_maps_one_item_lists_and_untagged_types():
    doc = {"resources": [
        PROVIDER,
        res("aws:ecr/repository:Repository", "repo", {"encryptionConfigurations": [{"encryptionType": "KMS"}], "imageScanningConfiguration": {"scanOnPush": True}}),
        res("aws:eks/nodeGroup:NodeGroup", "ng", {"labels": {"gpu-serving/role": "system"}, "taints": [{"key": "k", "effect": "NO_SCHEDULE"}]}),
        res("aws:fsx/lustreFileSystem:LustreFileSystem", "fsx", {"subnetIds": "subnet-1"}),
        res("aws:ec2/route:Route", "r", {"destinationCidrBlock": "0.0.0.0/0"}),
    ]}  # fmt: skip
    values, _ = planned(doc)
    assert values["aws_ecr_repository.repo"]["encryption_configuration"] == [{"encryption_type": "KMS"}]
    assert values["aws_ecr_repository.repo"]["image_scanning_configuration"] == [{"scan_on_push": True}]
    assert values["aws_eks_node_group.ng"]["labels"] == {"gpu-serving/role": "system"}
    assert values["aws_eks_node_group.ng"]["taint"] == [{"key": "k", "effect": "NO_SCHEDULE"}]
    assert values["aws_fsx_lustre_file_system.fsx"]["subnet_ids"] == ["subnet-1"]
    assert values["aws_route.r"] == {"destination_cidr_block": "0.0.0.0/0"}  # no tags on a route


def test_unknown_types_components_and_names_terraform_refuses():
    doc = {"resources": [
        PROVIDER,
        res("aws:sqs/queue:Queue", "q", {}),
        res("gpu-serving:network:Network", "net", {}, custom=False),
        res("aws:ec2/vpc:Vpc", "1st vpc/x", {}),
        res("aws:ec2/vpc:Vpc", "1st_vpc_x", {}),
    ]}  # fmt: skip
    p = tf.plan(doc)
    (gap,) = p.gaps
    assert gap.blocking and gap.type == "aws:sqs/queue:Queue"
    assert [r["address"] for r in p.resources] == ["aws_vpc._1st_vpc_x", "aws_vpc._1st_vpc_x_2"]


def test_snake_case():
    assert [tf.snake(n) for n in ("vpcId", "cidrIpv4", "httpPutResponseHopLimit", "enableDnsHostnames", "ipv6CidrBlock", "name")] == [
        "vpc_id", "cidr_ipv4", "http_put_response_hop_limit", "enable_dns_hostnames", "ipv6_cidr_block", "name"]


# --------------------------------------------------------------------------- the Kubernetes conversion


def test_raycluster_pod_templates_become_pods_and_helm_releases_are_gaps():
    doc = synth("prod")
    out = k8s.manifests(doc)
    kinds = [(m.kind, m.namespace, m.name) for m in out.items]
    (rc,) = [m for m in out.items if m.kind == "RayCluster"]
    pods = [m for m in out.items if m.kind == "Pod"]
    assert [(p.namespace, p.name) for p in pods] == [("gpu-serving", "vllm-head"), ("gpu-serving", "vllm-gpu-worker")]
    spec = rc.manifest["spec"]
    assert pods[0].manifest["spec"] == spec["headGroupSpec"]["template"]["spec"]
    assert pods[1].manifest["spec"] == spec["workerGroupSpecs"][0]["template"]["spec"]
    assert pods[0].manifest["metadata"]["labels"] == spec["headGroupSpec"]["template"]["metadata"]["labels"]
    assert pods[0].derived == "RayCluster vllm: spec.headGroupSpec.template" and pods[0].source == rc.source
    assert ("Job", "gpu-serving", next(n for k, _, n in kinds if k == "Job")) in kinds  # the Job as a Job, not a Pod
    assert sum(1 for k, _, _ in kinds if k == "Pod") == 2
    helm = sorted(g.resource for g in out.gaps)
    assert helm == sorted(r["name"] for r in doc["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release") and len(helm) == 4  # the operators three and kube-prometheus-stack
    assert all("Helm release" in g.reason and not g.blocking for g in out.gaps)
    k8s_types = {r["type"] for r in doc["resources"] if r["type"].startswith("kubernetes:") and r["type"] != "kubernetes:helm.sh/v3:Release"}
    assert {m.source_type for m in out.items} == k8s_types


def test_manifests_take_kind_and_name_from_the_resource_and_hide_secrets():
    doc = {"resources": [
        res("kubernetes:core/v1:Secret", "token", {"metadata": {"namespace": "ns"}, "stringData": {"token": {"<secret>": True}}}, provider="k8s"),
        res("kubernetes:apps/v1:Deployment", "web", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                                                     "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}, provider="k8s"),
        res("kubernetes:example.com/v1alpha1:Trainer", "train", {"metadata": {"name": "t", "namespace": "ml"},
                                                                 "spec": {"replicas": [{"template": {"metadata": {"labels": {"a": "b"}},
                                                                                                     "spec": {"containers": [{"name": "c", "image": "i"}]}}}]}}, provider="k8s"),
        res("kubernetes:helm.sh/v4:Chart", "chart", {}, provider="k8s"),
    ]}  # fmt: skip
    out = k8s.manifests(doc)
    secret, deployment, trainer, pod = out.items
    assert (secret.manifest["apiVersion"], secret.kind, secret.name) == ("v1", "Secret", "token")
    assert secret.manifest["stringData"] == {"token": "<secret>"}
    assert deployment.kind == "Deployment"  # a built-in workload gets no extra Pod
    assert trainer.manifest["apiVersion"] == "example.com/v1alpha1"
    assert (pod.kind, pod.namespace, pod.name, pod.manifest["metadata"]["labels"]) == ("Pod", "ml", "t-replicas-0", {"a": "b"})
    assert pod.derived == "Trainer t: spec.replicas.0.template"
    (gap,) = out.gaps
    assert gap.resource == "chart" and not gap.blocking


# --------------------------------------------------------------------------- accepted risks


def finding(check: str, resource: str, framework: str = "kubernetes") -> scan.Finding:
    return scan.Finding(framework, check, "title", resource, "f.yaml", "src")


def test_accepted_risks_match_by_check_and_glob_and_stale_ones_are_reported():
    risks = scan.parse_accepted([
        {"check": "CKV_K8S_23", "resource": "Pod.gpu-serving.vllm-*", "reason": "root for EFA"},
        {"check": "CKV_K8S_8", "resource": "Pod.*-worker", "reason": "KubeRay injects it"},
        {"check": "CKV_AWS_1", "resource": "*", "reason": "gone"},
    ])  # fmt: skip
    findings = [finding("CKV_K8S_23", "Pod.gpu-serving.vllm-head"), finding("CKV_K8S_23", "Job.gpu-serving.stage"),
                finding("CKV_K8S_8", "Pod.gpu-serving.vllm-gpu-worker"), finding("CKV_K8S_8", "Pod.gpu-serving.vllm-head")]  # fmt: skip
    accepted, not_accepted, stale = scan.match(findings, risks)
    assert [(f.resource, r.reason) for f, r in accepted] == [("Pod.gpu-serving.vllm-head", "root for EFA"), ("Pod.gpu-serving.vllm-gpu-worker", "KubeRay injects it")]
    assert [(f.check, f.resource) for f in not_accepted] == [("CKV_K8S_23", "Job.gpu-serving.stage"), ("CKV_K8S_8", "Pod.gpu-serving.vllm-head")]
    assert [r.check for r in stale] == ["CKV_AWS_1"]
    assert not scan.AcceptedRisk("CKV_K8S_23", "pod.*", "r").matches(findings[0])  # case-sensitive


def test_an_accepted_risk_may_name_several_globs_and_is_stale_only_when_none_matches():
    (risk,) = scan.parse_accepted([{"check": "CKV_K8S_23", "resource": ["Pod.ns.vllm-*", "Job.ns.vllm-efa-check"], "reason": "root"}])
    assert risk.matches(finding("CKV_K8S_23", "Job.ns.vllm-efa-check")) and risk.matches(finding("CKV_K8S_23", "Pod.ns.vllm-head"))
    assert not risk.matches(finding("CKV_K8S_23", "Job.ns.vllm-benchmark"))
    _, _, stale = scan.match([finding("CKV_K8S_23", "Pod.ns.vllm-head")], [risk])
    assert stale == []
    _, _, stale = scan.match([finding("CKV_K8S_23", "Job.ns.other")], [risk])
    assert stale == [risk] and risk.resource == "Pod.ns.vllm-*, Job.ns.vllm-efa-check"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([{"check": "CKV_K8S_23", "resource": "Pod.*"}], "no reason"),
        ([{"check": "CKV_K8S_23", "resource": "Pod.*", "reason": "  "}], "no reason"),
        ([{"check": "CKV_K8S_23", "reason": "r"}], "no resource"),
        ([{"resource": "Pod.*", "reason": "r"}], "no check"),
        ([{"check": "CKV_K8S_23", "resource": "Pod.*", "reason": "r", "until": "2027"}], "unknown key(s) until"),
        ({"check": "CKV_K8S_23"}, "expected a list"),
        (["CKV_K8S_23"], "expected a mapping"),
        ([{"check": "C", "resource": "R", "reason": "a"}, {"check": "C", "resource": "R", "reason": "b"}], "accepted twice"),
        ([{"check": "C", "resource": [], "reason": "a"}], "no resource"),
        ([{"check": "C", "resource": ["Pod.*", 3], "reason": "a"}], "no resource"),
        ([{"check": "C", "resource": "R", "reason": "a"}, {"check": "C", "resource": ["S", "R"], "reason": "b"}], "accepted twice"),
    ],
)
def test_an_accepted_risk_needs_a_check_a_resource_and_a_reason(data, message):
    with pytest.raises(UserError, match=re.escape(message)):
        scan.parse_accepted(data, "risks.yaml")


# What the issue says is to be fixed, never accepted: network policies, pod security (but root in
# the vLLM image), control-plane logs, log group KMS, flow logs, the default security group, KMS key
# policies, and the staging Job's image pinning.
TO_FIX = {"CKV2_K8S_6", "CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_29", "CKV_K8S_30", "CKV_K8S_31",
          "CKV_K8S_37", "CKV_K8S_38", "CKV_AWS_37", "CKV_AWS_158", "CKV2_AWS_11", "CKV2_AWS_12", "CKV2_AWS_64"}  # fmt: skip
# The staging Job's image is pinned by being built into the stack's ECR repository, whose tags are
# immutable (the other way to pin it, images/staging/); what checkov still reports of that
# choice may be accepted (the tag instead of a digest, IfNotPresent), and so may the one capability its
# init container adds back (CHOWN, to hand the volume's directory to the non-root program). Nothing
# else of the staging Job: root, high UID, the token, CPU limits, the network policy are fixed.
STAGING_ACCEPTABLE = {"CKV_K8S_15", "CKV_K8S_43"}  # CKV_K8S_25 passes: no capability on EFS (no root init container)


def test_the_checked_in_accepted_risks():
    risks = scan.load_accepted(REPO_ROOT / scan.ACCEPTED_RISKS)
    assert risks
    for r in risks:
        assert r.check not in TO_FIX, f"{r.check} on {r.resource} is to be fixed, not accepted"
        assert len(r.reason) >= 40, f"{r.check} on {r.resource}: say why it is accepted"
        if fnmatch_any(r.resource, ["Job.gpu-serving.model-weights-stage-0", "Pod.gpu-serving.model-weights-stage-0"]):
            assert r.check in STAGING_ACCEPTABLE, f"{r.check} on {r.resource} accepts the staging Job"
            assert r.resource.startswith("Job."), "only the Job's own findings, not its pod's"
    staging = {r.check for r in risks if r.resource.startswith("Job.gpu-serving.model-weights-stage-")}
    assert staging == STAGING_ACCEPTABLE, staging


def fnmatch_any(pattern: str, names: list[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def test_load_accepted_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="no accepted-risks file"):
        scan.load_accepted(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- check: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        scan.load_accepted(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing accepted\n[]\n")
    assert scan.load_accepted(empty) == []


# --------------------------------------------------------------------------- the scanner's requirements


def test_the_scanner_requirements_pin_checkov_and_everything_it_brings():
    req = rf.read(scan.REQUIREMENTS)
    assert not req.problems, req.problems
    assert not req.includes, f"{scan.REQUIREMENTS} stands alone (its pins conflict with requirements.txt's)"
    pins = {rf.canonical(r.name): next(iter(r.specifier)).version for r in req.requirements}
    assert pins["checkov"] == scan.CHECKOV_VERSION
    # Why it is a file of its own: checkov's pins and the program's cannot share one environment.
    program = rf.pins(rf.TOOLS)
    assert pins["boto3"] != program["boto3"][0]
    assert int(pins["packaging"].split(".")[0]) < 24


# --------------------------------------------------------------------------- the real checkov, offline


def test_the_scanner_venv_holds_exactly_the_pinned_requirements(checkov):
    proc = subprocess.run([str(checkov.parent / "python"), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    frozen = {rf.canonical(n): v for n, v in (line.split("==", 1) for line in proc.stdout.split() if "==" in line)}
    pinned = {rf.canonical(r.name): next(iter(r.specifier)).version for r in rf.read(scan.REQUIREMENTS).requirements}
    frozen = {k: v for k, v in frozen.items() if k not in ("pip", "setuptools", "wheel")}
    assert frozen == pinned, {k: (frozen.get(k), pinned.get(k)) for k in set(frozen) | set(pinned) if frozen.get(k) != pinned.get(k)}


def checks(result: scan.ScanResult) -> set[tuple[str, str]]:
    return {(f.check, f.resource) for f in result.not_accepted}


LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


# The hand-made documents of the next three tests are scanned together: one checkov run per framework
# (tests/checkov_runs.py scan_together), each document's results its own, as a run of its own gives them.
SG = res("aws:ec2/securityGroup:SecurityGroup", "sg", {"description": "d"})
MOUNT = res("aws:efs/mountTarget:MountTarget", "mt", {"fileSystemId": "fs-1", "subnetId": "subnet-1", "securityGroups": ["<id:sg>"]})


def _pod_cluster(escalation: bool) -> dict:
    container = {"name": "ray-head", "image": "repo/vllm@sha256:" + "0" * 64, "securityContext": {"allowPrivilegeEscalation": escalation}}
    rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "vllm", "namespace": "serving"},
          "spec": {"headGroupSpec": {"template": {"spec": {"containers": [container]}}}}}  # fmt: skip
    return {"stack": "t", "resources": [res("kubernetes:ray.io/v1:RayCluster", "rc", rc, provider="k8s")]}


SMALL_DOCUMENTS = {
    "log-group-insecure": {"stack": "t", "resources": [PROVIDER, res(LOG_GROUP, "logs", {"name": "/x", "retentionInDays": 400})]},
    # The key is a placeholder (only the cloud knows its ARN): the plan must carry it as a reference.
    "log-group-secure": {"stack": "t", "resources": [PROVIDER, res("aws:kms/key:Key", "key", {"enableKeyRotation": True}),
                                                     res(LOG_GROUP, "logs", {"name": "/x", "retentionInDays": 400, "kmsKeyId": "<arn:key>"})]},  # fmt: skip
    "sg-alone": {"stack": "t", "resources": [PROVIDER, SG]},
    "sg-attached": {"stack": "t", "resources": [PROVIDER, SG, MOUNT]},
    "pod-escalation": _pod_cluster(True),
    "pod-no-escalation": _pod_cluster(False),
}


@functools.lru_cache(maxsize=None)
def _small_scans(checkov: Path) -> dict[str, scan.ScanResult]:
    return checkov_runs.scan_together(checkov, SMALL_DOCUMENTS)


def small_scan(checkov: Path, key: str) -> scan.ScanResult:
    """`scan.scan_document(SMALL_DOCUMENTS[key], [], checkov)`, from the shared run."""
    return _small_scans(checkov)[key]


def test_a_log_group_without_a_kms_key_fails_ckv_aws_158_and_one_with_a_key_passes(checkov):
    result = small_scan(checkov, "log-group-insecure")
    assert ("CKV_AWS_158", "aws_cloudwatch_log_group.logs") in checks(result)
    assert result.counts["terraform_plan"].resources == 1 and result.counts["kubernetes"].resources == 0
    result = small_scan(checkov, "log-group-secure")
    assert not {c for c in checks(result) if c[1] == "aws_cloudwatch_log_group.logs"}, checks(result)
    assert result.counts["terraform_plan"].passed > 0


def test_a_graph_check_follows_a_placeholder_reference(checkov):
    """CKV2_AWS_5 (a security group is attached to something) passes only through the reference."""
    alone = small_scan(checkov, "sg-alone")
    assert ("CKV2_AWS_5", "aws_security_group.sg") in checks(alone)
    attached = small_scan(checkov, "sg-attached")
    assert ("CKV2_AWS_5", "aws_security_group.sg") not in checks(attached)


def test_a_pod_template_allowing_privilege_escalation_fails_ckv_k8s_20(checkov):
    insecure = small_scan(checkov, "pod-escalation")
    assert ("CKV_K8S_20", "Pod.serving.vllm-head") in checks(insecure)
    assert next(f for f in insecure.not_accepted if f.resource == "Pod.serving.vllm-head").source == "rc"
    secure = small_scan(checkov, "pod-no-escalation")
    assert ("CKV_K8S_20", "Pod.serving.vllm-head") not in checks(secure)
    assert secure.counts["terraform_plan"].resources == 0


def test_prod_passes_the_checks_that_read_the_converted_names(checkov):
    """Checks that pass only when the conversion names the attributes as Terraform does."""
    passed = {(c["check_id"], c["resource"].split(".")[0]) for fw, reports in checkov_runs.stack_reports(checkov, synth("prod")).items()
              for rep in reports for c in rep["results"]["passed_checks"]}  # fmt: skip
    expected = {
        ("CKV_AWS_136", "aws_ecr_repository"),  # encryption_configuration (renamed from encryptionConfigurations)
        ("CKV_AWS_163", "aws_ecr_repository"),  # image_scanning_configuration[0].scan_on_push (a block of one)
        ("CKV_AWS_51", "aws_ecr_repository"),  # image_tag_mutability
        ("CKV_AWS_58", "aws_eks_cluster"),  # encryption_config[0].resources
        ("CKV_AWS_39", "aws_eks_cluster"),  # vpc_config[0].endpoint_public_access
        ("CKV_AWS_79", "aws_launch_template"),  # metadata_options[0].http_tokens
        ("CKV_AWS_341", "aws_launch_template"),  # metadata_options[0].http_put_response_hop_limit
        ("CKV_AWS_42", "aws_efs_file_system"),  # encrypted
        ("CKV_AWS_7", "aws_kms_key"),  # enable_key_rotation
        ("CKV2_AWS_5", "aws_security_group"),  # referenced through placeholders
        ("CKV_K8S_9", "Pod"),  # the head Pod's readiness probe, from the RayCluster's template
        ("CKV2_K8S_6", "Pod"),  # a NetworkPolicy selects the pods (the namespace's default deny); and the pod security ones:
        ("CKV_K8S_20", "Pod"),
        ("CKV_K8S_22", "Pod"),
        ("CKV_K8S_31", "Pod"),
        ("CKV_K8S_37", "Pod"),
        ("CKV_K8S_38", "Pod"),
        # The serving pods run as a non-root, high UID and add no capability (the nodes raise EFA's
        # locked-memory limit, infra/aws/gpu_nodes.py): checkov's root and capability checks pass.
        ("CKV_K8S_23", "Pod"),
        ("CKV_K8S_40", "Pod"),
        ("CKV_K8S_25", "Pod"),
        ("CKV_K8S_23", "Job"),  # the staging program runs as a non-root user
        ("CKV_K8S_11", "Job"),
    }
    assert expected <= passed, sorted(expected - passed)


def test_prod_scan_counts_findings_and_no_accepted_risk_is_stale(checkov):
    result = scan.scan_document(synth("prod"), scan.load_accepted(REPO_ROOT / scan.ACCEPTED_RISKS), checkov, runner=checkov_runs.runner)
    assert not result.errors and not [g for g in result.gaps if g.blocking]
    assert not result.stale, f"accepted risks matching no finding of prod, remove them: {result.stale}"
    for fw in scan.FRAMEWORKS:
        c = result.counts[fw]
        assert c.resources > 10 and c.passed > 50 and c.parsing_errors == 0
        assert c.failed == sum(1 for f, _ in result.accepted if f.framework == fw) + sum(1 for f in result.not_accepted if f.framework == fw)
    assert {g.type for g in result.gaps} == {"kubernetes:helm.sh/v3:Release"}
    for f, _ in result.accepted:
        assert f.source, f
    markdown = scan.render_markdown(result)
    assert "| AWS (Terraform plan) |" in markdown and "Helm release" in markdown
    # Kubernetes: every finding is fixed or accepted with its reason; the are fixed.
    assert [(f.check, f.resource) for f in result.not_accepted if f.framework == "kubernetes"] == []
    assert not {f.check for f, _ in result.accepted} & TO_FIX



def test_the_optional_checks_leave_no_finding_unaccepted(checkov, tmp_path):
    """gpu-serving:checks turns on the EFA check and the benchmark Jobs: a stack that does must still scan clean."""
    for f in REPO_ROOT.iterdir():
        if f.name not in ("venv", "venv-scan", ".git") and not f.name.startswith("Pulumi.prod"):
            (tmp_path / f.name).symlink_to(f)
    (tmp_path / "Pulumi.prod.yaml").write_text((REPO_ROOT / "Pulumi.prod.yaml").read_text() + "  gpu-serving:checks:\n    efa: true\n    benchmark: true\n")
    doc = synthesize("prod", tmp_path)
    jobs = {r["name"] for r in doc["resources"] if r["type"] == "kubernetes:batch/v1:Job"}
    assert {"gpu-serving-prod-serving-efa-check", "gpu-serving-prod-serving-benchmark"} <= jobs, jobs
    result = scan.scan_document(doc, scan.load_accepted(REPO_ROOT / scan.ACCEPTED_RISKS), checkov)
    assert not result.errors
    assert [(f.check, f.resource) for f in result.not_accepted] == []
    accepted = {(f.check, f.resource) for f, _ in result.accepted}
    # The EFA check and the benchmark, like the serving pods, run the serving image by digest (so
    # IfNotPresent is right), as a non-root high UID with no capability: nothing there to accept.
    found = accepted | {(f.check, f.resource) for f in result.not_accepted}
    assert not [(c, r) for c, r in found if r in ("Job.gpu-serving.vllm-efa-check", "Job.gpu-serving.vllm-benchmark")
                and c in ("CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_25", "CKV_K8S_43", "CKV_K8S_15")]  # fmt: skip
    assert not [r for r in result.stale if "efa-check" in r.resource or "benchmark" in r.resource]

def test_checkov_runs_without_a_network_call(checkov, tmp_path):
    """The guard (tests/checkov_runs.py) sees checkov's calls; the scans of prod under it make none."""
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(checkov_runs.GUARD)
    log = tmp_path / "net.log"
    log.write_text("")

    # Without the offline environment checkov checks PyPI for a newer version: the guard records that.
    probe = subprocess.run([str(checkov), "--version"], env={**scan.checkov_env(tmp_path), "CKV_SKIP_PACKAGE_UPDATE_CHECK": "false",
                                                            **checkov_runs.guard_env(guard, log)},
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert "pypi.org" in log.read_text(), "the guard did not see checkov's update check"

    # scan.checkov_env's environment with the same guard, over prod (the runs the other prod tests share).
    doc = synth("prod")
    result = scan.scan_document(doc, [], checkov, runner=checkov_runs.runner)
    assert result.counts["terraform_plan"].passed and result.counts["kubernetes"].passed
    assert checkov_runs.guard_logs(checkov, doc) == {fw: "" for fw in scan.FRAMEWORKS}, "checkov tried the network"


def test_checkov_gets_no_inherited_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("BC_API_KEY", "secret")
    monkeypatch.setenv("PRISMA_API_URL", "https://example.invalid")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    env = scan.checkov_env(tmp_path)
    assert not {"BC_API_KEY", "PRISMA_API_URL", "AWS_SECRET_ACCESS_KEY"} & set(env)
    assert env["CKV_SKIP_PACKAGE_UPDATE_CHECK"] == "true" and env["BC_SKIP_MAPPING"] == "TRUE" and env["HOME"] == str(tmp_path)
    cmd = scan.checkov_command(Path("checkov"), "kubernetes", tmp_path)
    assert {"--skip-download", "--skip-results-upload", "--soft-fail"} <= set(cmd) and "--bc-api-key" not in cmd


def test_ensure_checkov_without_install_names_the_fix(tmp_path):
    (tmp_path / scan.REQUIREMENTS).write_text("checkov==3.3.30\n")
    with pytest.raises(UserError, match=r"checkov is not installed in venv-scan/ .*--checkov PATH"):
        scan.ensure_checkov(tmp_path, install=False)
    with pytest.raises(UserError, match="no requirements-scan.txt"):
        scan.ensure_checkov(tmp_path / "nowhere", install=False)


# --------------------------------------------------------------------------- the CLI


def fake_checkov(tmp_path: Path, failed: list[tuple[str, str, str]], exit_code: int = 0) -> Path:
    """A stand-in checkov printing a report in checkov's JSON format: (framework, check, resource) failed."""
    reports = {}
    for fw in scan.FRAMEWORKS:
        fails = [{"check_id": c, "check_name": f"title of {c}", "resource": r, "file_path": "/plan.json"} for f, c, r in failed if f == fw]
        reports[fw] = {"check_type": fw, "results": {"passed_checks": [], "failed_checks": fails},
                       "summary": {"passed": 5, "failed": len(fails), "skipped": 0, "parsing_errors": 0, "resource_count": 3}}  # fmt: skip
        (tmp_path / f"{fw}.json").write_text(json.dumps(reports[fw]))
    script = tmp_path / "checkov"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
          *terraform_plan*) cat "{tmp_path}/terraform_plan.json" ;;
          *) cat "{tmp_path}/kubernetes.json" ;;
        esac
        [ {exit_code} -eq 0 ] || echo "checkov broke" >&2
        exit {exit_code}
        """))
    script.chmod(0o755)
    return script


def run(*args: str, expect: int) -> subprocess.CompletedProcess:
    """`python -m infra ARGS` in a fresh process: the real entry point (exit status, no traceback)."""
    proc = subprocess.run([sys.executable, "-m", "infra", *args], cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}:\n{output}"
    assert "Traceback" not in output, output
    return proc


@pytest.fixture
def invoke(monkeypatch):
    """The CLI in-process (tests/cli_in_process.py), prod handed the module's cached synthesis; any other
    stack is synthesised for real. Checks the exit status and that no traceback escaped."""
    cli_in_process.serve_synthesis(monkeypatch, {("prod", None): lambda: synth("prod")})
    return lambda *args, expect: cli_in_process.invoke(*args, expect=expect)


def accepted_file(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "accepted.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def test_cli_exits_1_on_a_finding_that_is_not_accepted_and_0_when_it_is(tmp_path, invoke):
    fake = fake_checkov(tmp_path, [("kubernetes", "CKV_K8S_23", "Pod.gpu-serving.vllm-head")])
    none = accepted_file(tmp_path, [])
    proc = invoke("scan", "--stack", "prod", "--checkov", str(fake), "--accepted", str(none), "--json", expect=1)
    result = json.loads(proc.stdout)
    assert result["passed"] is False and result["counts"]["kubernetes"]["failed"] == 1
    assert [(f["check"], f["resource"]) for f in result["not_accepted"]] == [("CKV_K8S_23", "Pod.gpu-serving.vllm-head")]
    assert {g["type"] for g in result["gaps"]} == {"kubernetes:helm.sh/v3:Release"}

    ok = accepted_file(tmp_path, [{"check": "CKV_K8S_23", "resource": "Pod.gpu-serving.vllm-*", "reason": "root for EFA"},
                                  {"check": "CKV_AWS_1", "resource": "*", "reason": "no longer found"}])  # fmt: skip
    md = tmp_path / "scan.md"
    proc = invoke("scan", "--stack", "prod", "--checkov", str(fake), "--accepted", str(ok), "--markdown", str(md), expect=0)
    assert "every finding is accepted" in proc.stdout and "stale" in proc.stdout and "root for EFA" in proc.stdout
    text = md.read_text()
    assert "No finding that is not accepted." in text and "root for EFA" in text and "CKV_AWS_1" in text and "Stale" in text


def test_cli_errors_are_one_line(tmp_path, invoke):
    # The one fresh `python -m infra scan` process: the real entry point's exit status and one-line error.
    proc = run("scan", "--stack", "prod", "--checkov", str(tmp_path / "no-checkov"), expect=2)
    assert "error: no checkov at" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    fake = fake_checkov(tmp_path, [], exit_code=2)
    proc = invoke("scan", "--stack", "prod", "--checkov", str(fake), expect=2)
    assert "checkov (terraform_plan) exited 2: checkov broke" in proc.stderr
    bad = accepted_file(tmp_path, [{"check": "CKV_K8S_23", "resource": "Pod.*"}])
    proc = invoke("scan", "--stack", "prod", "--checkov", str(fake_checkov(tmp_path, [])), "--accepted", str(bad), expect=2)
    assert "no reason" in proc.stderr
    proc = invoke("scan", "--stack", "nope", "--checkov", str(fake_checkov(tmp_path, [])), expect=2)
    assert "Pulumi.nope.yaml" in proc.stderr
