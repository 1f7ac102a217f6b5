"""`gpu-serving:monitoring.mode: amp` (issue 20 item 1): the workspace, remote write, Pod Identity, rules and alerts.

Real data only: the synthesized prod program with amp in its stack file; kube-prometheus-stack 88.5.3's values.yaml
and its grafana subchart's, and its PrometheusAgent CRD (tests/fixtures/upstream/kube-prometheus-stack-88.5.3/);
botocore's `amp` service model (the IAM prefix, the workspace ARN's pattern); promtool (the workspace's rule file);
the policy pack.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import botocore.session
import pytest

from components import monitoring as component
from infra.aws import amp as amp_data
from infra.config import load_stack_file
from infra.k8s import monitoring as mon
from infra.k8s.helm_values import KUBE_PROMETHEUS_STACK
from infra.monitoring.alerts import AlertSpec, prometheus_rule_groups
from infra.planning.plan import make_plan
from infra.preview.convert.terraform import plan as terraform_plan
from infra.preview.policy_check import check_document
from infra.preview.synth import synthesize
from policies import network_policy as NP
from tests.project_copy import edited_project
from tests.test_monitoring import FREE, PROD_SIZING, UPSTREAM, chart_defaults
from tests.test_operators import unknown_paths
from tests.test_rayspec import crd_errors
from tests import yaml_text

RELEASE = "kubernetes:helm.sh/v3:Release"
AMP_SNS = ("  gpu-serving:lifecycle:\n", "  gpu-serving:monitoring: {mode: amp, alerts: {receiver: sns}}\n  gpu-serving:lifecycle:\n")
AMP_NONE = ("  gpu-serving:lifecycle:\n", "  gpu-serving:monitoring: {mode: amp}\n  gpu-serving:lifecycle:\n")
# Our free-form maps in amp mode (data, not chart keys): the remote write entries, Grafana's ini and data sources.
FREE_AMP = FREE | {("prometheus", "prometheusSpec", "remoteWrite"), ("grafana", "grafana.ini"), ("grafana", "additionalDataSources")}
AMP_MODEL = botocore.session.get_session().get_service_model("amp")


@pytest.fixture(scope="module")
def amp(tmp_path_factory) -> dict:
    return synthesize("prod", edited_project(tmp_path_factory.mktemp("amp") / "p", "prod", [AMP_SNS]))


@pytest.fixture(scope="module")
def amp_none(tmp_path_factory) -> dict:
    return synthesize("prod", edited_project(tmp_path_factory.mktemp("ampnone") / "p", "prod", [AMP_NONE]))


def _of(doc: dict, type_: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == type_]


def _release(doc: dict) -> dict:
    (release,) = [r for r in _of(doc, RELEASE) if r["inputs"]["chart"] == KUBE_PROMETHEUS_STACK.chart]
    return release


def _workspace(doc: dict) -> dict:
    (ws,) = _of(doc, "aws:amp/workspace:Workspace")
    return ws


# ---- the workspace and remote write --------------------------------------------------------------------------


def test_amp_holds_a_tagged_logging_workspace_with_the_configs_retention(amp):
    ws = _workspace(amp)
    assert ws["inputs"]["tags"] and ws["inputs"]["alias"]
    (group,) = [g for g in _of(amp, "aws:cloudwatch/logGroup:LogGroup") if g["inputs"]["name"].startswith("/aws/vendedlogs/prometheus/")]
    assert ws["inputs"]["loggingConfiguration"]["logGroupArn"] == f"<arn:{group['name']}>:*"
    (conf,) = _of(amp, "aws:amp/workspaceConfiguration:WorkspaceConfiguration")
    assert conf["inputs"]["workspaceId"] == f"<id:{ws['name']}>" and conf["inputs"]["retentionPeriodInDays"] == 15
    # botocore: retentionPeriodInDays takes at least 1 day, as gpu-serving:monitoring.retentionDays does.
    assert AMP_MODEL.shape_for("UpdateWorkspaceConfigurationRequest").members["retentionPeriodInDays"].metadata["min"] == 1


def test_prometheus_is_an_agent_writing_to_the_workspace_with_no_volume(amp):
    values = _release(amp)["inputs"]["values"]
    prometheus = values["prometheus"]
    assert prometheus["agentMode"] is True
    (rw,) = prometheus["prometheusSpec"]["remoteWrite"]
    assert rw == {"url": f"<prometheusEndpoint:{_workspace(amp)['name']}>/api/v1/remote_write", "sigv4": {"region": "us-east-1"}}
    assert load_stack_file("prod").region == "us-east-1"
    assert "storageSpec" not in prometheus["prometheusSpec"] and "retention" not in prometheus["prometheusSpec"]
    assert not _of(amp, "kubernetes:storage.k8s.io/v1:StorageClass")  # no gp3 class, no claim
    assert values["alertmanager"] == {"enabled": False} and values["defaultRules"] == {"create": False}
    # The chart renders a PrometheusAgent with these: valid against the chart's own CRD.
    agent = {"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "PrometheusAgent", "metadata": {"name": "x"},
             "spec": {**prometheus["prometheusSpec"], "serviceAccountName": prometheus["serviceAccount"]["name"]}}  # fmt: skip
    agent["spec"]["remoteWrite"] = [{**rw, "url": "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/api/v1/remote_write"}]
    (version,) = [v for v in yaml_text.safe_load((UPSTREAM / "crd-prometheusagents.yaml").read_text())["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    assert crd_errors(schema, agent) == []
    assert crd_errors(schema, {**agent, "spec": {**agent["spec"], "remoteWrite": [{"url": "https://x", "sigv4": {"regoin": "x"}}]}})


def test_every_amp_value_is_in_the_charts_defaults(amp):
    values = _release(amp)["inputs"]["values"]
    assert unknown_paths(values, chart_defaults(), FREE_AMP) == []
    pure = mon.kube_prometheus_stack_values(PROD_SIZING, 15, component.GRAFANA_ADMIN_SECRET,
                                            amp=mon.AmpValues("https://w/api/v1/remote_write", "https://w/", "us-east-1"))  # fmt: skip
    assert unknown_paths(pure, chart_defaults(), FREE_AMP) == []
    d = chart_defaults()
    assert d["prometheus"]["agentMode"] is False and d["prometheus"]["prometheusSpec"]["remoteWrite"] == []
    assert d["grafana"]["plugins"] == [] and d["grafana"]["sidecar"]["datasources"]["defaultDatasourceEnabled"] is True


# ---- Pod Identity, scoped to the workspace -------------------------------------------------------------------


def _role_policies(doc: dict) -> dict[str, dict]:
    """service account -> {role, policy (parsed), association} of the monitoring namespace's Pod Identity roles."""
    roles = {r["name"]: r for r in _of(doc, "aws:iam/role:Role")}
    policies = {p["inputs"]["role"]: p for p in _of(doc, "aws:iam/rolePolicy:RolePolicy")}
    out = {}
    for a in _of(doc, "aws:eks/podIdentityAssociation:PodIdentityAssociation"):
        if a["inputs"]["namespace"] != mon.NAMESPACE:
            continue
        role = roles[re.fullmatch(r"<arn:(.+)>", a["inputs"]["roleArn"]).group(1)]
        policy = policies[f"<id:{role['name']}>"]
        out[a["inputs"]["serviceAccount"]] = {"role": role, "policy": json.loads(policy["inputs"]["policy"]), "association": a}
    return out


def test_prometheus_and_grafana_get_pod_identity_roles_scoped_to_the_workspace(amp):
    ws_arn = f"<arn:{_workspace(amp)['name']}>"
    found = _role_policies(amp)
    values = _release(amp)["inputs"]["values"]
    # The service accounts the chart runs them as: named in values, the same names as the chart's defaults.
    assert set(found) == {values["prometheus"]["serviceAccount"]["name"], values["grafana"]["serviceAccount"]["name"]}
    assert set(found) == {f"{mon.RELEASE}-prometheus", f"{mon.RELEASE}-grafana"}
    actions = {}
    for sa, f in found.items():
        trust = json.loads(f["role"]["inputs"]["assumeRolePolicy"])
        assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "pods.eks.amazonaws.com"}]
        (statement,) = f["policy"]["Statement"]
        assert statement["Effect"] == "Allow" and statement["Resource"] == ws_arn  # this workspace, never "*"
        actions[sa] = set(statement["Action"])
    assert actions == {f"{mon.RELEASE}-prometheus": {"aps:RemoteWrite"},
                       f"{mon.RELEASE}-grafana": {"aps:QueryMetrics", "aps:GetSeries", "aps:GetLabels", "aps:GetMetricMetadata"}}  # fmt: skip
    # The release waits for the associations (credentials reach only pods created after them).
    assert {f["association"]["urn"] for f in found.values()} <= set(_release(amp)["options"]["depends_on"])


def test_the_iam_actions_are_amps_data_plane_under_its_signing_name():
    """botocore's `amp` signs as `aps` (the IAM prefix); its operations are the control plane, so the data-plane
    permissions (remote write, the Prometheus query API) are no operation of it, and no control-plane operation is
    granted. The resource is a workspace ARN as botocore's WorkspaceArn pattern has it."""
    assert AMP_MODEL.metadata["signingName"] == "aps"
    for action in (*amp_data.REMOTE_WRITE_ACTIONS, *amp_data.QUERY_ACTIONS):
        prefix, name = action.split(":")
        assert prefix == "aps" and name not in AMP_MODEL.operation_names
    arn = "arn:aws:aps:us-east-1:123456789012:workspace/ws-8f3e1c2a-5b7d-4e6f-9a0b-1c2d3e4f5a6b"
    assert re.fullmatch(AMP_MODEL.shape_for("WorkspaceArn").metadata["pattern"], arn)
    for doc in (amp_data.remote_write_policy(arn), amp_data.query_policy(arn)):
        assert [s["Resource"] for s in json.loads(doc)["Statement"]] == [arn]


# ---- Grafana on the workspace ----------------------------------------------------------------------------------


def test_grafanas_datasource_is_the_workspace_signed_with_sigv4(amp):
    grafana = _release(amp)["inputs"]["values"]["grafana"]
    (ds,) = grafana["additionalDataSources"]
    assert ds["type"] == mon.AMP_PLUGIN and ds["url"] == f"<prometheusEndpoint:{_workspace(amp)['name']}>"
    assert ds["jsonData"]["sigV4Auth"] is True and ds["jsonData"]["sigV4AuthType"] == "default" and ds["jsonData"]["sigV4Region"] == "us-east-1"
    assert ds["isDefault"] is True and "secureJsonData" not in ds  # no keys: Pod Identity
    assert grafana["plugins"] == [f"{mon.AMP_PLUGIN}@{mon.AMP_PLUGIN_VERSION}"]
    assert grafana["grafana.ini"]["auth"]["sigv4_auth_enabled"] is True
    assert grafana["sidecar"]["datasources"]["defaultDatasourceEnabled"] is False  # the agent has no query API


def test_the_dashboards_use_the_plugins_datasource(amp):
    cms = [r for r in _of(amp, "kubernetes:core/v1:ConfigMap") if r["inputs"]["metadata"].get("namespace") == mon.NAMESPACE]
    assert len(cms) == 4
    for cm in cms:
        (body,) = cm["inputs"]["data"].values()
        dashboard = json.loads(body)
        types = set(re.findall(r'"datasource": \{"type": "([^"]+)"', json.dumps(dashboard)))
        assert types and "prometheus" not in types, types
        (var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
        assert var["query"] == mon.AMP_PLUGIN


# ---- rules and alerts --------------------------------------------------------------------------------------------


def test_the_workspace_evaluates_the_same_rules_and_promtool_accepts_them(amp, promtool: Path, tmp_path: Path):
    assert not [r for r in amp["resources"] if r["type"].startswith("kubernetes:monitoring.coreos.com") and r["type"].endswith("PrometheusRule")]
    (ns,) = _of(amp, "aws:amp/ruleGroupNamespace:RuleGroupNamespace")
    assert ns["inputs"]["workspaceId"] == f"<id:{_workspace(amp)['name']}>"
    config = load_stack_file("prod")
    expected = prometheus_rule_groups(AlertSpec.from_stack(config, make_plan(config.plan_request()).deployment(), raycluster="vllm"))
    assert yaml_text.safe_load(ns["inputs"]["data"]) == {"groups": expected}
    (tmp_path / "rules.yaml").write_text(ns["inputs"]["data"])
    out = subprocess.run([str(promtool), "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in expected)} rules found" in out.stdout


def test_sns_alerts_go_to_an_encrypted_topic_only_this_workspace_publishes_to(amp):
    ws = _workspace(amp)
    (topic,) = _of(amp, "aws:sns/topic:Topic")
    assert topic["inputs"]["kmsMasterKeyId"].startswith("<arn:")
    (tp,) = _of(amp, "aws:sns/topicPolicy:TopicPolicy")
    (statement,) = json.loads(tp["inputs"]["policy"])["Statement"]
    assert statement["Principal"] == {"Service": "aps.amazonaws.com"} and statement["Resource"] == f"<arn:{topic['name']}>"
    assert statement["Condition"]["ArnEquals"] == {"aws:SourceArn": f"<arn:{ws['name']}>"}
    (am,) = _of(amp, "aws:amp/alertManagerDefinition:AlertManagerDefinition")
    config = yaml_text.safe_load(yaml_text.safe_load(am["inputs"]["definition"])["alertmanager_config"])
    (receiver,) = config["receivers"]
    assert config["route"]["receiver"] == receiver["name"]
    (sns,) = receiver["sns_configs"]
    assert sns["topic_arn"] == f"<arn:{topic['name']}>" and sns["sigv4"] == {"region": "us-east-1"} and "api_url" not in sns
    # The key the topic uses lets AMP use it (from this account).
    (key,) = [k for k in _of(amp, "aws:kms/key:Key") if f"<arn:{k['name']}>" == topic["inputs"]["kmsMasterKeyId"]]
    assert any(s["Principal"] == {"Service": "aps.amazonaws.com"} for s in json.loads(key["inputs"]["policy"])["Statement"])
    assert amp["outputs"]["alertTopicArn"] == f"<arn:{topic['name']}>" and amp["outputs"]["ampWorkspaceId"] == f"<id:{ws['name']}>"


def test_amp_without_a_receiver_has_rules_but_no_topic(amp_none):
    assert _of(amp_none, "aws:amp/ruleGroupNamespace:RuleGroupNamespace")
    assert not _of(amp_none, "aws:sns/topic:Topic") and not _of(amp_none, "aws:amp/alertManagerDefinition:AlertManagerDefinition")
    assert "alertTopicArn" not in amp_none["outputs"]


# ---- the namespace's policies, the policy pack, the scan's conversion -------------------------------------------


def test_the_agent_scrapes_and_writes_out_grafana_queries_out(amp):
    nps = [{"metadata": r["inputs"]["metadata"], "spec": r["inputs"]["spec"]} for r in _of(amp, "kubernetes:networking.k8s.io/v1:NetworkPolicy")]
    agent = NP.pod(mon.NAMESPACE, mon.PROMETHEUS_AGENT_PODS)
    grafana = NP.pod(mon.NAMESPACE, mon.GRAFANA_PODS)
    (rc,) = _of(amp, "kubernetes:ray.io/v1:RayCluster")
    head = NP.pod("gpu-serving", rc["inputs"]["spec"]["headGroupSpec"]["template"]["metadata"]["labels"])
    aws_endpoint, pod_identity = NP.address("3.5.140.2"), NP.address("169.254.170.23")
    for src, dst, port in ((agent, head, 8000), (agent, aws_endpoint, 443), (agent, pod_identity, 80),
                           (grafana, aws_endpoint, 443), (grafana, pod_identity, 80)):  # fmt: skip
        assert NP.allowed(nps, src, dst, port), (src, dst, port)
    for src, dst, port in ((grafana, head, 8000), (agent, NP.address("10.0.1.10"), 443), (NP.pod("gpu-serving", {}), grafana, 3000)):
        assert not NP.allowed(nps, src, dst, port), (src, dst, port)


def test_the_policy_pack_passes_and_the_scan_sees_every_amp_resource(amp, amp_none):
    for doc in (amp, amp_none):
        assert check_document(doc) == []
        assert not [g for g in terraform_plan(doc).gaps if g.blocking]
