"""Pod security: the Pod Security Standards evaluator, and every pod the stack creates measured with it.

`policies/pod_security.py` judges a pod spec by the controls of the Kubernetes
"Pod Security Standards" page; its tests take a minimal pod that passes
restricted and break one control at a time. Then the stack's own pods
(RayCluster head and workers, the EFA check, the benchmark, the staging Job on
EFS and on FSx): each sets no privilege escalation, drops ALL (adding back only
CHOWN in the FSx staging Job's init container), uses RuntimeDefault seccomp and
mounts no service-account token; all but that init container run as a non-root
user; their levels are what the namespace's labels say (the strictest level all
of them pass is the one enforced, and never below baseline): restricted for an
EFS stack, baseline for an FSx one.
"""

from __future__ import annotations

import copy

import pytest

from infra.k8s import checks, pod_security, raycluster, staging
from policies import pod_security as pss
from policies.kubernetes_rules import check_pods_least_privilege
from tests.test_rayspec import all_checks, make_spec, stack_plan


def restricted_pod() -> dict:
    return {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "app",
                "image": "img@sha256:" + "0" * 64,
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True},
                "ports": [{"containerPort": 8000}],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "data", "persistentVolumeClaim": {"claimName": "c"}}],
    }


def broken(path: str, value) -> dict:
    """The restricted pod with one field set (`a.b.0.c`: keys and list indexes)."""
    pod = restricted_pod()
    *parents, last = path.split(".")
    node = pod
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return pod


def test_a_hardened_pod_passes_restricted():
    assert pss.level(restricted_pod()) == pss.RESTRICTED
    assert pss.violations(restricted_pod(), pss.RESTRICTED) == []


@pytest.mark.parametrize(
    "path,value,control",
    [
        ("containers.0.securityContext.allowPrivilegeEscalation", True, "privilege escalation"),
        ("containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]}, "does not drop ALL"),
        ("containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["CHOWN"]}, "restricted allows NET_BIND_SERVICE only"),
        ("securityContext.runAsNonRoot", False, "running as non-root"),
        ("containers.0.securityContext.runAsUser", 0, "runAsUser is 0"),
        ("securityContext.seccompProfile", {"type": "Localhost", "localhostProfile": "p.json"}, None),  # allowed
        ("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "seccomp"),
        ("volumes.1", {"name": "nfs", "nfs": {"server": "s", "path": "/"}}, "volume types"),
    ],
)
def test_each_restricted_control(path, value, control):
    pod = broken(path, value)
    found = pss.restricted_violations(pod)
    if control is None:
        assert found == []
    else:
        assert any(control in v for v in found), found
        if "Unconfined" not in str(value):
            assert pss.level(pod) == pss.BASELINE  # a restricted-only control: baseline still passes


@pytest.mark.parametrize(
    "path,value,control",
    [
        ("hostNetwork", True, "host namespaces"),
        ("hostPID", True, "host namespaces"),
        ("containers.0.securityContext.privileged", True, "privileged containers"),
        ("containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["IPC_LOCK"]}, "IPC_LOCK"),
        ("containers.0.securityContext.capabilities", {"add": ["SYS_ADMIN"]}, "SYS_ADMIN"),
        ("volumes.0", {"name": "cache", "hostPath": {"path": "/var/lib/x"}}, "hostPath volumes"),
        ("containers.0.ports", [{"containerPort": 80, "hostPort": 80}], "host ports"),
        ("containers.0.securityContext.procMount", "Unmasked", "/proc mount type"),
        ("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "seccomp"),
        ("containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}, "AppArmor"),
        ("securityContext.seLinuxOptions", {"type": "spc_t"}, "SELinux"),
        ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "sysctls"),
        ("securityContext.windowsOptions", {"hostProcess": True}, "HostProcess"),
    ],
)
def test_each_baseline_control(path, value, control):
    pod = broken(path, value)
    found = pss.baseline_violations(pod)
    assert any(control in v for v in found), found
    assert pss.level(pod) == pss.PRIVILEGED


def test_baseline_allows_what_restricted_does_not():
    pod = broken("containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["CHOWN"]})
    pod["securityContext"] = {"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}]}
    assert pss.baseline_violations(pod) == [] and pss.restricted_violations(pod)
    assert pss.level(pod) == pss.BASELINE
    # The AppArmor annotation: runtime/default and localhost profiles only.
    assert pss.baseline_violations(pod, {"annotations": {"container.apparmor.security.beta.kubernetes.io/app": "unconfined"}})
    assert not pss.baseline_violations(pod, {"annotations": {"container.apparmor.security.beta.kubernetes.io/app": "localhost/p"}})


def test_values_are_compared_as_admission_writes_them():
    """check_capabilities_*.go compare the names as written: no CAP_ prefix removed, no case folded."""
    assert pss.baseline_violations(broken("containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["CAP_CHOWN"]}))
    found = pss.restricted_violations(broken("containers.0.securityContext.capabilities", {"drop": ["all"]}))
    assert any("does not drop ALL" in v for v in found), found


def test_a_pod_that_sets_run_as_non_root_false_fails_whatever_its_containers_say():
    pod = broken("securityContext.runAsNonRoot", False)
    pod["containers"][0]["securityContext"]["runAsNonRoot"] = True
    assert any("the pod sets runAsNonRoot false" in v for v in pss.restricted_violations(pod))
    assert pss.level(pod) == pss.BASELINE


def test_the_seccomp_annotations_no_longer_count():
    """Before 1.19 only (check_seccompProfile_baseline.go); the stack deploys 1.33 and later."""
    pod = restricted_pod()
    assert pss.baseline_violations(pod, {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}) == []


def test_controls_follow_the_version_the_namespace_pins():
    assert [pss.policy_version(v) for v in ("v1.33", "latest", "v1.033", "1.33", None)] == [33, None, None, None, None]
    # Sysctls: tcp_rmem is safe from 1.32 on.
    rmem = broken("securityContext.sysctls", [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"}])
    assert pss.level(rmem) == pss.RESTRICTED and pss.level(rmem, version=32) == pss.RESTRICTED
    assert pss.level(rmem, version=31) == pss.PRIVILEGED
    # SELinux: container_engine_t from 1.31.
    engine = broken("securityContext.seLinuxOptions", {"type": "container_engine_t"})
    assert pss.level(engine, version=31) == pss.RESTRICTED and pss.level(engine, version=30) == pss.PRIVILEGED
    # A probe or lifecycle handler sent to a host: baseline refuses it from 1.34.
    probe = broken("containers.0.livenessProbe", {"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}})
    found = pss.baseline_violations(probe)
    assert len(found) == 1 and "host probes and lifecycle hooks" in found[0] and "169.254.169.254" in found[0]
    assert pss.level(probe, version=34) == pss.PRIVILEGED and pss.level(probe, version=33) == pss.RESTRICTED
    hook = broken("containers.0.lifecycle", {"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 9}}})
    assert pss.level(hook) == pss.PRIVILEGED
    assert pss.level(broken("containers.0.livenessProbe", {"httpGet": {"host": "", "port": 80}})) == pss.RESTRICTED


def test_a_pod_in_its_own_user_namespace_from_1_35():
    """relaxPolicyForUserNamespacePod: root and an unmasked /proc pass baseline; restricted still wants /proc masked."""
    root = broken("securityContext.runAsUser", 0)
    root["securityContext"]["runAsNonRoot"] = False
    root["hostUsers"] = False
    assert pss.level(root) == pss.RESTRICTED and pss.level(root, version=34) == pss.BASELINE
    unmasked = broken("containers.0.securityContext.procMount", "Unmasked")
    unmasked["hostUsers"] = False
    assert pss.level(unmasked) == pss.BASELINE and pss.level(unmasked, version=34) == pss.PRIVILEGED


def test_restricted_allows_image_volumes_and_exempts_windows_pods_where_admission_does():
    assert pss.level(broken("volumes.1", {"name": "model", "image": {"reference": "registry/model:1"}})) == pss.RESTRICTED
    windows = restricted_pod()
    windows["os"] = {"name": "windows"}
    windows["securityContext"].pop("seccompProfile")
    windows["containers"][0]["securityContext"] = {"readOnlyRootFilesystem": True}
    assert pss.level(windows) == pss.RESTRICTED
    windows.pop("os")
    assert pss.level(windows) == pss.BASELINE


def test_a_container_overrides_the_pods_run_as_non_root_and_init_containers_count():
    pod = restricted_pod()
    pod["initContainers"] = [copy.deepcopy(pod["containers"][0]) | {"name": "init"}]
    pod["initContainers"][0]["securityContext"] = {**pod["initContainers"][0]["securityContext"], "runAsNonRoot": False, "runAsUser": 0}
    found = pss.restricted_violations(pod)
    assert any("initContainer init" in v and "non-root" in v for v in found)
    assert pss.level(pod) == pss.BASELINE


def test_an_unknown_value_makes_the_pod_unjudgeable():
    pod = restricted_pod()
    pod["containers"][0]["securityContext"] = "<computed>"
    assert pss.level(pod) is None


def test_levels_order():
    assert pss.weakest([pss.RESTRICTED, pss.BASELINE, pss.RESTRICTED]) == pss.BASELINE
    assert pss.weakest([]) == pss.RESTRICTED
    assert pss.stricter_or_equal(pss.RESTRICTED, pss.BASELINE) and not pss.stricter_or_equal(pss.PRIVILEGED, pss.BASELINE)
    with pytest.raises(ValueError):
        pss.violations(restricted_pod(), "strict")


# --- the stack's pods --------------------------------------------------------------------------


def stack_pods(stack: str, storage: str = "efs") -> dict[str, tuple[dict, dict]]:
    """Every pod template the stack's builders make for `stack` with every check on, its weights on `storage`:
    name -> (metadata, spec)."""
    spec = all_checks(stack_plan(stack))
    rc = raycluster.raycluster(spec)
    out = {"head": rc["spec"]["headGroupSpec"]["template"]}
    out.update({f"worker {g['groupName']}": g["template"] for g in rc["spec"].get("workerGroupSpecs", [])})
    if spec.efa_check:
        out["efa-check"] = checks.efa_check_job(spec)["spec"]["template"]
    out["benchmark"] = checks.benchmark_job(spec)["spec"]["template"]
    out["staging"] = {
        "metadata": {},
        "spec": staging.staging_pod_spec(
            image="registry/staging:tag", command=staging.staging_command(), args=[], pvc_name="model-weights",
            mount_path="/models", dest="/models/org/name", service_account="sa", hf_token_secret="t", scripts_config_map="cm",
            owner_step=storage == "fsx",
        ),
    }  # fmt: skip
    return {name: (t["metadata"], t["spec"]) for name, t in out.items()}


@pytest.mark.parametrize("storage", ["efs", "fsx"])
@pytest.mark.parametrize("stack", ["prod", "test"])
def test_every_pod_the_stack_creates_runs_with_least_privilege(stack, storage):
    for name, (metadata, pod) in stack_pods(stack, storage).items():
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            added = set(sc["capabilities"].get("add", []))
            if c["name"] == "own-dest":
                assert storage == "fsx" and name == "staging"
                assert added == {"CHOWN"} and sc["runAsUser"] == 0
            else:
                # Nothing, EFA included (prod's p5: the nodes raise the locked-memory limit), and never root.
                assert added == set(), (name, c["name"])
                assert sc.get("runAsUser", pod["securityContext"].get("runAsUser")) == pod_security.NONROOT_UID, (name, c["name"])
                assert pod["securityContext"]["runAsNonRoot"] is True, name
        # The policy pack's rule agrees (it reads the same fields).
        assert check_pods_least_privilege("kubernetes:core/v1:Pod", {"metadata": metadata, "spec": pod}, {}, {}) == [], name


def test_the_levels_of_the_stacks_pods_and_why():
    pods = stack_pods("prod")
    levels = {name: pss.level(spec, md) for name, (md, spec) in pods.items()}
    # The serving pods pass restricted: no hostPath (an emptyDir holds the compile cache), no capability, non-root; so
    # does the staging Job on EFS, whose access point hands it the checkpoint's directory (no init container).
    assert levels == {"head": "restricted", "worker gpu": "restricted", "efa-check": "restricted", "benchmark": "restricted", "staging": "restricted"}
    assert "initContainers" not in pods["staging"][1]
    # Staging on FSx: only its root init container (CHOWN) keeps it out of restricted.
    fsx = stack_pods("prod", "fsx")
    assert {name: pss.level(spec, md) for name, (md, spec) in fsx.items()} == {**levels, "staging": "baseline"}
    reasons = pss.restricted_violations(fsx["staging"][1])
    assert reasons and all("own-dest" in v for v in reasons)
    test_levels = {name: pss.level(spec, md) for name, (md, spec) in stack_pods("test").items()}  # one node: no worker, no EFA check
    assert test_levels == {name: levels[name] for name in test_levels} and "head" in test_levels


@pytest.mark.parametrize("storage,enforced", [("efs", "restricted"), ("fsx", "baseline")])
def test_the_namespace_enforces_the_strictest_level_all_its_pods_pass(storage, enforced):
    labels = pod_security.namespace_labels("1.33", storage)
    assert labels == {
        "pod-security.kubernetes.io/enforce": enforced, "pod-security.kubernetes.io/enforce-version": "v1.33",
        "pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/warn-version": "v1.33",
        "pod-security.kubernetes.io/audit": "restricted", "pod-security.kubernetes.io/audit-version": "v1.33",
    }  # fmt: skip
    assert pss.stricter_or_equal(enforced, pod_security.PSA_ENFORCE)
    with pytest.raises(ValueError):
        pod_security.namespace_labels("1.33", "ebs")
    for stack in ("prod", "test"):
        pods = stack_pods(stack, storage)
        strictest = pss.weakest([pss.level(spec, md) for md, spec in pods.values()])
        assert labels["pod-security.kubernetes.io/enforce"] == strictest
        for md, spec in pods.values():
            assert pss.violations(spec, strictest, md) == []
        # warn and audit report what exceeds stricter levels, never weaker ones.
        for mode in ("warn", "audit"):
            assert pss.stricter_or_equal(labels[f"pod-security.kubernetes.io/{mode}"], strictest)


def test_what_the_serving_pods_used_to_need_would_not_pass_the_enforced_level():
    """Every stack's namespace enforces baseline at least: IPC_LOCK or the old hostPath compile cache would be refused at admission."""
    _, head = stack_pods("prod")["head"]
    for change, control in (
        (lambda h: h["containers"][0]["securityContext"]["capabilities"].update(add=["IPC_LOCK"]), "capabilities"),
        (lambda h: h["volumes"].append({"name": "cc", "hostPath": {"path": "/var/lib/gpu-serving/compile-cache/ns/vllm"}}), "hostPath volumes"),
    ):
        broken = copy.deepcopy(head)
        change(broken)
        assert pss.level(broken) == pss.PRIVILEGED
        assert [v.split(":")[0] for v in pss.violations(broken, pod_security.PSA_ENFORCE)] == [control]


def test_ray_token_authentication_needs_a_release_that_has_it():
    from infra.errors import UserError

    with pytest.raises(UserError, match="token authentication"):
        make_spec(stack_plan("prod"), ray_version="2.51.1")
    assert raycluster.raycluster(make_spec(stack_plan("prod"), ray_version="2.52.0"))["spec"]["authOptions"] == {"mode": "token"}
