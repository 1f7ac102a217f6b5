"""The policy pack's rules for the stack's pods and their network: plain functions, as in `policies/rules.py`.

Standard library only. The rules:

- `check_pods_least_privilege` (resource rule): every pod template of every
  workload (RayCluster head and worker groups, Pods, Jobs, CronJobs,
  Deployments, ...) mounts no service-account token, uses the RuntimeDefault
  (or a Localhost) seccomp profile, and every container forbids privilege
  escalation, drops ALL capabilities, has a read-only root file system and
  adds back nothing but CHOWN in init containers (handing a directory to the
  pod's non-root user). EFA needs no capability: the nodes' containerd base
  runtime spec raises the locked-memory limit (infra/aws/gpu_nodes.py).
- `check_root_init_only_on_fsx` (stack rule): that exception, narrowed to
  where it is needed. An init container that runs as root or adds CHOWN is
  allowed only in a pod that mounts a claim bound to an FSx for Lustre volume
  (`fsx.csi.aws.com`): FSx has no access points, and its CSI driver's
  `fsGroupPolicy: ReadWriteOnceWithFSType` gives a ReadWriteMany volume no
  fsGroup, so a root step hands the checkpoint's directory to the staging
  user. On EFS the staging access point creates that directory for the
  staging user and enforces it (infra/k8s/staging.py): no root step, and the
  namespace can enforce `restricted`.
- `check_namespace_pod_security` (stack rule): a namespace the stack creates
  and runs pods in enforces Pod Security admission at exactly the strictest
  level all of them pass (`policies/pod_security.py`, at the version its
  `enforce-version` label pins): a weaker level wastes
  the admission controller, a stricter one refuses the pods; never weaker than
  `baseline` (`privileged` admits anything from anyone who may create a pod
  there); its `warn` and `audit` levels, if set, are no weaker than `enforce`.
- `check_network_policies` (stack rule): every namespace the stack runs pods in
  has a default-deny NetworkPolicy (every pod, ingress and egress, no rule);
  and, evaluated with `policies/network_policy.py` over that namespace's
  policies, each RayCluster's GCS, dashboard and client ports refuse a pod of
  another namespace, a pod of the same namespace outside the RayCluster, and
  every address an ipBlock names, while the RayCluster's head and workers
  reach each other. Every Namespace the stack creates (the operators' too,
  whose pods come from Helm charts) has a default-deny NetworkPolicy.
- `check_api_clients` (stack rule): a Service in front of a RayCluster's head
  (the inference API) admits only the clients it names: as a LoadBalancer, it
  keeps client addresses (`externalTrafficPolicy: Local`, without which the
  pod sees node addresses and no ipBlock can tell clients apart) and names
  `loadBalancerSourceRanges`, none of them every address; the NetworkPolicies
  admit to its target port no pod of another namespace, and, behind a load
  balancer, no address outside those ranges.

A rule never reports on what it cannot see yet (`<computed>` values).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

if __package__:  # imported as policies.kubernetes_rules
    from . import network_policy as netpol
    from . import pod_security as pss
    from .values import has_unknown
    from .workloads import _list, _map, containers, is_unknown, pod_templates, raycluster_spec, requests_resource
else:  # run by the policy analyzer from the pack's directory
    import network_policy as netpol  # type: ignore[no-redef]
    import pod_security as pss  # type: ignore[no-redef]
    from values import has_unknown  # type: ignore[no-redef]
    from workloads import _list, _map, containers, is_unknown, pod_templates, raycluster_spec, requests_resource  # type: ignore[no-redef]

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
PERSISTENT_VOLUME = "kubernetes:core/v1:PersistentVolume"
PERSISTENT_VOLUME_CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"
# The one CSI driver whose volumes may need a root step (module doc, `check_root_init_only_on_fsx`).
FSX_CSI_DRIVER = "fsx.csi.aws.com"
NAMESPACE = "kubernetes:core/v1:Namespace"
SERVICE = "kubernetes:core/v1:Service"
PSA_PREFIX = "pod-security.kubernetes.io/"
# What a container may add back after dropping ALL, and where (module doc).
INIT_CAPABILITIES = frozenset({"CHOWN"})
# The weakest Pod Security level a namespace of the stack may enforce (module doc).
MINIMUM_ENFORCED_LEVEL = "baseline"
# KubeRay's labels on every pod it creates (ray-operator/controllers/ray/common/pod.go, labelPod).
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_GROUP_LABEL = "ray.io/group"
# Ray's well-known head ports (KubeRay's defaults) and the rayStartParams that move them.
RAY_PORTS = (("GCS", "port", 6379), ("dashboard", "dashboard-port", 8265), ("client server", "ray-client-server-port", 10001))
OUTSIDE_ADDRESS = "203.0.113.10"  # TEST-NET-3: an address outside any cluster
PROBE_NAMESPACE = "policy-probe-elsewhere"


def _namespace(props: Mapping) -> str:
    ns = _map(props.get("metadata")).get("namespace")
    return ns if isinstance(ns, str) and ns else "default"


# --- pods: least privilege -------------------------------------------------------------------


def _pod_problems(where: str, pod: Mapping) -> list[str]:
    out: list[str] = []
    if pod.get("automountServiceAccountToken") is not False:
        out.append(
            f"{where}: mounts a service-account token (automountServiceAccountToken is not false): "
            "a pod that never calls the Kubernetes API should not carry credentials for it"
        )
    pod_seccomp = _map(_map(pod.get("securityContext")).get("seccompProfile")).get("type")
    for key, c in containers(pod):
        name = f"{'init container' if key == 'initContainers' else 'container'} {c.get('name', '?')}"
        sc = _map(c.get("securityContext"))
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}, {name}: set securityContext.allowPrivilegeEscalation: false")
        caps = _map(sc.get("capabilities"))
        if "ALL" not in {str(x).upper() for x in _list(caps.get("drop"))}:
            out.append(f"{where}, {name}: drop ALL capabilities (securityContext.capabilities.drop: [ALL])")
        allowed = INIT_CAPABILITIES if key == "initContainers" else frozenset()
        extra = sorted({str(x).upper().removeprefix("CAP_") for x in _list(caps.get("add"))} - allowed)
        if extra:
            out.append(
                f"{where}, {name}: adds {', '.join(extra)}; only CHOWN (init containers) may be added back "
                f"(EFA pods need none: the nodes raise the locked-memory limit)"
            )
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(f"{where}, {name}: set securityContext.readOnlyRootFilesystem: true (mount emptyDirs where it writes)")
        seccomp = _map(sc.get("seccompProfile")).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}, {name}: no RuntimeDefault seccomp profile (set securityContext.seccompProfile on the pod)")
    return out


def check_pods_least_privilege(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """Every pod template: no SA token, RuntimeDefault seccomp; every container: no escalation, ALL dropped, read-only root."""
    out: list[str] = []
    for where, metadata, pod in pod_templates(resource_type, props):
        if not pod or not pss.judgeable(pod, metadata) or is_unknown(pod.get("automountServiceAccountToken")):
            continue
        out.extend(_pod_problems(where, pod))
    return out


# --- root init containers: FSx only ------------------------------------------------------------------


def _root_init_containers(pod: Mapping) -> list[str]:
    """The init containers of a pod spec that run as root (their own runAsUser, else the pod's, is 0) or add CHOWN."""
    pod_user = _map(pod.get("securityContext")).get("runAsUser")
    out = []
    for c in (_map(c) for c in _list(pod.get("initContainers"))):
        sc = _map(c.get("securityContext"))
        caps = {str(x).upper().removeprefix("CAP_") for x in _list(_map(sc.get("capabilities")).get("add"))}
        if sc.get("runAsUser", pod_user) == 0 or "CHOWN" in caps:
            out.append(str(c.get("name", "?")))
    return out


def check_root_init_only_on_fsx(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """An init container that runs as root or adds CHOWN only in a pod whose claims include an FSx for Lustre volume."""
    claims: dict[tuple[str, str], object] = {}  # (namespace, claim) -> its volumeName
    drivers: dict[object, object] = {}  # volume name -> its CSI driver
    for r in resources:
        props = _map(r.get("inputs"))
        name = _map(props.get("metadata")).get("name")
        if r.get("type") == PERSISTENT_VOLUME_CLAIM:
            claims[(_namespace(props), name)] = _map(props.get("spec")).get("volumeName")
        elif r.get("type") == PERSISTENT_VOLUME:
            drivers[name] = _map(_map(props.get("spec")).get("csi")).get("driver")
    out: list[tuple[str, str]] = []
    for r in resources:
        props = _map(r.get("inputs"))
        for where, _, pod in pod_templates(str(r.get("type", "")), props):
            if not pod or has_unknown(pod.get("initContainers")) or has_unknown(pod.get("securityContext")):
                continue
            roots = _root_init_containers(pod)
            if not roots:
                continue
            ns = _namespace(props)
            names = [_map(v.get("persistentVolumeClaim")).get("claimName") for v in map(_map, _list(pod.get("volumes")))
                     if "persistentVolumeClaim" in v]  # fmt: skip
            found = [drivers.get(claims.get((ns, c))) for c in names]
            if any(is_unknown(c) or is_unknown(d) for c, d in zip(names, found)):
                continue
            if FSX_CSI_DRIVER in found:
                continue
            seen = ", ".join(f"{c} on {d or 'a volume the stack does not create'}" for c, d in zip(names, found)) or "no claim"
            out.append((r.get("urn", ""), f"{r.get('name')} ({where}): init container {', '.join(roots)} runs as root or adds "
                                          f"CHOWN, which only a pod on FSx for Lustre needs ({FSX_CSI_DRIVER}: no access "
                                          f"points, no fsGroup for its volumes); it mounts {seen}. On EFS the staging "
                                          "access point creates the directory for the staging user: drop the root step"))
    return out


# --- namespaces: Pod Security admission ---------------------------------------------------------


def _pods_by_namespace(resources: Sequence[Mapping]) -> tuple[dict[str, list[tuple[Mapping, str, Mapping, Mapping]]], set[str]]:
    """namespace -> [(resource, where, metadata, pod spec)] for every pod template of the stack, and the
    namespaces holding a workload whose spec is not known yet (a preview: an Output in it)."""
    out: dict[str, list[tuple[Mapping, str, Mapping, Mapping]]] = {}
    unknown: set[str] = set()
    for r in resources:
        props = _map(r.get("inputs"))
        templates = pod_templates(str(r.get("type", "")), props)
        if not templates:
            continue
        ns = _namespace(props)
        if is_unknown(props.get("spec")) or any(not spec or is_unknown(spec) for _, _, spec in templates):
            unknown.add(ns)
        out.setdefault(ns, []).extend((r, where, md, spec) for where, md, spec in templates)
    return out, unknown


def check_namespace_pod_security(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """A namespace the stack creates and runs pods in enforces the strictest Pod Security level they all pass."""
    out: list[tuple[str, str]] = []
    pods, unseen = _pods_by_namespace(resources)
    for ns in (r for r in resources if r.get("type") == NAMESPACE):
        metadata = _map(_map(ns.get("inputs")).get("metadata"))
        name, labels = metadata.get("name") or ns.get("name"), metadata.get("labels")
        if name not in pods or name in unseen or is_unknown(labels) or any(is_unknown(v) for v in _map(labels).values()):
            continue
        # Admission judges the pods at the version the namespace pins (none: the cluster's own).
        version = pss.policy_version(_map(labels).get(f"{PSA_PREFIX}enforce-version"))
        levels = [(r, where, pss.level(spec, md, version), spec, md) for r, where, md, spec in pods[name]]
        if any(lv is None for _, _, lv, _, _ in levels):
            continue
        strictest = pss.weakest([lv for _, _, lv, _, _ in levels])
        enforce = _map(labels).get(f"{PSA_PREFIX}enforce")
        urn = ns.get("urn", "")
        if enforce not in pss.LEVELS:
            out.append((urn, f"namespace {name} runs the stack's pods without Pod Security admission: label it "
                             f"{PSA_PREFIX}enforce={strictest}, the strictest level they all pass"))
            continue
        for r, where, lv, spec, md in levels:
            if not pss.stricter_or_equal(lv, enforce):
                why = "; ".join(pss.violations(spec, enforce, md, version))
                out.append((r.get("urn", ""), f"{r.get('name')} ({where}) passes Pod Security {lv} only, but namespace {name} "
                                              f"enforces {enforce}: admission would refuse its pods ({why})"))
        if not pss.stricter_or_equal(enforce, MINIMUM_ENFORCED_LEVEL):
            out.append((urn, f"namespace {name} enforces Pod Security {enforce}: the stack's namespaces enforce "
                             f"{MINIMUM_ENFORCED_LEVEL} or stricter (make the pods pass it)"))
        if pss.stricter_or_equal(strictest, enforce) and strictest != enforce:
            out.append((urn, f"namespace {name} enforces Pod Security {enforce}, but every pod the stack runs there passes "
                             f"{strictest}: enforce {strictest}"))
        for mode in ("warn", "audit"):
            other = _map(labels).get(f"{PSA_PREFIX}{mode}")
            if other is not None and (other not in pss.LEVELS or not pss.stricter_or_equal(other, enforce)):
                out.append((urn, f"namespace {name}: {PSA_PREFIX}{mode}={other} is weaker than enforce={enforce}; "
                                 "warn and audit exist to report what is stricter than enforcement"))
    return out


# --- network policies ------------------------------------------------------------------------------


def _policies_by_namespace(resources: Sequence[Mapping]) -> tuple[dict[str, list[Mapping]], set[str]]:
    """namespace -> its NetworkPolicies (as manifests), and the namespaces with a policy not known yet."""
    out: dict[str, list[Mapping]] = {}
    unknown: set[str] = set()
    for r in resources:
        if r.get("type") != NETWORK_POLICY:
            continue
        props = _map(r.get("inputs"))
        ns = _namespace(props)
        spec = props.get("spec")
        if has_unknown(spec):
            unknown.add(ns)
            continue
        out.setdefault(ns, []).append({"metadata": {"namespace": ns}, "spec": spec})
    return out, unknown


def _block_addresses(policies: Sequence[Mapping]) -> list[str]:
    """The first address of every ipBlock the policies name: who an ipBlock rule would admit."""
    out = []
    for p in policies:
        spec = _map(p.get("spec"))
        for rule in [*_list(spec.get("ingress")), *_list(spec.get("egress"))]:
            for peer in [*_list(_map(rule).get("from")), *_list(_map(rule).get("to"))]:
                block = _map(_map(peer).get("ipBlock"))
                if block.get("cidr"):
                    net = ipaddress.ip_network(str(block["cidr"]), strict=False)
                    out.append(str(net[1] if net.num_addresses > 2 else net[0]))
    return out


def _ray_endpoints(resource: Mapping, spec: Mapping) -> tuple[netpol.Endpoint, list[netpol.Endpoint], dict[str, int]]:
    """The RayCluster's head and worker pods as KubeRay labels them, and its head's Ray ports."""
    props = _map(resource.get("inputs"))
    ns, name = _namespace(props), _map(props.get("metadata")).get("name") or resource.get("name")
    head = _map(spec.get("headGroupSpec"))
    head_labels = {**_map(_map(_map(head.get("template")).get("metadata")).get("labels")),
                   RAY_CLUSTER_LABEL: name, RAY_NODE_TYPE_LABEL: "head", RAY_GROUP_LABEL: "headgroup"}  # fmt: skip
    workers = []
    for group in (_map(g) for g in _list(spec.get("workerGroupSpecs"))):
        labels = {**_map(_map(_map(group.get("template")).get("metadata")).get("labels")),
                  RAY_CLUSTER_LABEL: name, RAY_NODE_TYPE_LABEL: "worker", RAY_GROUP_LABEL: str(group.get("groupName", ""))}  # fmt: skip
        workers.append(netpol.pod(ns, labels))
    params = _map(head.get("rayStartParams"))
    ports = {}
    for what, param, default in RAY_PORTS:
        try:
            ports[what] = int(params.get(param, default))
        except (TypeError, ValueError):
            ports[what] = default
    return netpol.pod(ns, head_labels), workers, ports


def check_network_policies(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """A default deny wherever the stack runs pods; Ray's ports open to the RayCluster's own pods only."""
    out: list[tuple[str, str]] = []
    policies, unknown = _policies_by_namespace(resources)
    pods_by_ns = _pods_by_namespace(resources)[0]
    for ns, pods in sorted(pods_by_ns.items()):
        if ns in unknown:
            continue
        if not any(netpol.denies_all(p) for p in policies.get(ns, [])):
            r = pods[0][0]
            out.append((r.get("urn", ""), f"namespace {ns} runs the stack's pods ({r.get('name')}, ...) but has no default-deny "
                                          "NetworkPolicy (podSelector {}, policyTypes Ingress and Egress, no rules): "
                                          "every pod there accepts connections from anywhere"))
    for r in (r for r in resources if r.get("type") == NAMESPACE):
        name = _map(_map(r.get("inputs")).get("metadata")).get("name") or r.get("name")
        if not isinstance(name, str) or name in pods_by_ns or name in unknown:
            continue
        if not any(netpol.denies_all(p) for p in policies.get(name, [])):
            out.append((r.get("urn", ""), f"namespace {name} is the stack's but has no default-deny NetworkPolicy: what is "
                                          "installed there (a chart's pods) accepts connections from anywhere"))
    for r in resources:
        spec = raycluster_spec(str(r.get("type", "")), _map(r.get("inputs")))
        ns = _namespace(_map(r.get("inputs")))
        if spec is None or is_unknown(_map(r.get("inputs")).get("spec")) or ns in unknown:
            continue
        groups = [_map(spec.get("headGroupSpec")), *(_map(g) for g in _list(spec.get("workerGroupSpecs")))]
        if any(has_unknown(g.get("rayStartParams")) or has_unknown(_map(_map(g.get("template")).get("metadata")).get("labels")) for g in groups):
            continue
        nps = policies.get(ns, [])
        head, workers, ports = _ray_endpoints(r, spec)
        strangers = [
            ("a pod of another namespace", netpol.pod(PROBE_NAMESPACE, {})),
            (f"a pod of namespace {ns} outside the RayCluster", netpol.pod(ns, {"policy-probe": "stranger"})),
            *((f"address {ip}", netpol.address(ip)) for ip in [OUTSIDE_ADDRESS, *_block_addresses(nps)]),
        ]
        for what, port in ports.items():
            for who, src in strangers:
                if netpol.allowed(nps, src, head, port):
                    out.append((r.get("urn", ""), f"RayCluster {r.get('name')}: {who} can reach the head's Ray {what} port {port}; "
                                                  "Ray's ports must be open to the RayCluster's own pods only (NetworkPolicy)"))
        for worker in workers:
            if not netpol.allowed(nps, worker, head, ports["GCS"]) or not netpol.allowed(nps, head, worker, ports["GCS"]):
                out.append((r.get("urn", ""), f"RayCluster {r.get('name')}: its head and workers cannot reach each other under "
                                              f"namespace {ns}'s NetworkPolicies; Ray would not start"))
                break
    return out


# --- the inference API: who may reach it ---------------------------------------------------------------


def _head_ports(spec: Mapping) -> dict[str, int]:
    """The head container's named ports (a Service's targetPort may name one)."""
    head = _map(_map(_map(spec.get("headGroupSpec")).get("template")).get("spec"))
    out = {}
    for c in _list(head.get("containers")):
        for port in _list(_map(c).get("ports")):
            port = _map(port)
            if isinstance(port.get("name"), str) and isinstance(port.get("containerPort"), (int, float)):
                out[port["name"]] = int(port["containerPort"])
    return out


def _target_ports(service_spec: Mapping, named: Mapping[str, int]) -> list[int]:
    out = []
    for port in (_map(p) for p in _list(service_spec.get("ports"))):
        target = port.get("targetPort", port.get("port"))
        if isinstance(target, str) and not target.isdigit():
            target = named.get(target)
        if target is not None:
            out.append(int(float(target)))
    return out


def _api_problems(svc: Mapping, spec: Mapping, head: netpol.Endpoint, ports: list[int], nps: Sequence[Mapping]) -> list[str]:
    name = _map(_map(svc.get("inputs")).get("metadata")).get("name") or svc.get("name")
    out: list[str] = []
    ranges: list = []
    lb = spec.get("type") == "LoadBalancer"
    if lb:
        if spec.get("externalTrafficPolicy") != "Local":
            out.append(f"Service {name}: a LoadBalancer without externalTrafficPolicy: Local rewrites client addresses to the "
                       "nodes', so no NetworkPolicy can tell the configured clients from anyone else in the VPC")
        ranges = [ipaddress.ip_network(str(c), strict=False) for c in _list(spec.get("loadBalancerSourceRanges"))]
        if not ranges:
            out.append(f"Service {name}: a LoadBalancer without loadBalancerSourceRanges admits every address that reaches it")
        elif any(r.prefixlen == 0 for r in ranges):
            out.append(f"Service {name}: loadBalancerSourceRanges includes every address")
    for port in ports:
        if netpol.allowed(nps, netpol.pod(PROBE_NAMESPACE, {}), head, port):
            out.append(f"Service {name}: a pod of another namespace can reach the API port {port}")
        if lb and ranges:
            for ip in [OUTSIDE_ADDRESS, *_block_addresses(nps)]:
                inside = any(ipaddress.ip_address(ip) in r for r in ranges if r.version == ipaddress.ip_address(ip).version)
                if not inside and netpol.allowed(nps, netpol.address(ip), head, port):
                    out.append(f"Service {name}: address {ip}, outside its loadBalancerSourceRanges, can reach the API port {port}")
    return out


def check_api_clients(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """A Service in front of a RayCluster's head admits only the clients it names (module doc)."""
    out: list[tuple[str, str]] = []
    policies, unknown = _policies_by_namespace(resources)
    heads = []
    for r in resources:
        spec = raycluster_spec(str(r.get("type", "")), _map(r.get("inputs")))
        if spec is not None and not has_unknown(_map(r.get("inputs")).get("spec")):
            heads.append((_ray_endpoints(r, spec)[0], _head_ports(spec)))
    for svc in (r for r in resources if r.get("type") == SERVICE):
        props = _map(svc.get("inputs"))
        spec, ns = _map(props.get("spec")), _namespace(props)
        if has_unknown(props.get("spec")) or ns in unknown:
            continue
        selector = _map(spec.get("selector"))
        for head, named in heads:
            if head.namespace != ns or not selector or not netpol.selects({"matchLabels": dict(selector)}, head.labels):
                continue
            ports = _target_ports(spec, named)
            out.extend((svc.get("urn", ""), m) for m in _api_problems(svc, spec, head, ports, policies.get(ns, [])))
    return out
