"""KubeRay watches only the serving namespace (issue 19 item 4): the chart's templates, the stack, day two.

1. The chart's own templates (tests/fixtures/kuberay-operator-1.7.0-templates/, verbatim from
   ray-project/kuberay v1.7.0), rendered by tests/helm_subset.py with the chart's default values
   merged with ours: no ClusterRole or ClusterRoleBinding, one Role and one RoleBinding (to the
   operator's ServiceAccount in its own namespace) in each watched namespace, the leader-election
   Role in the operator's namespace, and `--watch-namespace <serving namespace>` in the operator's
   arguments. The chart's defaults render the cluster-wide objects instead (so the renderer is not
   blind to them). No template is a CustomResourceDefinition: the CRDs are the chart's crds/ folder,
   which values cannot change.
2. The synthesized prod stack: the KubeRay release's values name the stack's serving namespace, and
   the release depends on that Namespace resource.
3. Day two: the program as it was (cluster-wide values, no dependency on the serving namespace)
   against the program now. Only the KubeRay release changes, in place (its values and
   dependencies; name, namespace, chart, version and repository as they were): no Kubernetes
   provider, RayCluster, Namespace or other resource moves, nothing is added or removed.
   pulumi-kubernetes replaces a Release only when `name` or `namespace` changes
   (provider/pkg/provider/helm_release.go, Diff: `forceNewFields := []string{".name", ".namespace"}`);
   any other change is an Update, i.e. `helm upgrade` of the same release. The diff tool does not
   model Release replacements (infra/preview/diff.py), hence the explicit check on those fields.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import components.operators as operators_module
from infra.config import load_stack_file
from infra.k8s.helm_values import KUBERAY_OPERATOR, kuberay_operator_values
from infra.k8s.scheduling import system_node_selector
from infra.preview.diff import diff
from infra.preview.synth import synthesize
from tests.helm_subset import Context, Failed, Unsupported, evaluate, render
from tests import yaml_text
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tests/fixtures/kuberay-operator-1.7.0-templates"
DEFAULTS = REPO / "tests/fixtures/upstream" / KUBERAY_OPERATOR.upstream_folder / "values.yaml"
RELEASE = "kubernetes:helm.sh/v3:Release"
NAMESPACE = "kubernetes:core/v1:Namespace"
K8S_PROVIDER = "pulumi:providers:kubernetes"
RAYCLUSTER = "kubernetes:ray.io/v1:RayCluster"
CLUSTER_SCOPED_RBAC = ("ClusterRole", "ClusterRoleBinding")


def merged(ours: dict) -> dict:
    """Helm's merge of user values over the chart's defaults: maps merge key by key, anything else replaces."""

    def merge(base: Any, over: Any) -> Any:
        if isinstance(base, dict) and isinstance(over, dict):
            out = dict(base)
            for k, v in over.items():
                out[k] = merge(base.get(k), v)
            return out
        return copy.deepcopy(over)

    return merge(yaml_text.safe_load(DEFAULTS.read_text()), ours)


def rendered(ours: dict) -> tuple[list[dict], list[str]]:
    """Every object the chart's templates render with `ours`, and the operator's arguments."""
    objects: list[dict] = []
    args: list[str] = []
    for path in sorted(TEMPLATES.glob("*.yaml")):
        ctx = Context(merged(ours), release_namespace=KUBERAY_OPERATOR.namespace, release_name=KUBERAY_OPERATOR.release)
        text = render(path.read_text(), ctx)
        objects += [{**d, "_template": path.name} for d in yaml_text.safe_load_all(text) if d]
        if path.name == "deployment.yaml":
            args = [a for a in ctx.variables["$argList"] if a]
    return objects, args


def _kinds(objects: list[dict]) -> list[tuple[str, str | None]]:
    return sorted((o["kind"], o["metadata"].get("namespace")) for o in objects)


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# ---- 1. the chart's templates --------------------------------------------------------------------


def test_the_fixture_holds_every_template_of_the_chart():
    names = {p.name for p in TEMPLATES.iterdir()} - {"README.md"}
    assert {"deployment.yaml", "role.yaml", "rolebinding.yaml", "multiple_namespaces_role.yaml",
            "multiple_namespaces_rolebinding.yaml", "leader_election_role.yaml", "leader_election_role_binding.yaml",
            "_helpers.tpl", "configmap.yaml"} <= names  # fmt: skip
    assert len(names) == 18  # templates/ at v1.7.0


def test_ours_render_a_role_in_the_serving_namespace_and_no_cluster_role():
    objects, args = rendered(kuberay_operator_values(("gpu-serving",)))
    ns = KUBERAY_OPERATOR.namespace
    assert not [o for o in objects if o["kind"] in CLUSTER_SCOPED_RBAC]
    assert _kinds(objects) == sorted([
        ("Deployment", ns), ("Service", ns), ("ServiceAccount", ns),
        ("Role", ns), ("RoleBinding", ns),  # leader election, in the operator's own namespace
        ("Role", "gpu-serving"), ("RoleBinding", "gpu-serving"),  # the operator's rights, in the serving namespace only
    ])  # fmt: skip
    by_template = {o["_template"]: o for o in objects}
    assert by_template["leader_election_role.yaml"]["metadata"]["namespace"] == ns
    assert {r for rule in by_template["leader_election_role.yaml"]["rules"] for r in rule["resources"]} == {"configmaps", "events", "leases"}
    binding = by_template["multiple_namespaces_rolebinding.yaml"]
    assert binding["roleRef"]["kind"] == "Role"
    assert [(s["kind"], s["namespace"]) for s in binding["subjects"]] == [("ServiceAccount", ns)]
    # The operator's manager watches the serving namespace only (main.go: cache DefaultNamespaces).
    assert _flag(args, "--watch-namespace") == "gpu-serving"
    # ... through its arguments: the ConfigMap form (configuration.enabled) stays off.
    assert merged(kuberay_operator_values(("gpu-serving",)))["configuration"]["enabled"] is False
    assert not [o for o in objects if o["kind"] == "ConfigMap"]


def test_several_watched_namespaces_get_a_role_each_and_one_flag():
    objects, args = rendered(kuberay_operator_values(("serving-a", "serving-b")))
    roles = sorted(o["metadata"]["namespace"] for o in objects if o["_template"] == "multiple_namespaces_role.yaml")
    bindings = sorted(o["metadata"]["namespace"] for o in objects if o["_template"] == "multiple_namespaces_rolebinding.yaml")
    assert roles == bindings == ["serving-a", "serving-b"]
    assert _flag(args, "--watch-namespace") == "serving-a,serving-b"


def test_the_charts_defaults_are_cluster_wide():
    """What a stack installed before this change runs: the control for the tests above."""
    objects, args = rendered({})
    cluster = sorted(o["kind"] for o in objects if o["kind"] in CLUSTER_SCOPED_RBAC)
    # The operator's ClusterRole and binding, and the end users' editor/viewer ClusterRoles (ray_*_role.yaml).
    assert cluster == ["ClusterRole"] * 7 + ["ClusterRoleBinding"]
    assert "--watch-namespace" not in args
    assert not [o for o in objects if o["_template"].startswith("multiple_namespaces")]
    # The leader-election Role renders either way (rbacEnable alone).
    assert [o["metadata"]["namespace"] for o in objects if o["_template"] == "leader_election_role.yaml"] == [KUBERAY_OPERATOR.namespace]


def test_no_template_is_a_crd_so_values_cannot_touch_the_crds():
    # The CRDs are the chart's crds/ folder (the fixture upstream/kuberay-operator-1.7.0/ray.io_rayclusters.yaml is
    # crds/ray.io_rayclusters.yaml): Helm applies them on install only and never upgrades or deletes them.
    for ours in ({}, kuberay_operator_values(("gpu-serving",))):
        objects, _ = rendered(ours)
        assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert not [p.name for p in TEMPLATES.iterdir() if "CustomResourceDefinition" in p.read_text()]


def test_the_renderer_fails_loudly_on_what_it_does_not_know():
    ctx = Context({"a": {"b": [1]}, "s": ""}, "ns")
    assert evaluate("default (list .Release.Namespace) .Values.s", ctx) == ["ns"]
    assert evaluate('join "," (list "x" "y")', ctx) == "x,y"
    assert evaluate("and .Values.a (not .Values.s)", ctx) is True
    assert evaluate('printf "--x=%t" .Values.a.b', ctx) == "--x=true"
    with pytest.raises(Unsupported):
        evaluate("sha256sum .Values.s", ctx)
    with pytest.raises(Failed):
        evaluate('fail "no"', ctx)
    assert render('{{- if .Values.s }}yes{{- else if .Values.a }}a{{- else }}no{{- end }}', ctx) == "a"
    assert render("{{- range $n := .Values.a.b }}[{{ $n }}]{{- end }}", ctx) == "[1]"


# ---- 2. the synthesized stack ------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod() -> dict:
    return repo_stack("prod")


def _kuberay_release(doc: dict) -> dict:
    (release,) = [r for r in doc["resources"] if r["type"] == RELEASE and r["inputs"]["chart"] == KUBERAY_OPERATOR.chart]
    return release


def test_the_release_watches_the_stacks_serving_namespace_and_waits_for_it(prod):
    serving = load_stack_file("prod", REPO).serving.namespace
    release = _kuberay_release(prod)
    values = release["inputs"]["values"]
    assert values["watchNamespace"] == [serving]
    assert values["singleNamespaceInstall"] is True and values["crNamespacedRbacEnable"] is True and values["rbacEnable"] is True
    (namespace,) = [r for r in prod["resources"] if r["type"] == NAMESPACE and r["inputs"]["metadata"]["name"] == serving]
    assert namespace["urn"] in release["options"]["depends_on"]
    assert release["urn"] not in namespace["options"]["depends_on"]  # no cycle: the namespace comes first
    # The RayCluster lives in the namespace KubeRay watches.
    (raycluster,) = [r for r in prod["resources"] if r["type"] == RAYCLUSTER]
    assert raycluster["inputs"]["metadata"]["namespace"] in values["watchNamespace"]


# ---- 3. day two: a running stack's next `pulumi up` ------------------------------------------------


def test_a_running_stack_upgrades_the_kuberay_release_in_place_and_nothing_else(prod, monkeypatch):
    # The program before this change: cluster-wide values, the release waiting only for its own namespace's policies.
    monkeypatch.setattr(operators_module, "kuberay_operator_values", lambda _namespaces: {"nodeSelector": system_node_selector()})
    monkeypatch.setattr(operators_module, "release_depends_on", lambda chart, policies, _watched: list(policies.get(chart.namespace, ())))
    before = synthesize("prod", REPO)
    d = diff(before, prod)
    assert not d.added and not d.removed
    assert [(c.type, c.name) for c in d.changed] == [(RELEASE, _kuberay_release(prod)["name"])]
    (change,) = d.changed
    assert not change.replaced and not change.moved_from
    paths = [f.path for f in change.fields]
    assert paths and all(p.startswith(("inputs.values.", "options.depends_on")) for p in paths), paths
    b, h = _kuberay_release(before)["inputs"], _kuberay_release(prod)["inputs"]
    for key in ("name", "namespace", "chart", "version", "repositoryOpts"):
        assert b[key] == h[key], key
    assert not [c for c in d.callouts if c.level == "CAUTION"]
    # Neither side has the CRDs or the RayCluster's API group as Pulumi resources of their own to replace:
    # the CRDs are Helm's (crds/), and the RayCluster is unchanged (above).
    assert not [r for r in prod["resources"] if "CustomResourceDefinition" in r["type"]]
    assert [r["type"] for r in prod["resources"] if r["type"] in (K8S_PROVIDER, RAYCLUSTER)].count(RAYCLUSTER) == 1
