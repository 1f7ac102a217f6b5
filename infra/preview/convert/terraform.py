"""The `aws:*` resources of a synth document as a Terraform plan (`terraform show -json`).

pulumi-aws is the bridged Terraform AWS provider: every `aws:*` resource is a
Terraform resource under a Pulumi name, and its inputs are that resource's
arguments in camelCase. `plan(doc)` undoes the bridge's renaming, so a scanner
that reads Terraform plans (checkov's `terraform_plan` framework) sees the stack:

- type: the Pulumi type token's Terraform type from `TYPES` (`aws:ec2/vpc:Vpc`
  is `aws_vpc`). The table is explicit: a token missing from it is a gap, not a
  guess. Its address is `<type>.<synth resource name>` (characters Terraform
  does not allow in a name become `_`).
- attributes: camelCase to snake_case (`enableDnsHostnames` ->
  `enable_dns_hostnames`), except the names the bridge pluralised or changed,
  listed per type (`encryptionConfigurations` -> `encryption_configuration`).
  Map-typed arguments (`tags`, a node group's `labels`) keep their keys.
- nested objects: a Terraform block is a list of objects in a plan, so an
  object the bridge flattened (a block of at most one) becomes a list of one;
  so does a plain value the bridge made of a list of at most one (`lists`).
- `tags_all`: the resource's `tags` over its provider's default tags (the
  `pulumi:providers:aws` resource the synth records as its provider), as the
  provider computes it, for every type that has tags.
- references: a value only the cloud knows is a placeholder in the synth
  (`<id:NAME>`, `<arn:NAME>`, `<key-id:NAME>`, `<cluster-sg:NAME>`: the
  recording engine's answer for that output of resource NAME). Terraform leaves
  such a value out of `planned_values` and names what it comes from in the
  configuration's `expressions` (`"vpc_id": {"references": ["aws_vpc.X.id",
  "aws_vpc.X"]}`); so does `plan`, and checkov's graph checks connect the two
  resources through it (a flow log to its VPC, a security group to the network
  interfaces that use it): checkov pairs each planned resource with the
  configuration resource of the same type and name and sets an attribute the
  plan's `values` lack to its first reference (checkov/terraform/plan_parser.py,
  `parse_tf_plan` and `_add_references`). `<computed>` values and secrets are
  left out, with no reference.

- instances launched from a launch template: EC2 takes what the RunInstances
  request leaves out from the template (EC2 User Guide, "Launch an instance
  from a launch template": a parameter given in the request overrides the
  template's). Terraform plans those attributes of an `aws_instance` as
  unknown, and checkov's instance checks read the instance alone, so an
  instance whose template is in the plan gets the template's effective values
  for what it leaves unset (`_launched_from_templates`): instance profile,
  security groups, instance type, detailed monitoring, EBS optimisation and
  the EBS volumes (the mapping of a root device name is the root volume).

Gaps (`Plan.gaps`): a token missing from `TYPES`, a placeholder naming no
resource of the document, and a placeholder naming two resources (Pulumi lets
resources of different types share a name, a placeholder names only the name:
the reference would be a guess, so the scan fails instead). Values the recording engine answers with a concrete
value instead of a placeholder (a role's or cluster's `name`, a repository's
URL) stay literal values: they do not become references.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from infra.preview.convert import Gap
from infra.preview.markers import COMPUTED, is_secret, parse_placeholder

PROVIDER = "registry.terraform.io/hashicorp/aws"
PROVIDER_TYPE = "pulumi:providers:aws"
# checkov reads a JSON file as a plan only when it has `terraform_version` and `planned_values`
# (checkov 3.3.30: checkov/terraform/plan_utils.py, checkov/terraform/context_parsers/tf_plan/__init__.py).
TERRAFORM_VERSION = "1.9.8"
# Terraform's plan JSON format version (hashicorp/terraform, internal/command/jsonplan/plan.go, FormatVersion).
FORMAT_VERSION = "1.2"



@dataclass(frozen=True)
class TerraformType:
    """A Terraform resource type, and how the bridge renamed its arguments."""

    name: str
    # Has `tags` and the computed `tags_all` (the provider's default tags merged in).
    taggable: bool = True
    # Pulumi property path (dotted camelCase names, list items not marked) -> Terraform name,
    # where it is not the snake_case of the Pulumi name.
    renames: Mapping[str, str] = field(default_factory=dict)
    # Property paths whose values are maps (keys are data, not attribute names), besides `tags`.
    maps: frozenset[str] = frozenset()
    # Property paths of Terraform lists of at most one value that the bridge made a plain value.
    lists: frozenset[str] = frozenset()


# Every aws:* type the stack's components declare (prod and test, and the options they
# switch on: FSx for Lustre, EKS access entries). pulumi-aws names a resource
# `aws:<module>/<camelName>:<Name>`; its Terraform type is `aws_<module>_<snake_name>`,
# except in the ec2 module (and a few others) where Terraform has no module prefix.
TYPES: dict[str, TerraformType] = {
    # gpu-serving:monitoring.mode amp (components/monitoring.py): the Terraform provider's aws_prometheus_* and aws_sns_*.
    "aws:amp/alertManagerDefinition:AlertManagerDefinition": TerraformType("aws_prometheus_alert_manager_definition", taggable=False),
    "aws:amp/ruleGroupNamespace:RuleGroupNamespace": TerraformType("aws_prometheus_rule_group_namespace"),
    "aws:amp/workspace:Workspace": TerraformType("aws_prometheus_workspace"),
    "aws:amp/workspaceConfiguration:WorkspaceConfiguration": TerraformType("aws_prometheus_workspace_configuration", taggable=False),
    "aws:cloudwatch/logGroup:LogGroup": TerraformType("aws_cloudwatch_log_group"),
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": TerraformType("aws_default_security_group"),
    "aws:ec2/eip:Eip": TerraformType("aws_eip"),
    "aws:ec2/flowLog:FlowLog": TerraformType("aws_flow_log"),
    "aws:ec2/instance:Instance": TerraformType("aws_instance"),
    "aws:ec2/internetGateway:InternetGateway": TerraformType("aws_internet_gateway"),
    "aws:ec2/launchTemplate:LaunchTemplate": TerraformType(
        "aws_launch_template",
        # blockDeviceMappings, networkInterfaces, tagSpecifications: plural in Terraform too.
        renames={"licenseSpecifications": "license_specification"},
    ),
    "aws:ec2/natGateway:NatGateway": TerraformType("aws_nat_gateway"),
    "aws:ec2/placementGroup:PlacementGroup": TerraformType("aws_placement_group"),
    "aws:ec2/route:Route": TerraformType("aws_route", taggable=False),
    "aws:ec2/routeTable:RouteTable": TerraformType("aws_route_table"),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": TerraformType("aws_route_table_association", taggable=False),
    "aws:ec2/securityGroup:SecurityGroup": TerraformType("aws_security_group"),
    "aws:ec2/subnet:Subnet": TerraformType("aws_subnet"),
    "aws:ec2/vpc:Vpc": TerraformType("aws_vpc"),
    "aws:ec2/vpcEndpoint:VpcEndpoint": TerraformType("aws_vpc_endpoint"),
    "aws:ecr/repository:Repository": TerraformType(
        "aws_ecr_repository",
        renames={
            "encryptionConfigurations": "encryption_configuration",
            "imageTagMutabilityExclusionFilters": "image_tag_mutability_exclusion_filter",
        },
    ),
    "aws:efs/accessPoint:AccessPoint": TerraformType("aws_efs_access_point"),
    "aws:efs/fileSystem:FileSystem": TerraformType("aws_efs_file_system", renames={"lifecyclePolicies": "lifecycle_policy"}),
    "aws:efs/fileSystemPolicy:FileSystemPolicy": TerraformType("aws_efs_file_system_policy", taggable=False),
    "aws:efs/mountTarget:MountTarget": TerraformType("aws_efs_mount_target", taggable=False),
    "aws:eks/accessEntry:AccessEntry": TerraformType("aws_eks_access_entry"),
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": TerraformType("aws_eks_access_policy_association", taggable=False),
    "aws:eks/addon:Addon": TerraformType("aws_eks_addon", renames={"podIdentityAssociations": "pod_identity_association"}),
    "aws:eks/cluster:Cluster": TerraformType(
        "aws_eks_cluster",
        renames={"identities": "identity", "identities.oidcs": "oidc"},
    ),
    "aws:eks/nodeGroup:NodeGroup": TerraformType("aws_eks_node_group", renames={"taints": "taint"}, maps=frozenset({"labels"})),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": TerraformType("aws_eks_pod_identity_association"),
    "aws:fsx/lustreFileSystem:LustreFileSystem": TerraformType("aws_fsx_lustre_file_system", lists=frozenset({"subnetIds"})),
    "aws:iam/instanceProfile:InstanceProfile": TerraformType("aws_iam_instance_profile"),
    "aws:iam/role:Role": TerraformType("aws_iam_role", renames={"inlinePolicies": "inline_policy"}),
    "aws:iam/rolePolicy:RolePolicy": TerraformType("aws_iam_role_policy", taggable=False),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": TerraformType("aws_iam_role_policy_attachment", taggable=False),
    "aws:kms/alias:Alias": TerraformType("aws_kms_alias", taggable=False),
    "aws:kms/key:Key": TerraformType("aws_kms_key"),
    "aws:sns/topic:Topic": TerraformType("aws_sns_topic"),
    "aws:sns/topicPolicy:TopicPolicy": TerraformType("aws_sns_topic_policy", taggable=False),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": TerraformType("aws_vpc_security_group_egress_rule"),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": TerraformType("aws_vpc_security_group_ingress_rule"),
}

# What each placeholder kind of the recording engine (infra/preview/recording.py) stands for:
# the Terraform attribute of the resource it names.
PLACEHOLDER_ATTRIBUTES: dict[str, str] = {
    "id": "id",
    "arn": "arn",
    "key-id": "key_id",
    "cluster-sg": "vpc_config[0].cluster_security_group_id",
    "endpoint": "endpoint",
    "ca-data": "certificate_authority[0].data",
    "oidc": "identity[0].oidc[0].issuer",
    "fsx": "dns_name",
    "allocation-id": "allocation_id",
}


def snake(name: str) -> str:
    """A Pulumi property name as the Terraform attribute it came from (`vpcId` -> `vpc_id`)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def address_name(name: str) -> str:
    """A synth resource name as a Terraform resource name (letters, digits, `_` and `-`; not starting with a digit)."""
    out = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    return out if re.match(r"[A-Za-z_]", out) else f"_{out}"


class _Unknown:
    """A value Terraform does not know at plan time: left out of `planned_values`."""


UNKNOWN = _Unknown()


@dataclass
class Plan:
    """The plan document and what did not convert."""

    document: dict[str, Any]
    gaps: list[Gap]
    addresses: dict[str, str]  # synth URN -> Terraform address

    @property
    def resources(self) -> list[dict[str, Any]]:
        return self.document["planned_values"]["root_module"]["resources"]


class _Converter:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.gaps: list[Gap] = []
        self.addresses: dict[str, str] = {}
        self.by_name: dict[str, str] = {}  # synth name of an aws resource -> its Terraform address
        # Names more than one aws resource has: a placeholder naming one of them cannot say which.
        self.ambiguous: dict[str, list[str]] = {}
        taken: set[str] = set()
        for r in doc.get("resources", []):
            spec = TYPES.get(r.get("type", ""))
            if spec is None or not r.get("custom", True):
                continue
            base = f"{spec.name}.{address_name(r['name'])}"
            address, n = base, 1
            while address in taken:
                n += 1
                address = f"{base}_{n}"
            taken.add(address)
            self.addresses[r["urn"]] = address
            if r["name"] in self.by_name:
                self.ambiguous.setdefault(r["name"], [self.by_name[r["name"]]]).append(address)
            self.by_name.setdefault(r["name"], address)
        self.current = ("", "")

    def reference(self, value: str) -> list[str] | None:
        found = parse_placeholder(value)
        if found is None:
            return None
        kind, name = found
        if name in self.ambiguous:
            self.gaps.append(
                Gap(
                    self.current[0],
                    self.current[1],
                    f"{value}: {', '.join(self.ambiguous[name])} share the name {name!r}, so the reference cannot say which; "
                    "give them distinct resource names",
                    blocking=True,
                )
            )
            return []
        address = self.by_name.get(name)
        attribute = PLACEHOLDER_ATTRIBUTES.get(kind)
        if address is None or attribute is None:
            self.gaps.append(Gap(self.current[0], self.current[1], f"{value}: names no AWS resource of the stack; left out, no reference"))
            return []
        return [f"{address}.{attribute}", address]

    def value(self, v: Any, path: str, spec: TerraformType) -> tuple[Any, Any]:
        """(planned value or UNKNOWN, configuration expression or None)."""
        if v is None:
            return None, None
        if isinstance(v, str):
            if v == COMPUTED:
                return UNKNOWN, None
            refs = self.reference(v)
            if refs is None:
                return v, None
            return UNKNOWN, ({"references": refs} if refs else None)
        if is_secret(v):
            return UNKNOWN, None
        if isinstance(v, dict):
            values, exprs = self.block(v, path, spec)
            return [values], ([exprs] if exprs else None)
        if isinstance(v, list):
            if any(isinstance(x, dict) and not is_secret(x) for x in v):
                pairs = [self.block(x, path, spec) if isinstance(x, dict) else (x, {}) for x in v]
                exprs = [e for _, e in pairs]
                return [p for p, _ in pairs], (exprs if any(exprs) else None)
            items, refs = [], []
            for x in v:
                item, expr = self.value(x, path, spec)
                items.append(None if item is UNKNOWN else item)
                if expr:
                    refs += expr["references"]
            if items and all(i is None for i in items) and any(x is not None for x in v):
                return UNKNOWN, ({"references": refs} if refs else None)
            return items, ({"references": refs} if refs else None)
        return v, None

    def block(self, obj: dict[str, Any], path: str, spec: TerraformType) -> tuple[dict[str, Any], dict[str, Any]]:
        values: dict[str, Any] = {}
        exprs: dict[str, Any] = {}
        for key in sorted(obj):
            v = obj[key]
            p = f"{path}.{key}" if path else key
            name = spec.renames.get(p) or snake(key)
            if key in ("tags", "tagsAll") or p in spec.maps:
                if isinstance(v, dict):
                    values[name] = {str(k): x for k, x in v.items() if not is_secret(x) and x != COMPUTED}
                continue
            if p in spec.lists and not isinstance(v, list):
                v = [v]
            value, expr = self.value(v, p, spec)
            if value is not UNKNOWN:
                values[name] = value
            if expr:
                exprs[name] = expr
        return values, exprs


def default_tags(provider: dict[str, Any] | None) -> dict[str, str]:
    """The default tags of a `pulumi:providers:aws` resource (its `defaultTags` input is JSON)."""
    if not provider:
        return {}
    raw = (provider.get("inputs") or {}).get("defaultTags")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return {}
    tags = raw.get("tags") if isinstance(raw, dict) else None
    return {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {}


# The root device names of EC2's Linux AMIs (EC2 User Guide, "Device names for volumes on Amazon EC2
# instances": /dev/xvda on Amazon Linux, /dev/sda1 on most others). A launch template's mapping of one of
# them sets the root volume; the AMI's own root device name is not known offline.
ROOT_DEVICE_NAMES = ("/dev/xvda", "/dev/sda1")
# The `aws_instance` attributes `_launched_from_templates` may take from the instance's launch template: what
# checkov's instance checks read (checkov/terraform/checks/resource/aws/: EC2EBSOptimized.py, CKV_AWS_135,
# `ebs_optimized`; EC2DetailedMonitoringEnabled.py, CKV_AWS_126, `monitoring`; LaunchConfigurationEBSEncryption.py,
# CKV_AWS_8, `root_block_device` and `ebs_block_device`; checkov/terraform/checks/graph_checks/aws/:
# EC2InstanceHasIAMRoleAttached.json, CKV2_AWS_41, `iam_instance_profile`; SGAttachedToResource.json, CKV2_AWS_5,
# `vpc_security_group_ids`), and the instance type.
TEMPLATE_ATTRIBUTES = (
    "instance_type", "vpc_security_group_ids", "ebs_optimized", "monitoring", "iam_instance_profile",
    "root_block_device", "ebs_block_device",
)  # fmt: skip
# Launch template EBS fields that are strings in the template and booleans on an instance.
_STRING_BOOLEANS = ("encrypted", "delete_on_termination")


def _as_bool(value: Any) -> Any:
    return value.strip().lower() == "true" if isinstance(value, str) and value.strip().lower() in ("true", "false") else value


def _launched_from_templates(planned: list[dict[str, Any]], configured: list[dict[str, Any]]) -> None:
    """Give every `aws_instance` whose launch template is in the plan that template's values for what it leaves unset."""
    by_address = {p["address"]: (p, c) for p, c in zip(planned, configured)}
    for instance, config in zip(planned, configured):
        if instance["type"] != "aws_instance":
            continue
        refs = (((config["expressions"].get("launch_template") or [{}])[0] or {}).get("id") or {}).get("references") or []
        template = next((by_address[a] for a in refs if a in by_address and by_address[a][0]["type"] == "aws_launch_template"), None)
        if template is None:
            continue
        values, exprs = instance["values"], config["expressions"]
        t_values, t_exprs = template[0]["values"], template[1]["expressions"]

        def unset(attribute: str) -> bool:
            return attribute not in values and attribute not in exprs

        for attribute in ("instance_type", "vpc_security_group_ids"):
            if unset(attribute):
                if attribute in t_values:
                    values[attribute] = t_values[attribute]
                if attribute in t_exprs:
                    exprs[attribute] = t_exprs[attribute]
        if unset("ebs_optimized") and "ebs_optimized" in t_values:
            values["ebs_optimized"] = _as_bool(t_values["ebs_optimized"])
        monitoring = (t_values.get("monitoring") or [{}])[0] or {}
        if unset("monitoring") and "enabled" in monitoring:
            values["monitoring"] = _as_bool(monitoring["enabled"])
        if unset("iam_instance_profile"):
            profile = (t_values.get("iam_instance_profile") or [{}])[0] or {}
            profile_exprs = (t_exprs.get("iam_instance_profile") or [{}])[0] or {}
            if profile.get("name"):
                values["iam_instance_profile"] = profile["name"]
            elif profile_exprs.get("name") or profile_exprs.get("arn"):
                exprs["iam_instance_profile"] = profile_exprs.get("name") or profile_exprs["arn"]
        if unset("root_block_device") and unset("ebs_block_device"):
            root, others = [], []
            for mapping in t_values.get("block_device_mappings") or []:
                ebs = (mapping.get("ebs") or [None])[0]
                if not isinstance(ebs, dict):
                    continue  # an instance-store or suppressed device: no EBS volume
                volume = {k: (_as_bool(v) if k in _STRING_BOOLEANS else v) for k, v in ebs.items()}
                if mapping.get("device_name") in ROOT_DEVICE_NAMES and not root:
                    root.append(volume)
                else:
                    others.append({"device_name": mapping.get("device_name"), **volume})
            if root:
                values["root_block_device"] = root
            if others:
                values["ebs_block_device"] = others


def plan(doc: dict[str, Any]) -> Plan:
    """The `aws:*` resources of a synth document as a Terraform plan (see the module docstring)."""
    conv = _Converter(doc)
    resources = doc.get("resources", [])
    providers = {r["name"]: r for r in resources if r.get("type") == PROVIDER_TYPE}
    provider_keys = {name: ("aws" if i == 0 else f"aws.{address_name(name)}") for i, name in enumerate(sorted(providers))}

    planned, configured = [], []
    for r in resources:
        typ = r.get("type", "")
        if not typ.startswith("aws:") or not r.get("custom", True):
            continue
        spec = TYPES.get(typ)
        if spec is None:
            conv.gaps.append(Gap(r["name"], typ, "no Terraform type known for this Pulumi type (infra/preview/convert/terraform.py TYPES); not scanned", blocking=True))
            continue
        conv.current = (r["name"], typ)
        address = conv.addresses[r["urn"]]
        name = address.split(".", 1)[1]
        values, exprs = conv.block(r.get("inputs") or {}, "", spec)
        provider_name = (r.get("options") or {}).get("provider", "")
        if spec.taggable:
            values["tags_all"] = {**default_tags(providers.get(provider_name)), **values.get("tags", {})}
            values.setdefault("tags", {})
        planned.append(
            {
                "address": address,
                "mode": "managed",
                "type": spec.name,
                "name": name,
                "provider_name": PROVIDER,
                "schema_version": 0,
                "values": values,
                "sensitive_values": {},
            }
        )
        configured.append(
            {
                "address": address,
                "mode": "managed",
                "type": spec.name,
                "name": name,
                "provider_config_key": provider_keys.get(provider_name, "aws"),
                "expressions": exprs,
                "schema_version": 0,
            }
        )

    _launched_from_templates(planned, configured)

    provider_config = {}
    for name, key in provider_keys.items():
        inputs = providers[name].get("inputs") or {}
        expressions: dict[str, Any] = {}
        if isinstance(inputs.get("region"), str):
            expressions["region"] = {"constant_value": inputs["region"]}
        tags = default_tags(providers[name])
        if tags:
            expressions["default_tags"] = [{"tags": {"constant_value": tags}}]
        entry: dict[str, Any] = {"name": "aws", "full_name": PROVIDER, "expressions": expressions}
        if key != "aws":
            entry["alias"] = key.split(".", 1)[1]
        provider_config[key] = entry

    document = {
        "format_version": FORMAT_VERSION,
        "terraform_version": TERRAFORM_VERSION,
        "planned_values": {"root_module": {"resources": planned}},
        "configuration": {"provider_config": provider_config, "root_module": {"resources": configured}},
    }
    return Plan(document, conv.gaps, conv.addresses)
