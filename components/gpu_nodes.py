"""The GPU node group: an EKS managed node group on its own EFA launch template.

One `GpuNodeGroup` component (`gpu-serving:gpu:GpuNodeGroup`) creates:

- an EC2 launch template with
  - every EFA interface the instance type has, laid out as AWS recommends
    (`infra/aws/gpu_nodes.py`: card 0 a normal ENA interface plus an `efa-only` one, every
    other card one `efa-only`), the security groups on each interface;
  - the instance type (see "Where the instance type is set" below);
  - IMDSv2 required, hop limit 1 (see "IMDS" below);
  - an encrypted gp3 root volume sized by the plan, its IOPS and throughput set from
    what it holds (`root_volume_performance`);
  - on AL2023, where the type has instance-store NVMe (every GPU type in the catalog),
    a nodeadm NodeConfig in the user data that puts containerd and the kubelet on the
    NVMe devices as RAID0 (`node_user_data`), so images and caches are on local disk;
  - the capacity settings: Capacity Block market type and reservation target, or a
    capacity reservation target, or nothing for on demand;
  - the cluster placement group when one is given;
  - the stack's tags (project, stack, owner, lifecycle, expires-at) and a Name on the
    instances, their volumes and network interfaces (the provider's default tags do
    not reach what the Auto Scaling group launches);
  - no subnet (EKS rejects a managed node group template that sets one), no
    template-level security groups (with interfaces declared they go on each
    interface), no image id (the node group's AMI type picks the EKS-optimised
    NVIDIA AMI and EKS merges its bootstrap user data), no IAM instance profile
    (EKS sets it from the node role);
- an EKS managed node group on that template: the GPU subnet, the AMI type and
  its pinned release version, the capacity type, min = max = desired = the plan's
  node count, an update policy that never takes more than one GPU node away at
  once, node auto repair (one node at a time), the GPU taint and the labels the
  serving layer selects on.

Capacity Blocks: the node group and its template are named after the block
(`resource_names`), so a new block (a new reservation id) brings a new group,
created before the old one is deleted; and a change that would update a block's
group in place replaces it, deleting the old group first (`replacement_options`),
because EKS updates a Capacity Block group only at desired size 0.

Where the instance type is set: in the launch template, never on the node group
(EKS rejects it in both places). A Capacity Block template must carry it (EKS
User Guide, "Create a managed node group with Capacity Blocks for ML"), so it
lives there for every capacity kind; it also means a new instance type is a new
template version, which EKS rolls out node by node, where `instanceTypes` on the
node group would replace the whole group.

IMDS: `http_tokens` "required" (IMDSv2 only) and `http_put_response_hop_limit`
1. The EKS User Guide ("Upgrade from Amazon Linux 2 to Amazon Linux 2023") says
AL2023 requires IMDSv2 and managed node groups default the hop limit to 1 so
that containers cannot use the node's credentials; raise it to 2 only for
containers that need the node role, and use EKS Pod Identity instead. The EKS
Best Practices Guide ("Restrict access to the instance profile assigned to the
worker node") says the same. Pods here get AWS credentials from Pod Identity (the
cluster installs eks-pod-identity-agent); host-network pods (VPC CNI, kube-proxy,
the CSI node drivers) reach IMDS at hop limit 1 anyway. A stack whose pods really
need the node role sets `imds_hop_limit=2`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from infra.aws.gpu_nodes import (
    capacity_settings,
    efa_interface_count,
    efa_interfaces,
    encode_user_data,
    node_user_data,
    repair_config,
    replacement_options,
    resource_names,
    root_device_name,
    root_volume_performance,
    update_config,
    uses_instance_store,
)
from infra.aws.launch_template import metadata_options, template_version
from infra.aws.tags import tag_specifications
from infra.catalog.capacity import ON_DEMAND
from infra.catalog.eks import DEFAULT_GPU_AMI_TYPE, GPU_AMI_TYPES
from infra.catalog.instances import InstanceType
from infra.k8s.scheduling import gpu_labels, gpu_taints

TYPE = "gpu-serving:gpu:GpuNodeGroup"

ROOT_VOLUME_TYPE = "gp3"  # EC2 VolumeType


@dataclass(frozen=True)
class GpuNodeGroupArgs:
    """What the GPU node group needs. Numbers come from the plan, never from here.

    `security_group_ids`: the EFA security group and the cluster security group.
    They are set on every network interface; EKS adds the cluster security group
    itself only when a template names none, so it must be in this list or the
    nodes cannot reach the control plane.
    `subnet_id`: the GPU subnet (one zone; with a reservation or Capacity Block,
    the reservation's zone).
    `tags`: the stack's tags, for the instances, volumes and interfaces the node
    group launches (the provider's default tags reach the template, not what
    the Auto Scaling group launches from it). `release_version`: the AMI
    release (None: EKS's latest for the Kubernetes version, which the stack
    never leaves to chance: it passes the pinned one).
    """

    cluster_name: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    security_group_ids: Sequence[pulumi.Input[str]]
    instance_type: InstanceType
    node_count: int
    root_volume_gib: int
    ami_type: str = DEFAULT_GPU_AMI_TYPE
    capacity_kind: str = ON_DEMAND
    reservation_id: Optional[str] = None
    placement_group_name: Optional[pulumi.Input[str]] = None
    kubernetes_version: Optional[str] = None
    release_version: Optional[str] = None
    imds_hop_limit: int = 1
    tags: Optional[Mapping[str, str]] = None
    # What the node group itself waits for (and, on destroy, outlives): the node role's policy attachments
    # and the add-ons a node needs. On the node group, not the component: a component's depends_on does not
    # reach the resources inside it.
    prerequisites: Sequence[pulumi.Resource] = ()


def node_group_options(capacity_kind: str) -> pulumi.ResourceOptions:
    """The node group's resource options that decide how its nodes change (see `replacement_options`)."""
    o = replacement_options(capacity_kind)
    return pulumi.ResourceOptions(replace_on_changes=o["replace_on_changes"], delete_before_replace=o["delete_before_replace"])


class GpuNodeGroup(pulumi.ComponentResource):
    """An EKS managed node group of EFA-wired GPU instances (see the module doc)."""

    launch_template: aws.ec2.LaunchTemplate
    node_group: aws.eks.NodeGroup
    node_group_name: pulumi.Output[str]
    launch_template_id: pulumi.Output[str]
    efa_interface_count: int

    def __init__(self, name: str, args: GpuNodeGroupArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        # The arguments are checked before anything is registered. A ValueError here is a
        # caller's bug: the stack config refuses every such mistake with its key first.
        if args.ami_type not in GPU_AMI_TYPES:
            raise ValueError(
                f"ami_type {args.ami_type!r} is not an EKS GPU AMI type (one with the NVIDIA driver); "
                f"allowed: {', '.join(GPU_AMI_TYPES)}"
            )
        if args.instance_type.gpu_count < 1:
            raise ValueError(f"instance_type {args.instance_type.name} has no GPU")
        if args.root_volume_gib < 1:
            raise ValueError(f"root_volume_gib must be at least 1, got {args.root_volume_gib}")
        if args.imds_hop_limit not in (1, 2):
            raise ValueError(f"imds_hop_limit must be 1 or 2, got {args.imds_hop_limit}")
        capacity = capacity_settings(args.capacity_kind, args.reservation_id)
        updates = update_config(args.node_count, args.capacity_kind)
        interfaces = efa_interfaces(args.instance_type, args.security_group_ids)

        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.efa_interface_count = efa_interface_count(interfaces)
        instance_tags = {**dict(args.tags or {}), "Name": name}  # the component name already starts with the cluster name
        lt_name, ng_name = resource_names(name, args.capacity_kind, args.reservation_id)
        self.on_instance_store = uses_instance_store(args.ami_type, args.instance_type)
        self.root_volume = root_volume_performance(args.root_volume_gib, self.on_instance_store)

        self.launch_template = aws.ec2.LaunchTemplate(
            lt_name,
            description=f"{args.instance_type.name} GPU nodes with {self.efa_interface_count} EFA interfaces",
            instance_type=args.instance_type.name,
            update_default_version=True,
            network_interfaces=[
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=i["network_card_index"],
                    device_index=i["device_index"],
                    interface_type=i["interface_type"],
                    security_groups=i["security_groups"],
                    # The provider types these EC2 booleans as strings.
                    delete_on_termination="true" if i["delete_on_termination"] else "false",
                )
                for i in interfaces
            ],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(**metadata_options(args.imds_hop_limit)),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=root_device_name(args.ami_type),
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=args.root_volume_gib,
                        volume_type=ROOT_VOLUME_TYPE,
                        iops=self.root_volume.iops,
                        throughput=self.root_volume.throughput_mibps,
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            placement=(
                aws.ec2.LaunchTemplatePlacementArgs(group_name=args.placement_group_name)
                if args.placement_group_name is not None
                else None
            ),
            instance_market_options=(
                aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(**capacity.instance_market_options)
                if capacity.instance_market_options
                else None
            ),
            capacity_reservation_specification=(
                aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                    capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                        **capacity.capacity_reservation_specification["capacity_reservation_target"]
                    )
                )
                if capacity.capacity_reservation_specification
                else None
            ),
            user_data=encode_user_data(node_user_data(args.ami_type, args.instance_type)),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(**t) for t in tag_specifications(args.tags or {}, name)
            ],
            opts=child,
        )

        # No ignore_changes, on purpose: the plan is the only owner of the size (no cluster
        # autoscaler; min = max = desired) and of every other field here. Ignoring desiredSize, as
        # autoscaled groups do, would let a smaller plan set max below the live desired size, which
        # EKS rejects. With a Capacity Block, EKS scales the group to zero 40 minutes before the block
        # ends; a later `pulumi up --refresh` then shows that drift and asks for the plan's size back,
        # which is what should happen when a new block is configured.
        self.node_group = aws.eks.NodeGroup(
            ng_name,
            cluster_name=args.cluster_name,
            node_role_arn=args.node_role_arn,
            subnet_ids=[args.subnet_id],
            ami_type=args.ami_type,
            capacity_type=capacity.node_group_capacity_type,
            version=args.kubernetes_version,
            release_version=args.release_version,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id,
                version=self.launch_template.latest_version.apply(template_version),
            ),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.node_count,
                max_size=args.node_count,
                desired_size=args.node_count,
            ),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(**updates),
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(**repair_config()),
            taints=[aws.eks.NodeGroupTaintArgs(**t) for t in gpu_taints()],
            labels=gpu_labels(args.instance_type),
            tags=instance_tags,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions.merge(
                    node_group_options(args.capacity_kind), pulumi.ResourceOptions(depends_on=list(args.prerequisites))
                ),
            ),
        )

        self.node_group_name = self.node_group.node_group_name
        self.launch_template_id = self.launch_template.id
        self.register_outputs(
            {
                "node_group_name": self.node_group_name,
                "launch_template_id": self.launch_template_id,
                "efa_interface_count": self.efa_interface_count,
            }
        )
