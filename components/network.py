"""The network the cluster and its GPU nodes live in.

One `Network` component (`gpu-serving:network:Network`) creates, for a new VPC:

- the VPC (DNS support and DNS host names on: EKS nodes and private endpoints
  need both), an internet gateway;
- per availability zone one public subnet (NAT gateways, internet-facing load
  balancers) and one private subnet (control-plane ENIs, system nodes,
  internal load balancers);
- one dedicated private GPU subnet in the GPU zone, the largest block of the VPC:
  the VPC CNI gives every pod an address from its node's subnet, and EFA traffic
  never leaves one subnet (see `infra/aws/subnets.py` for the layout);
- NAT gateways with Elastic IPs: one in the first zone, or one per zone when
  asked (the loss of one zone then leaves the others' egress alone);
- route tables: one public (default route to the internet gateway), one private
  per zone (default route to that zone's NAT, or the single NAT); the GPU
  subnet uses its zone's private table;
- an S3 gateway endpoint on every private route table: model weights come from
  S3 without NAT data-processing charges;
- the EFA security group: all traffic to and from itself (EFA's OS-bypass
  traffic is not IP and is only allowed by a self-referencing rule), plus
  egress anywhere;
- a `cluster` placement group for the GPU nodes, unless a capacity reservation
  or Capacity Block already fixes their placement; a reservation made in a
  cluster placement group passes that group's name through
  (`existing_placement_group_name`) instead;
- the VPC's default security group, adopted with no rules: nothing of the
  stack uses it, and anything launched without a group of its own then gets
  no traffic at all (Amazon VPC User Guide, "Default security groups for your
  VPCs"; AWS Security Hub control EC2.2). Adopting it removes every rule AWS
  put in it and keeps only those declared (none); Pulumi cannot delete a
  default group: on destroy it leaves it, and the VPC's deletion takes it along
  (pulumi_aws ec2.DefaultSecurityGroup: "When the provider first begins
  managing the default security group, it immediately removes all ingress and
  egress rules", and removing the resource "will not destroy the Security
  Group"; the same page: it is incompatible with separate rule resources);
- VPC flow logs (`REJECT`ed connections, or `ALL`) to a CloudWatch log group
  of their own (`/aws/vpc/<name>/flow-logs`) with the config's retention,
  encrypted with a KMS key of the network's (its policy lets CloudWatch Logs
  use it for that group only: `infra.aws.iam.key_policy`), delivered by a role
  only VPC Flow Logs of this account may assume, which may only write into that
  group (`infra.aws.iam.flow_logs_*`). In production the log group and its key
  are protected and retained on delete (`components.protection.kept`).

With `existing_vpc_id` nothing of the VPC is created (no VPC, subnets, gateways,
NAT or route tables): the given subnet ids are passed through, and only the EFA
security group, the placement group and, when asked, the S3 endpoint on the given
route tables are created. The existing VPC's default security group and flow logs
stay its owner's: stripping the rules of a group other workloads may use, or
adding a second flow log, is not this stack's call.

Subnet tags follow the AWS Load Balancer Controller's discovery rules:
`kubernetes.io/cluster/<cluster>: shared` on every subnet,
`kubernetes.io/role/elb: 1` on public and `kubernetes.io/role/internal-elb: 1`
on the general private subnets. The GPU subnet carries only the cluster tag, so
internal load balancers do not take GPU-pod addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import pulumi
import pulumi_aws as aws

from components.protection import encrypted_log_group, kms_key
from infra.errors import UserError
from infra.aws.iam import flow_logs_publish_policy, flow_logs_trust_policy, key_policy
from infra.aws.subnets import SubnetLayout, check_zones, region_of_zones, subnet_layout
from infra.catalog.cloudwatch import (
    DEFAULT_FLOW_LOG_TRAFFIC_TYPE,
    DEFAULT_LOG_RETENTION_DAYS,
    FLOW_LOG_TRAFFIC_TYPES,
    LOG_RETENTION_DAYS,
)

TYPE = "gpu-serving:network:Network"

ANYWHERE = "0.0.0.0/0"
ALL_PROTOCOLS = "-1"  # EC2's "all traffic" (IpProtocol -1: every protocol, every port)
PLACEMENT_STRATEGY = "cluster"  # EC2 PlacementStrategy: one low-latency network segment
S3_ENDPOINT_TYPE = "Gateway"  # EC2 VpcEndpointType: free, route-table based
FLOW_LOG_DESTINATION_TYPE = "cloud-watch-logs"  # EC2 LogDestinationType


@dataclass(frozen=True)
class NetworkArgs:
    """What the network needs to know. Validated when built (a `UserError` says what is wrong).

    `create_s3_endpoint`: None (the default) creates the S3 gateway endpoint for a
    new VPC and skips it for an existing one (whose owner usually has one already,
    and whose route tables this stack does not own); True creates it in both
    cases (an existing VPC then needs `existing_private_route_table_ids`); False
    never creates it.
    """

    cidr: str
    availability_zones: tuple[str, ...]
    gpu_availability_zone: str
    create_placement_group: bool
    cluster_name: str
    account_id: pulumi.Input[str]  # the account the stack deploys into (the flow logs' key and role policies)
    nat_gateway_per_az: bool = False
    create_s3_endpoint: Optional[bool] = None
    region: Optional[str] = None  # None: read from the zone names ("us-east-1a" -> "us-east-1")
    existing_vpc_id: Optional[str] = None
    existing_private_subnet_ids: tuple[str, ...] = ()
    existing_public_subnet_ids: tuple[str, ...] = ()
    existing_gpu_subnet_id: Optional[str] = None
    existing_private_route_table_ids: tuple[str, ...] = ()
    # An existing cluster placement group for the GPU nodes (a reservation's own); never with create_placement_group.
    existing_placement_group_name: Optional[str] = None
    tags: dict[str, str] = field(default_factory=dict)  # extra tags on top of the provider's default tags
    flow_log_traffic_type: str = DEFAULT_FLOW_LOG_TRAFFIC_TYPE
    log_retention_days: int = DEFAULT_LOG_RETENTION_DAYS
    protect: bool = False  # production: the flow logs and their key are protected and retained on delete

    def __post_init__(self) -> None:
        # Tuples, not lists: the args are frozen and hashable, and callers may pass lists.
        for name in (
            "availability_zones",
            "existing_private_subnet_ids",
            "existing_public_subnet_ids",
            "existing_private_route_table_ids",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        validate_network_args(self)

    @property
    def uses_existing_vpc(self) -> bool:
        return self.existing_vpc_id is not None

    @property
    def wants_s3_endpoint(self) -> bool:
        if self.create_s3_endpoint is None:
            return not self.uses_existing_vpc
        return self.create_s3_endpoint

    @property
    def aws_region(self) -> str:
        return self.region or region_of_zones(self.availability_zones)


def validate_network_args(args: NetworkArgs) -> None:
    """Every mistake that can be found before a resource is registered."""
    if not args.cluster_name:
        raise UserError("network: cluster_name is empty; subnets are tagged kubernetes.io/cluster/<cluster name>")
    check_zones(args.availability_zones, args.gpu_availability_zone)
    if args.region is None:
        region_of_zones(args.availability_zones)
    if args.flow_log_traffic_type not in FLOW_LOG_TRAFFIC_TYPES:
        raise UserError(f"network: flow log traffic type {args.flow_log_traffic_type!r} is not one of {', '.join(FLOW_LOG_TRAFFIC_TYPES)}")
    if args.log_retention_days not in LOG_RETENTION_DAYS:
        raise UserError(f"network: log_retention_days {args.log_retention_days} is not one CloudWatch Logs accepts: {LOG_RETENTION_DAYS}")
    if args.create_placement_group and args.existing_placement_group_name:
        raise UserError(
            "network: create_placement_group and existing_placement_group_name both given; the GPU nodes go into "
            "one placement group: a new one, or the named one"
        )
    if not args.uses_existing_vpc:
        subnet_layout(args.cidr, args.availability_zones, args.gpu_availability_zone)
        extra = [
            n
            for n in (
                "existing_private_subnet_ids",
                "existing_public_subnet_ids",
                "existing_gpu_subnet_id",
                "existing_private_route_table_ids",
            )
            if getattr(args, n)
        ]
        if extra:
            raise UserError(f"network: {', '.join(extra)} given without existing_vpc_id; set existing_vpc_id too, or drop them")
        return
    if len(args.existing_private_subnet_ids) < 2:
        raise UserError(
            "network: with existing_vpc_id, give at least two existing_private_subnet_ids in different "
            "availability zones (the EKS control plane needs two zones)"
        )
    if not args.existing_gpu_subnet_id:
        raise UserError(
            "network: with existing_vpc_id, give existing_gpu_subnet_id: the one subnet, in "
            f"{args.gpu_availability_zone}, that all GPU nodes share (EFA does not cross subnets)"
        )
    if args.create_s3_endpoint and not args.existing_private_route_table_ids:
        raise UserError(
            "network: create_s3_endpoint with an existing VPC needs existing_private_route_table_ids "
            "(the route tables the gateway endpoint is added to)"
        )


def cluster_tag_key(cluster_name: str) -> str:
    return f"kubernetes.io/cluster/{cluster_name}"


def public_subnet_tags(cluster_name: str, name: str) -> dict[str, str]:
    """Public subnets: internet-facing load balancers go here."""
    return {"Name": name, cluster_tag_key(cluster_name): "shared", "kubernetes.io/role/elb": "1"}


def private_subnet_tags(cluster_name: str, name: str) -> dict[str, str]:
    """General private subnets: internal load balancers go here."""
    return {"Name": name, cluster_tag_key(cluster_name): "shared", "kubernetes.io/role/internal-elb": "1"}


def gpu_subnet_tags(cluster_name: str, name: str) -> dict[str, str]:
    """The GPU subnet: the cluster tag only, so no load balancer takes GPU-pod addresses."""
    return {"Name": name, cluster_tag_key(cluster_name): "shared"}


def nat_zones(azs: tuple[str, ...], per_az: bool) -> tuple[str, ...]:
    """The zones that get a NAT gateway: every zone, or the first one."""
    return tuple(azs) if per_az else (azs[0],)


def flow_log_group_name(name: str) -> str:
    """The flow logs' CloudWatch log group."""
    return f"/aws/vpc/{name}/flow-logs"


def s3_service_name(region: str) -> str:
    """The S3 gateway endpoint's service name (the China regions prefix it with "cn.")."""
    prefix = "cn.com.amazonaws" if region.startswith("cn-") else "com.amazonaws"
    return f"{prefix}.{region}.s3"


class Network(pulumi.ComponentResource):
    """VPC, subnets, NAT, S3 endpoint, EFA security group and placement group (see the module docstring)."""

    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    public_subnet_ids: pulumi.Output[list[str]]
    gpu_subnet_id: pulumi.Output[str]
    efa_security_group_id: pulumi.Output[str]
    placement_group_name: Optional[pulumi.Output[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.args = args
        self.layout: Optional[SubnetLayout] = None
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        private_route_table_ids: list[pulumi.Input[str]]
        if args.uses_existing_vpc:
            vpc_id: pulumi.Input[str] = args.existing_vpc_id  # type: ignore[assignment]
            private_ids: list[pulumi.Input[str]] = list(args.existing_private_subnet_ids)
            public_ids: list[pulumi.Input[str]] = list(args.existing_public_subnet_ids)
            gpu_id: pulumi.Input[str] = args.existing_gpu_subnet_id  # type: ignore[assignment]
            private_route_table_ids = list(args.existing_private_route_table_ids)
        else:
            vpc_id, private_ids, public_ids, gpu_id, private_route_table_ids = self._new_vpc(name, args, tags, child)

        if args.wants_s3_endpoint:
            self.s3_endpoint: Optional[aws.ec2.VpcEndpoint] = aws.ec2.VpcEndpoint(
                f"{name}-s3",
                vpc_id=vpc_id,
                service_name=s3_service_name(args.aws_region),
                vpc_endpoint_type=S3_ENDPOINT_TYPE,
                route_table_ids=private_route_table_ids,
                tags={**tags, "Name": f"{name}-s3"},
                opts=child,
            )
        else:
            self.s3_endpoint = None

        self.efa_security_group = aws.ec2.SecurityGroup(
            f"{name}-efa",
            vpc_id=vpc_id,
            description="EFA: all traffic between members of this group",
            tags={**tags, "Name": f"{name}-efa"},
            opts=child,
        )
        sg_id = self.efa_security_group.id
        # EFA requires an inbound and an outbound rule that allow all traffic from
        # and to the group itself (EC2 user guide, "Prepare an EFA-enabled security group").
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efa-in-self",
            security_group_id=sg_id,
            referenced_security_group_id=sg_id,
            ip_protocol=ALL_PROTOCOLS,
            description="EFA: all traffic from members of this group",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-out-self",
            security_group_id=sg_id,
            referenced_security_group_id=sg_id,
            ip_protocol=ALL_PROTOCOLS,
            description="EFA: all traffic to members of this group",
            opts=child,
        )
        # A security group created by the provider has no egress rule at all.
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-out-any",
            security_group_id=sg_id,
            cidr_ipv4=ANYWHERE,
            ip_protocol=ALL_PROTOCOLS,
            description="All outbound traffic",
            opts=child,
        )

        if args.create_placement_group:
            self.placement_group: Optional[aws.ec2.PlacementGroup] = aws.ec2.PlacementGroup(
                f"{name}-gpu",
                strategy=PLACEMENT_STRATEGY,
                tags={**tags, "Name": f"{name}-gpu"},
                opts=child,
            )
            self.placement_group_name = self.placement_group.name
        else:
            self.placement_group = None
            name_given = args.existing_placement_group_name
            self.placement_group_name = pulumi.Output.from_input(name_given) if name_given else None

        self.vpc_id = pulumi.Output.from_input(vpc_id)
        self.private_subnet_ids = pulumi.Output.all(*private_ids).apply(list)
        self.public_subnet_ids = pulumi.Output.all(*public_ids).apply(list)
        self.gpu_subnet_id = pulumi.Output.from_input(gpu_id)
        self.efa_security_group_id = sg_id
        self.gpu_availability_zone = args.gpu_availability_zone
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
                "gpu_subnet_id": self.gpu_subnet_id,
                "efa_security_group_id": self.efa_security_group_id,
                "placement_group_name": self.placement_group_name,
            }
        )

    def _flow_logs(self, name: str, args: NetworkArgs, vpc: aws.ec2.Vpc, tags: dict[str, str], child: pulumi.ResourceOptions) -> None:
        """The VPC's flow log, its encrypted log group, the group's key and the delivery role (module docstring)."""
        region, group_name = args.aws_region, flow_log_group_name(name)
        account_id = pulumi.Output.from_input(args.account_id)
        self.flow_log_key = kms_key(
            f"{name}-flow-logs-key",
            description=f"{name}: VPC flow logs",
            policy=account_id.apply(lambda account: key_policy(region, account, log_group_names=[group_name])),
            tags=tags,
            opts=child,
            production=args.protect,
        )
        self.flow_log_group = encrypted_log_group(
            f"{name}-flow-logs",
            name=group_name,
            key=self.flow_log_key,
            retention_in_days=args.log_retention_days,
            tags=tags,
            opts=child,
            production=args.protect,
        )
        role = aws.iam.Role(
            f"{name}-flow-logs-role",
            assume_role_policy=account_id.apply(lambda account: flow_logs_trust_policy(region, account)),
            description=f"VPC flow logs of {name} to {group_name}",
            tags=tags,
            opts=child,
        )
        publish = aws.iam.RolePolicy(
            f"{name}-flow-logs-publish",
            role=role.id,
            policy=account_id.apply(lambda account: flow_logs_publish_policy(region, account, group_name)),
            opts=child,
        )
        self.flow_log = aws.ec2.FlowLog(
            f"{name}-vpc-flow-log",
            vpc_id=vpc.id,
            traffic_type=args.flow_log_traffic_type,
            log_destination_type=FLOW_LOG_DESTINATION_TYPE,
            log_destination=self.flow_log_group.arn,
            iam_role_arn=role.arn,
            tags={**tags, "Name": f"{name}-vpc"},
            # Delivery needs the role's permissions from the first record on.
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[publish])),
        )

    def _new_vpc(self, name: str, args: NetworkArgs, tags: dict[str, str], child: pulumi.ResourceOptions):
        layout = subnet_layout(args.cidr, args.availability_zones, args.gpu_availability_zone)
        self.layout = layout
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=layout.vpc,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={**tags, "Name": f"{name}-vpc"},
            opts=child,
        )
        self.vpc = vpc
        self.default_security_group = aws.ec2.DefaultSecurityGroup(
            f"{name}-default-sg",
            vpc_id=vpc.id,
            # No ingress and no egress: adopting the group removes the rules AWS put in it (module docstring).
            tags={**tags, "Name": f"{name}-default"},
            opts=child,
        )
        self._flow_logs(name, args, vpc, tags, child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-igw"}, opts=child)

        public: dict[str, aws.ec2.Subnet] = {}
        private: dict[str, aws.ec2.Subnet] = {}
        for az in args.availability_zones:
            pub_name = f"{name}-public-{az}"
            public[az] = aws.ec2.Subnet(
                pub_name,
                vpc_id=vpc.id,
                cidr_block=layout.public[az],
                availability_zone=az,
                # Nothing of ours runs here with a public address; NAT gateways get Elastic IPs.
                map_public_ip_on_launch=False,
                tags={**tags, **public_subnet_tags(args.cluster_name, pub_name)},
                opts=child,
            )
            priv_name = f"{name}-private-{az}"
            private[az] = aws.ec2.Subnet(
                priv_name,
                vpc_id=vpc.id,
                cidr_block=layout.private[az],
                availability_zone=az,
                tags={**tags, **private_subnet_tags(args.cluster_name, priv_name)},
                opts=child,
            )
        gpu_name = f"{name}-gpu-{args.gpu_availability_zone}"
        gpu = aws.ec2.Subnet(
            gpu_name,
            vpc_id=vpc.id,
            cidr_block=layout.gpu,
            availability_zone=args.gpu_availability_zone,
            tags={**tags, **gpu_subnet_tags(args.cluster_name, gpu_name)},
            opts=child,
        )
        self.public_subnets, self.private_subnets, self.gpu_subnet = public, private, gpu

        public_rt = aws.ec2.RouteTable(f"{name}-public-rt", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-public-rt"}, opts=child)
        aws.ec2.Route(
            f"{name}-public-rt-default",
            route_table_id=public_rt.id,
            destination_cidr_block=ANYWHERE,
            gateway_id=igw.id,
            opts=child,
        )
        for az, subnet in public.items():
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{az}-rta", route_table_id=public_rt.id, subnet_id=subnet.id, opts=child
            )

        nats: dict[str, aws.ec2.NatGateway] = {}
        for az in nat_zones(args.availability_zones, args.nat_gateway_per_az):
            eip = aws.ec2.Eip(f"{name}-nat-{az}-eip", domain="vpc", tags={**tags, "Name": f"{name}-nat-{az}"}, opts=child)
            nats[az] = aws.ec2.NatGateway(
                f"{name}-nat-{az}",
                allocation_id=eip.allocation_id,
                subnet_id=public[az].id,
                connectivity_type="public",
                tags={**tags, "Name": f"{name}-nat-{az}"},
                # A public NAT gateway only works once the VPC has an internet gateway.
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[igw])),
            )
        self.nat_gateways = nats
        first_nat = next(iter(nats.values()))

        private_rts: dict[str, aws.ec2.RouteTable] = {}
        for az, subnet in private.items():
            rt = aws.ec2.RouteTable(
                f"{name}-private-rt-{az}", vpc_id=vpc.id, tags={**tags, "Name": f"{name}-private-rt-{az}"}, opts=child
            )
            private_rts[az] = rt
            aws.ec2.Route(
                f"{name}-private-rt-{az}-default",
                route_table_id=rt.id,
                destination_cidr_block=ANYWHERE,
                nat_gateway_id=nats.get(az, first_nat).id,
                opts=child,
            )
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}-rta", route_table_id=rt.id, subnet_id=subnet.id, opts=child)
        aws.ec2.RouteTableAssociation(
            f"{name}-gpu-{args.gpu_availability_zone}-rta",
            route_table_id=private_rts[args.gpu_availability_zone].id,
            subnet_id=gpu.id,
            opts=child,
        )
        return (
            vpc.id,
            [s.id for s in private.values()],
            [s.id for s in public.values()],
            gpu.id,
            [rt.id for rt in private_rts.values()],
        )
