"""Kubernetes NetworkPolicy semantics as a pure function: may this endpoint open that port of that one?

Standard library only. `allowed(policies, src, dst, port, protocol)` follows the
`networking.k8s.io/v1` API: the Kubernetes docs, "Network Policies"
(https://kubernetes.io/docs/concepts/services-networking/network-policies/), and
the field descriptions of NetworkPolicySpec, NetworkPolicyPeer,
NetworkPolicyPort and IPBlock in the API reference (the schemas
kubernetes-validate ships, `kubernetes-json-schema/v1.35.0-local-strict/`):

- A policy applies to the pods of its own namespace that its `podSelector`
  selects (`{}`, or no selector: all of them).
- Its `policyTypes` say which directions it isolates; left out, they are
  `Ingress`, plus `Egress` when the policy has egress rules: the API server's
  defaulting, `SetDefaults_NetworkPolicy` in kubernetes
  `pkg/apis/networking/v1/defaults.go`, adds Egress for a non-empty `egress`
  only (`len(Spec.Egress) != 0`), so `egress: []` without `policyTypes`
  isolates nothing outgoing.
- A pod selected by no policy of a direction is not isolated in that
  direction: everything is allowed. A pod selected by some is allowed only
  what at least one of their rules allows (the rules are a union; there is no
  deny rule). A policy that isolates a direction and has no rule for it allows
  nothing in it.
- A rule with no `from`/`to` admits every peer; with no `ports`, every port.
  Its peers are ORed; within one peer `namespaceSelector` and `podSelector`
  are ANDed; a peer with a `podSelector` alone means pods of the policy's own
  namespace; a `namespaceSelector` alone, every pod of the matching
  namespaces; an `ipBlock` (which a peer holds alone) matches an address in
  its CIDR and in none of its `except` ranges (implementations disagree on pod
  addresses; the AWS VPC CNI matches pod addresses too, so this evaluator does).
- A port is a number or a name (the destination pod's container port of that
  name), with an optional `endPort` (inclusive, numeric ports only); the
  protocol defaults to TCP (`SetDefaults_NetworkPolicyPort`, same file).
- A connection needs both: the source's egress and the destination's ingress.
  An endpoint that is not a pod (a client outside the cluster) is subject to
  no policy of its own.

Not modelled: traffic from a pod's own node (always allowed), and Services
(a policy sees the pod behind one).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

if __package__:  # imported as policies.network_policy
    from .values import _list, _map
else:  # run by the policy analyzer from the pack's directory
    from values import _list, _map  # type: ignore[no-redef]

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
INGRESS, EGRESS = "Ingress", "Egress"


@dataclass(frozen=True)
class Endpoint:
    """A pod (`namespace` set) or an address outside the cluster (`namespace` None, `ip` set).

    `namespace_labels` default to the API server's `kubernetes.io/metadata.name`;
    `ports` are the pod's named container ports (name -> number).
    """

    namespace: Optional[str] = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: Optional[str] = None
    namespace_labels: Optional[Mapping[str, str]] = None
    ports: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None

    def ns_labels(self) -> Mapping[str, str]:
        if self.namespace_labels is not None:
            return self.namespace_labels
        return {NAMESPACE_NAME_LABEL: self.namespace} if self.namespace else {}


def pod(namespace: str, labels: Optional[Mapping[str, str]] = None, **kw: Any) -> Endpoint:
    return Endpoint(namespace=namespace, labels=dict(labels or {}), **kw)


def address(ip: str) -> Endpoint:
    return Endpoint(ip=ip)


def selects(selector: Optional[Mapping], labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist) all hold."""
    selector = _map(selector)
    for k, v in _map(selector.get("matchLabels")).items():
        if labels.get(k) != v:
            return False
    for expr in (_map(e) for e in _list(selector.get("matchExpressions"))):
        key, op, values = expr.get("key"), expr.get("operator"), list(_list(expr.get("values")))
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown label selector operator {op!r}")
    return True


def policy_types(policy: Mapping) -> list[str]:
    spec = _map(policy.get("spec"))
    given = _list(spec.get("policyTypes"))
    if given:
        return list(given)
    return [INGRESS] + ([EGRESS] if _list(spec.get("egress")) else [])  # SetDefaults_NetworkPolicy (module doc)


def applies(policy: Mapping, endpoint: Endpoint) -> bool:
    """Whether the policy selects the endpoint (a pod of its namespace its podSelector selects)."""
    if not endpoint.is_pod:
        return False
    ns = _map(policy.get("metadata")).get("namespace", "default")
    return ns == endpoint.namespace and selects(_map(policy.get("spec")).get("podSelector"), endpoint.labels)


def _in_block(block: Mapping, ip: Optional[str]) -> bool:
    if ip is None:
        return False
    addr = ipaddress.ip_address(ip)
    if addr not in ipaddress.ip_network(str(block.get("cidr")), strict=False):
        return False
    return not any(addr in ipaddress.ip_network(str(e), strict=False) for e in _list(block.get("except")))


def peer_matches(peer: Mapping, policy_namespace: str, other: Endpoint) -> bool:
    """Whether one peer (`from`/`to` entry) of a policy in `policy_namespace` matches the other end."""
    if "ipBlock" in peer:
        return _in_block(_map(peer["ipBlock"]), other.ip)
    if not other.is_pod:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.ns_labels()):
            return False
    elif other.namespace != policy_namespace:
        return False
    if "podSelector" in peer:
        return selects(peer["podSelector"], other.labels)
    return True


def port_matches(ports: Sequence, port: int, protocol: str, dst: Endpoint) -> bool:
    """Whether a rule's `ports` admit `port`/`protocol` on the destination `dst` (no ports: all)."""
    if not ports:
        return True
    for p in (_map(x) for x in ports):
        if str(p.get("protocol", "TCP")).upper() != protocol.upper():
            continue
        if "port" not in p:
            return True
        value = p["port"]
        if isinstance(value, str) and not value.isdigit():
            if dst.ports.get(value) == port:
                return True
            continue
        low, high = int(value), int(p.get("endPort", value))
        if low <= port <= high:
            return True
    return False


def _direction_allows(policies: Sequence[Mapping], subject: Endpoint, other: Endpoint, direction: str, port: int, protocol: str, dst: Endpoint) -> bool:
    isolating = [p for p in policies if applies(p, subject) and direction in policy_types(p)]
    if not isolating:
        return True
    key, peers_key = ("ingress", "from") if direction == INGRESS else ("egress", "to")
    for p in isolating:
        ns = _map(p.get("metadata")).get("namespace", "default")
        for rule in (_map(r) for r in _list(_map(p.get("spec")).get(key))):
            peers = _list(rule.get(peers_key))
            if peers and not any(peer_matches(_map(peer), ns, other) for peer in peers):
                continue
            if port_matches(_list(rule.get("ports")), port, protocol, dst):
                return True
    return False


def ingress_allowed(policies: Sequence[Mapping], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    return not dst.is_pod or _direction_allows(policies, dst, src, INGRESS, port, protocol, dst)


def egress_allowed(policies: Sequence[Mapping], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    return not src.is_pod or _direction_allows(policies, src, dst, EGRESS, port, protocol, dst)


def allowed(policies: Sequence[Mapping], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    """Whether `src` may open `port`/`protocol` on `dst`: the source's egress and the destination's ingress both allow it."""
    return egress_allowed(policies, src, dst, port, protocol) and ingress_allowed(policies, src, dst, port, protocol)


def denies_all(policy: Mapping, directions: Sequence[str] = (INGRESS, EGRESS)) -> bool:
    """Whether the policy is a default deny: it selects every pod of its namespace and isolates `directions` with no rule."""
    spec = _map(policy.get("spec"))
    selector = _map(spec.get("podSelector"))
    if _map(selector.get("matchLabels")) or _list(selector.get("matchExpressions")):
        return False
    types = policy_types(policy)
    for d in directions:
        if d not in types or _list(spec.get("ingress" if d == INGRESS else "egress")):
            return False
    return True
