"""The policy rules of the GPU serving stack, as plain functions.

Nothing here imports Pulumi: the same functions run inside the CrossGuard pack
(`policies/__main__.py`, during `pulumi preview/up --policy-pack policies`),
offline over a synth document (`infra/preview/policy_check.py`, `python -m infra check`)
and in the tests. Standard library only, so the pack's own virtualenv needs
nothing but pulumi-policy.

Two kinds of rule:

- resource rules: `check(resource_type, props, options, context) -> [message]`,
  called once per resource;
- stack rules: `check(resources, context) -> [(urn, message)]`, called once
  with every resource of the stack.

`props` are a resource's inputs with the SDK's camelCase names (what the synth
document calls `inputs` and CrossGuard `args.props`). `options` uses the synth
document's keys (`protect`, `retain_on_delete`, ...); a value the caller cannot
see is None (CrossGuard 1.21 does not pass `retain_on_delete`). A stack rule's
`resources` are dicts shaped like the synth document's resources: `type`,
`name`, `urn`, `inputs`, `options`, and optionally `property_dependencies`
(`{property: [urn, ...]}`, what CrossGuard knows of references whose values are
still unknown in a preview).

Values nobody knows yet are `UNKNOWN` ("<computed>", as in the synth document;
the CrossGuard adapter maps its own unknown markers to it). A rule never
reports a violation on a value it cannot see: CrossGuard runs resource rules
again with resolved inputs during `pulumi up`, before the resource is created.

`context` carries what a rule needs beyond one resource (see `CONTEXT_DEFAULTS`):

- `production`: the stack is a production stack (the AWS provider's default
  tag `lifecycle: production`, infra/aws/tags.py);
- `allow_internet_facing`: internet-facing load balancers are allowed (no stack
  config sets it; in CrossGuard, the policy's `allowInternetFacing` config);
- `gpus_per_node`: the GPU instance type's GPU count, when known (the offline
  check reads it from the catalog; CrossGuard from the `gpusPerNode` config);
- `require_customer_managed_keys`: EBS, EFS and FSx must name a KMS key of
  their own (off by default; the `requireCustomerManagedKeys` config).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

if __package__:  # imported as policies.rules
    from . import aws_rules, kubernetes_rules, values, workloads
else:  # run by the policy analyzer from the pack's directory: its modules are top-level there
    import aws_rules  # type: ignore[no-redef]
    import kubernetes_rules  # type: ignore[no-redef]
    import values  # type: ignore[no-redef]
    import workloads  # type: ignore[no-redef]

# What the rules below read from the shared modules, and the rules that live there (RULES wires them in;
# callers reach every rule through this module).
GPU, UNKNOWN = workloads.GPU, workloads.UNKNOWN
_list, _map, _truthy, is_unknown = workloads._list, workloads._map, workloads._truthy, workloads.is_unknown
same_resource = values.same_resource
pod_gpus, ray_pod_templates, raycluster_spec = workloads.pod_gpus, workloads.ray_pod_templates, workloads.raycluster_spec
check_serving_pods = workloads.check_serving_pods
check_pods_least_privilege = kubernetes_rules.check_pods_least_privilege
check_namespace_pod_security = kubernetes_rules.check_namespace_pod_security
check_root_init_only_on_fsx = kubernetes_rules.check_root_init_only_on_fsx
check_network_policies = kubernetes_rules.check_network_policies
check_api_clients = kubernetes_rules.check_api_clients

MANDATORY = "mandatory"
ADVISORY = "advisory"

CONTEXT_DEFAULTS: dict[str, Any] = {
    "production": False,
    "allow_internet_facing": False,
    "gpus_per_node": None,
    "require_customer_managed_keys": False,
}

# Policy config keys (CrossGuard `--policy-pack-config`) -> context keys.
CONFIG_KEYS = {
    "allowInternetFacing": "allow_internet_facing",
    "gpusPerNode": "gpus_per_node",
    "requireCustomerManagedKeys": "require_customer_managed_keys",
}

AWS_PROVIDER = "pulumi:providers:aws"
LIFECYCLE_TAG = "lifecycle"  # infra/aws/tags.py
PRODUCTION = "production"

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
EBS_VOLUME = "aws:ebs/volume:Volume"
EFS = "aws:efs/fileSystem:FileSystem"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
PERSISTENT_VOLUME = "kubernetes:core/v1:PersistentVolume"
SERVICE = "kubernetes:core/v1:Service"
INGRESS_TYPES = ("kubernetes:networking.k8s.io/v1:Ingress", "kubernetes:networking.k8s.io/v1beta1:Ingress")
AWS_LOAD_BALANCERS = ("aws:lb/loadBalancer:LoadBalancer", "aws:alb/loadBalancer:LoadBalancer", "aws:elb/loadBalancer:LoadBalancer")

ALL_PROTOCOLS = ("-1", "all")
EFA_INTERFACE_TYPES = ("efa", "efa-only")
LB_INTERNAL = "service.beta.kubernetes.io/aws-load-balancer-internal"
LB_SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
ALB_SCHEME = "alb.ingress.kubernetes.io/scheme"


def production_from_provider(props: Mapping) -> bool:
    """Whether an AWS provider's default tags mark a production stack.

    Providers receive nested config as JSON strings (the synth document and the
    engine both show `defaultTags` as one), so both forms are read.
    """
    tags_arg = props.get("defaultTags")
    if isinstance(tags_arg, str) and not is_unknown(tags_arg):
        try:
            tags_arg = json.loads(tags_arg)
        except ValueError:
            return False
    tags = _map(_map(tags_arg).get("tags"))
    return tags.get(LIFECYCLE_TAG) == PRODUCTION


def stack_context(
    resources: Sequence[Mapping],
    *,
    stack_tags: Optional[Mapping[str, str]] = None,
    config: Optional[Mapping[str, Any]] = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The context of a whole stack: production from its AWS providers' default tags
    (or a `lifecycle: production` stack tag), options from the policy config."""
    context = dict(CONTEXT_DEFAULTS)
    context["production"] = any(
        production_from_provider(_map(r.get("inputs"))) for r in resources if str(r.get("type", "")).startswith(AWS_PROVIDER)
    ) or _map(stack_tags).get(LIFECYCLE_TAG) == PRODUCTION
    context.update(config_context(config))
    context.update(overrides)
    return context


def config_context(config: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Context keys from a policy's config (`allowInternetFacing`, ...)."""
    return {CONFIG_KEYS[k]: v for k, v in _map(config).items() if k in CONFIG_KEYS and v is not None}


# --- 1. TP never spans nodes ---------------------------------------------------------------


def _command_tokens(container: Mapping) -> list[str]:
    """The words of a container's command and args; a shell script is split line by line."""
    tokens: list[str] = []
    for item in [*_list(container.get("command")), *_list(container.get("args"))]:
        if not isinstance(item, str):
            continue
        if any(c.isspace() for c in item):
            for line in item.splitlines():
                try:
                    tokens.extend(shlex.split(line, comments=True))
                except ValueError:  # unbalanced quotes in a line of a heredoc
                    tokens.extend(line.split())
        else:
            tokens.append(item)
    return tokens


def tensor_parallel_size(tokens: Sequence[str]) -> Optional[int]:
    """`--tensor-parallel-size N` (or `=N`, or `-tp N`) of a `vllm serve` command; 1 when absent; None if no `vllm serve`."""
    serves = any(a == "vllm" and b == "serve" for a, b in zip(tokens, tokens[1:]))
    if not serves:
        return None
    tp = 1
    for i, tok in enumerate(tokens):
        value = None
        if tok in ("--tensor-parallel-size", "-tp") and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif tok.startswith("--tensor-parallel-size="):
            value = tok.split("=", 1)[1]
        if value is not None:
            try:
                tp = int(value)
            except ValueError:
                continue
    return tp


def check_tp_within_node(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """Every RayCluster's head `vllm serve --tensor-parallel-size` fits in one pod's GPUs."""
    out: list[tuple[str, str]] = []
    per_node = context.get("gpus_per_node")
    for r in resources:
        spec = raycluster_spec(str(r.get("type", "")), _map(r.get("inputs")))
        if spec is None or is_unknown(spec):
            continue
        templates = ray_pod_templates(spec)
        head_spec = _map(templates[0][1].get("spec"))
        tokens = [t for c in _list(head_spec.get("containers")) for t in _command_tokens(_map(c))]
        if any(is_unknown(t) for t in tokens):
            continue
        tp = tensor_parallel_size(tokens)
        if tp is None or tp <= 1:
            continue
        gpu_pods = [(where, pod_gpus(_map(t.get("spec")))) for where, t in templates]
        if any(n is None for _, n in gpu_pods):
            continue
        with_gpus = [(where, n) for where, n in gpu_pods if n]
        if not with_gpus:
            out.append((r.get("urn", ""), f"vllm serve --tensor-parallel-size {tp}, but no pod of the RayCluster requests {GPU}: tensor parallelism would have no GPUs to run on"))
        for where, n in with_gpus:
            if tp > n:
                out.append(
                    (
                        r.get("urn", ""),
                        f"vllm serve --tensor-parallel-size {tp} is more than the {n} GPUs the {where} requests ({GPU} limit): "
                        "tensor parallelism would span nodes (all-reduce over the network instead of NVLink); "
                        "keep TP within a node's GPUs and split across nodes with pipeline parallelism",
                    )
                )
        if isinstance(per_node, int) and per_node > 0 and tp > per_node:
            out.append(
                (
                    r.get("urn", ""),
                    f"vllm serve --tensor-parallel-size {tp} is more than the {per_node} GPUs of one GPU node: "
                    "tensor parallelism would span nodes",
                )
            )
    return out


# --- 2. EFA security group self-referencing ------------------------------------------------


def _all_protocols(value: Any) -> bool:
    return str(value).strip().lower() in ALL_PROTOCOLS


def _efa_templates(resources: Sequence[Mapping]) -> list[Mapping]:
    out = []
    for r in resources:
        if r.get("type") != LAUNCH_TEMPLATE:
            continue
        nics = _list(_map(r.get("inputs")).get("networkInterfaces"))
        if any(_map(n).get("interfaceType") in EFA_INTERFACE_TYPES for n in nics):
            out.append(r)
    return out


def _template_security_groups(template: Mapping, groups: Sequence[Mapping]) -> list[Mapping]:
    """The stack's security groups on a launch template's EFA interfaces."""
    found = []
    nics = [_map(n) for n in _list(_map(template.get("inputs")).get("networkInterfaces"))]
    efa_nics = [n for n in nics if n.get("interfaceType") in EFA_INTERFACE_TYPES]
    for sg in groups:
        refs = [ref for n in efa_nics for ref in ([n["securityGroups"]] if is_unknown(n.get("securityGroups")) else _list(n.get("securityGroups")))]
        if any(same_resource(template, "networkInterfaces", ref, sg) for ref in refs):
            found.append(sg)
    return found


def self_referencing_directions(sg: Mapping, resources: Sequence[Mapping]) -> set[str]:
    """Which of "ingress"/"egress" allow all traffic between members of `sg`.

    Counts standalone rules (aws.vpc.SecurityGroupIngressRule/EgressRule with
    ipProtocol -1 and referencedSecurityGroupId = the group; aws.ec2.SecurityGroupRule
    with protocol -1 and self or sourceSecurityGroupId = the group) and inline
    `ingress`/`egress` blocks with protocol -1 and `self: true`.
    """
    found: set[str] = set()
    inline = _map(sg.get("inputs"))
    for direction in ("ingress", "egress"):
        for block in _list(inline.get(direction)):
            block = _map(block)
            if _all_protocols(block.get("protocol")) and _truthy(block.get("self")):
                found.add(direction)
    for r in resources:
        typ, props = r.get("type"), _map(r.get("inputs"))
        if typ in (SG_INGRESS, SG_EGRESS):
            direction = "ingress" if typ == SG_INGRESS else "egress"
            if (
                _all_protocols(props.get("ipProtocol"))
                and same_resource(r, "securityGroupId", props.get("securityGroupId"), sg)
                and same_resource(r, "referencedSecurityGroupId", props.get("referencedSecurityGroupId"), sg)
            ):
                found.add(direction)
        elif typ == SG_RULE:
            direction = str(props.get("type", ""))
            if direction not in ("ingress", "egress") or not _all_protocols(props.get("protocol")):
                continue
            if not same_resource(r, "securityGroupId", props.get("securityGroupId"), sg):
                continue
            if _truthy(props.get("self")) or same_resource(r, "sourceSecurityGroupId", props.get("sourceSecurityGroupId"), sg):
                found.add(direction)
    return found


def check_efa_security_group(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """Every EFA launch template has a security group (of this stack) that allows all traffic to and from itself."""
    out: list[tuple[str, str]] = []
    groups = [r for r in resources if r.get("type") == SECURITY_GROUP]
    for template in _efa_templates(resources):
        candidates = _template_security_groups(template, groups)
        if not candidates:
            out.append(
                (
                    template.get("urn", ""),
                    "the EFA interfaces are in no security group of this stack: EFA needs a group that allows all "
                    "traffic to and from itself (ingress and egress, protocol -1, referencing the group)",
                )
            )
            continue
        missing = {sg.get("name"): {"ingress", "egress"} - self_referencing_directions(sg, resources) for sg in candidates}
        if any(not m for m in missing.values()):
            continue
        detail = "; ".join(
            f"{name} lacks {' and '.join(f'an {d} rule' for d in sorted(m))} with protocol -1 referencing itself"
            for name, m in sorted(missing.items(), key=lambda kv: str(kv[0]))
        )
        out.append(
            (
                template.get("urn", ""),
                f"no security group on the EFA interfaces allows all traffic to and from itself ({detail}): "
                "EFA's OS-bypass traffic is only allowed by such self-referencing rules, without them NCCL falls back or hangs",
            )
        )
    return out


# --- 3. IMDSv2 -------------------------------------------------------------------------------


def check_imdsv2(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """Launch templates (and instances) require IMDSv2 tokens."""
    if resource_type not in (LAUNCH_TEMPLATE, INSTANCE):
        return []
    meta = props.get("metadataOptions")
    if is_unknown(meta):
        return []
    meta = _map(meta)
    tokens, endpoint = meta.get("httpTokens"), meta.get("httpEndpoint")
    if is_unknown(tokens) or endpoint == "disabled":
        return []
    if tokens == "required":
        return []
    shown = "not set" if tokens is None else f"{tokens!r}"
    return [
        f"metadataOptions.httpTokens is {shown}: IMDSv1 lets any process or SSRF on the node read the node role's "
        'credentials; set metadataOptions.httpTokens to "required" (IMDSv2 only)'
    ]


# --- 4. Encryption at rest ----------------------------------------------------------------------


def _kms_missing(props: Mapping, key: str, context: Mapping) -> bool:
    return bool(context.get("require_customer_managed_keys")) and not props.get(key)


def check_encryption(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """EBS (launch template devices, volumes, instances), EFS and FSx are encrypted at rest.

    FSx for Lustre is always encrypted at rest (FSx API, CreateFileSystem
    KmsKeyId: SCRATCH_1/SCRATCH_2 with the FSx service key, PERSISTENT_1/2 with
    `kmsKeyId` or the FSx-managed key when none is given) and has no switch to
    turn it off, so it passes unless customer-managed keys are required: then it
    must be a PERSISTENT deployment (scratch types cannot take a key) with a
    `kmsKeyId`. The same requirement asks EBS and EFS for a `kmsKeyId`.
    """
    out: list[str] = []
    if resource_type == LAUNCH_TEMPLATE:
        for m in _list(props.get("blockDeviceMappings")):
            m = _map(m)
            ebs = m.get("ebs")
            if not isinstance(ebs, Mapping):
                continue
            device = m.get("deviceName", "?")
            enc = _truthy(ebs.get("encrypted"))
            if enc is False or (enc is None and not is_unknown(ebs.get("encrypted"))):
                out.append(f"block device {device}: EBS volume not encrypted (blockDeviceMappings[].ebs.encrypted must be \"true\")")
            elif _kms_missing(ebs, "kmsKeyId", context):
                out.append(f"block device {device}: no kmsKeyId, and customer-managed keys are required")
    elif resource_type == INSTANCE:
        # An instance launched from a template without a root device of its own gets the template's
        # block device mappings (EC2 RunInstances: the request's settings override the template's),
        # which this rule checks on the template.
        from_template = isinstance(props.get("launchTemplate"), Mapping) and props.get("rootBlockDevice") is None
        devices = [] if from_template else [("root block device", props.get("rootBlockDevice"))]
        devices += [
            (f"EBS device {_map(d).get('deviceName', '?')}", d) for d in _list(props.get("ebsBlockDevices"))
        ]
        for label, dev in devices:
            if not isinstance(dev, Mapping) and label != "root block device":
                continue
            dev = _map(dev)
            if is_unknown(dev.get("encrypted")):
                continue
            if not _truthy(dev.get("encrypted")):
                out.append(f"{label}: EBS volume not encrypted (set encrypted: true)")
            elif _kms_missing(dev, "kmsKeyId", context):
                out.append(f"{label}: no kmsKeyId, and customer-managed keys are required")
    elif resource_type == EBS_VOLUME:
        if not is_unknown(props.get("encrypted")):
            if not _truthy(props.get("encrypted")):
                out.append("EBS volume not encrypted (set encrypted: true)")
            elif _kms_missing(props, "kmsKeyId", context):
                out.append("EBS volume has no kmsKeyId, and customer-managed keys are required")
    elif resource_type == EFS:
        if not is_unknown(props.get("encrypted")):
            if not _truthy(props.get("encrypted")):
                out.append("EFS file system not encrypted at rest (set encrypted: true; it cannot be changed after creation)")
            elif _kms_missing(props, "kmsKeyId", context):
                out.append("EFS file system has no kmsKeyId, and customer-managed keys are required")
    elif resource_type == FSX_LUSTRE:
        if context.get("require_customer_managed_keys"):
            deployment = str(props.get("deploymentType") or "SCRATCH_1")
            if not is_unknown(deployment) and deployment.startswith("SCRATCH"):
                out.append(f"FSx for Lustre {deployment} is encrypted with the FSx service key only; customer-managed keys need a PERSISTENT_1/PERSISTENT_2 deployment with kmsKeyId")
            elif not props.get("kmsKeyId"):
                out.append("FSx for Lustre file system has no kmsKeyId (it would use the FSx-managed key), and customer-managed keys are required")
    return out


# --- 5. EKS control plane -------------------------------------------------------------------------


def _open_cidr(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def check_eks_cluster(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """EKS: secrets envelope-encrypted with KMS, audit logs on, API endpoint not open to the internet."""
    if resource_type != EKS_CLUSTER:
        return []
    out: list[str] = []
    enc = props.get("encryptionConfig")
    if not is_unknown(enc):
        configs = [_map(e) for e in (_list(enc) if not isinstance(enc, Mapping) else [enc])]
        resources = [r for c in configs for r in _list(c.get("resources"))]
        if not any(is_unknown(r) for r in resources) and "secrets" not in resources:
            out.append('Kubernetes secrets are not envelope-encrypted: set encryptionConfig.resources to ["secrets"] with a KMS key')
    logs = props.get("enabledClusterLogTypes")
    if not is_unknown(logs) and "audit" not in _list(logs):
        out.append('control-plane audit logs are off: add "audit" to enabledClusterLogTypes')
    vpc = props.get("vpcConfig")
    if not is_unknown(vpc):
        vpc = _map(vpc)
        public = vpc.get("endpointPublicAccess")
        cidrs = vpc.get("publicAccessCidrs")
        # The EKS API's defaults: public access on, and from 0.0.0.0/0 when no CIDRs are given.
        is_public = True if public is None else _truthy(public)
        if is_public and not is_unknown(cidrs):
            given = [c for c in _list(cidrs) if not is_unknown(c)]
            effective = given or ["0.0.0.0/0"]
            open_ = [c for c in effective if _open_cidr(c)]
            if open_:
                why = f"publicAccessCidrs has {', '.join(map(str, open_))}" if given else "no publicAccessCidrs, which EKS reads as 0.0.0.0/0"
                out.append(
                    f"the cluster API endpoint is public and open to the internet ({why}): "
                    "set endpointPublicAccess false (private endpoint), or list the CIDRs that may reach it"
                )
    return out


# --- 6. Production weight storage protected ---------------------------------------------------------


def _is_file_system(resource_type: str) -> bool:
    return resource_type == EFS or (resource_type.startswith("aws:fsx/") and resource_type.endswith("FileSystem"))


def check_production_storage_protected(resources: Sequence[Mapping], context: Mapping) -> list[tuple[str, str]]:
    """In production, the weights' file system is protected and retained on delete, and its PersistentVolumes
    keep it when they go (reclaim policy Retain).

    A volume and its claim hold no data, so they need no protection of their own (components/storage.py,
    "Reclaim policy"): the access points replace them on a running stack. What decides whether deleting one
    touches the weights is its reclaim policy: `Delete` would have the EFS CSI driver delete its access point
    (and, with delete-access-point-root-dir, the access point's root directory, `/`: every weight) and the
    FSx CSI driver the whole file system.
    """
    if not context.get("production"):
        return []
    out: list[tuple[str, str]] = []
    for r in resources:
        typ = str(r.get("type", ""))
        if _is_file_system(typ):
            opts = _map(r.get("options"))
            missing = []
            if opts.get("protect") is not True:
                missing.append("protect")
            if opts.get("retain_on_delete") is False:  # None: not visible to the caller (CrossGuard)
                missing.append("retain_on_delete")
            if missing:
                out.append(
                    (
                        r.get("urn", ""),
                        f"production stack: the model weights' file system {r.get('name')} lacks {' and '.join(missing)}: "
                        "a destroy or a replacement would delete the weights (hours to stage again); "
                        "set gpu-serving:lifecycle.production, which protects and retains it",
                    )
                )
        elif typ == PERSISTENT_VOLUME:
            spec = _map(r.get("inputs")).get("spec")
            if is_unknown(spec) or is_unknown(_map(spec).get("persistentVolumeReclaimPolicy")):
                continue
            policy = _map(spec).get("persistentVolumeReclaimPolicy")
            if policy != "Retain":
                out.append(
                    (
                        r.get("urn", ""),
                        f"production stack: the model weights' PersistentVolume {r.get('name')} has reclaim policy "
                        f"{policy or 'unset (Retain only for a static volume; say it)'}, not Retain: deleting it or its claim "
                        "would have the CSI driver delete the access point's directory or the file system",
                    )
                )
    return out


# --- 8. No internet-facing load balancer -------------------------------------------------------------------


def _service_is_internal(annotations: Mapping) -> bool:
    scheme = str(annotations.get(LB_SCHEME, "")).strip().lower()
    internal = str(annotations.get(LB_INTERNAL, "")).strip().lower()
    says_internal = scheme == "internal" or internal == "true"
    says_public = scheme == "internet-facing" or internal == "false"
    return says_internal and not says_public


def check_no_internet_facing_lb(resource_type: str, props: Mapping, options: Mapping, context: Mapping) -> list[str]:
    """No internet-facing load balancer (Service, Ingress, or AWS load balancer) unless the context allows one."""
    if context.get("allow_internet_facing"):
        return []
    annotations = _map(_map(props.get("metadata")).get("annotations"))
    if resource_type == SERVICE:
        svc_type = _map(props.get("spec")).get("type")
        if svc_type != "LoadBalancer" or any(is_unknown(v) for v in annotations.values()):
            return []
        if not _service_is_internal(annotations):
            return [
                "a Service of type LoadBalancer without the internal annotations gets an internet-facing load balancer: "
                f'annotate {LB_SCHEME}: "internal" (or {LB_INTERNAL}: "true"), or use type ClusterIP '
                "(this stack's config does not allow internet-facing endpoints)"
            ]
    elif resource_type in INGRESS_TYPES:
        if str(annotations.get(ALB_SCHEME, "")).strip().lower() == "internet-facing":
            return [f'an Ingress with {ALB_SCHEME}: internet-facing gets an internet-facing ALB: use "internal" (this stack does not allow internet-facing endpoints)']
    elif resource_type in AWS_LOAD_BALANCERS:
        internal = props.get("internal")
        if not is_unknown(internal) and not _truthy(internal):
            return ["the load balancer is internet-facing (internal is not true): set internal: true (this stack does not allow internet-facing endpoints)"]
    return []


# --- the rule set ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One policy: a name (the CrossGuard policy name), a one-line description, an enforcement level, and a resource or stack check."""

    name: str
    description: str
    enforcement: str
    check: Callable[..., list]
    scope: str  # "resource" or "stack"
    config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # CrossGuard config schema properties

    def __post_init__(self) -> None:
        if self.scope not in ("resource", "stack"):
            raise ValueError(f"rule {self.name}: scope must be 'resource' or 'stack'")
        if self.enforcement not in (MANDATORY, ADVISORY):
            raise ValueError(f"rule {self.name}: enforcement must be {MANDATORY!r} or {ADVISORY!r}")


RULES: tuple[Rule, ...] = (
    Rule(
        "tp-within-node",
        "vLLM's tensor parallelism never spans nodes: the RayCluster head's --tensor-parallel-size is at most the GPUs each pod requests.",
        MANDATORY,
        check_tp_within_node,
        "stack",
        {"gpusPerNode": {"type": "integer", "minimum": 1, "description": "GPUs of one GPU node (optional)."}},
    ),
    Rule(
        "efa-security-group-self-referencing",
        "Every EFA launch template's security group allows all traffic (protocol -1) to and from itself, ingress and egress.",
        MANDATORY,
        check_efa_security_group,
        "stack",
    ),
    Rule(
        "imdsv2-required",
        "Launch templates require IMDSv2 (metadataOptions.httpTokens = required).",
        MANDATORY,
        check_imdsv2,
        "resource",
    ),
    Rule(
        "storage-encrypted",
        "EBS volumes (launch template devices, volumes, instances), EFS and FSx file systems are encrypted at rest.",
        MANDATORY,
        check_encryption,
        "resource",
        {"requireCustomerManagedKeys": {"type": "boolean", "default": False, "description": "Require a kmsKeyId of our own."}},
    ),
    Rule(
        "eks-secrets-audit-private-endpoint",
        "EKS clusters encrypt secrets with KMS, send audit logs, and do not open the API endpoint to 0.0.0.0/0.",
        MANDATORY,
        check_eks_cluster,
        "resource",
    ),
    Rule(
        "production-weights-protected",
        "In a production stack the model weights' EFS/FSx file system is protected and retained on delete, and its PersistentVolumes have reclaim policy Retain.",
        MANDATORY,
        check_production_storage_protected,
        "stack",
    ),
    Rule(
        "serving-pods-shm-limits-unprivileged",
        "Serving pods (RayCluster templates, GPU Jobs) mount a memory-backed /dev/shm, set cpu/memory/GPU limits and are not privileged: no added capability, no host path, not root.",
        MANDATORY,
        check_serving_pods,
        "resource",
    ),
    Rule(
        "pods-least-privilege",
        "Every pod template mounts no service-account token and uses the RuntimeDefault seccomp profile; every container forbids "
        "privilege escalation, drops ALL capabilities (adding back only CHOWN in init containers) and has a read-only root.",
        MANDATORY,
        check_pods_least_privilege,
        "resource",
    ),
    Rule(
        "root-init-only-on-fsx",
        "An init container that runs as root or adds CHOWN appears only in a pod whose claim is an FSx for Lustre volume "
        "(no access points there); on EFS the staging access point hands the directory over.",
        MANDATORY,
        check_root_init_only_on_fsx,
        "stack",
    ),
    Rule(
        "namespace-pod-security",
        "A namespace the stack creates and runs pods in enforces Pod Security admission at the strictest level all of its pods pass, and at least baseline.",
        MANDATORY,
        check_namespace_pod_security,
        "stack",
    ),
    Rule(
        "network-policies-isolate-ray",
        "Every namespace the stack runs pods in has a default-deny NetworkPolicy, and each RayCluster's GCS, dashboard and client "
        "ports admit only the RayCluster's own pods.",
        MANDATORY,
        check_network_policies,
        "stack",
    ),
    Rule(
        "api-admits-only-its-clients",
        "A Service in front of a RayCluster's head admits only the clients it names: as a LoadBalancer with externalTrafficPolicy "
        "Local and loadBalancerSourceRanges; no pod of another namespace, and no address outside those ranges, reaches its port.",
        MANDATORY,
        check_api_clients,
        "stack",
    ),
    Rule(
        "no-internet-facing-load-balancer",
        "No internet-facing load balancer: LoadBalancer Services carry the internal annotations unless the config allows internet-facing.",
        MANDATORY,
        check_no_internet_facing_lb,
        "resource",
        {"allowInternetFacing": {"type": "boolean", "default": False, "description": "Allow internet-facing load balancers."}},
    ),
) + tuple(Rule(**spec) for spec in aws_rules.RULES)  # the AWS hardening rules (policies/aws_rules.py)


def rule(name: str) -> Rule:
    return {r.name: r for r in RULES}[name]
