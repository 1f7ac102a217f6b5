"""The whole stack, wired from the config and the plan.

Every number a component needs comes from the plan (node count, instance type,
root volume) or the config; nothing here invents one. Names are derived from the
stack name, so renaming a Python variable never replaces a cloud resource.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.cluster import ClusterArgs, EksCluster
from components.gpu_nodes import GpuNodeGroup, GpuNodeGroupArgs
from components.network import Network, NetworkArgs
from infra.config import PROJECT, StackConfig
from infra.planning import Plan
from infra.tags import default_tags


def cluster_name(stack: str) -> str:
    """EKS cluster name: project and stack (EKS allows 100 characters)."""
    return f"{PROJECT}-{stack.rsplit('/', 1)[-1]}"[:100]


def root_volume_gib(cfg: StackConfig, plan: Plan) -> int:
    return cfg.gpu.root_volume_gib or int(plan.to_json_dict()["node"]["root_volume_gib"])


@dataclass
class Stack:
    provider: aws.Provider
    network: Network
    cluster: EksCluster
    gpu_nodes: GpuNodeGroup


def build(cfg: StackConfig, plan: Plan) -> Stack:
    name = cluster_name(cfg.stack)
    life = cfg.lifecycle
    # Default tags on every AWS resource, through the provider (the leak sweeper
    # finds stacks by them; non-production stacks carry their expiry).
    provider = aws.Provider(
        "aws",
        region=cfg.region,
        default_tags=aws.ProviderDefaultTagsArgs(
            tags=default_tags(
                project=PROJECT,
                stack=cfg.stack,
                owner=life.owner,
                production=life.production,
                expires_at=life.expires_at,
            )
        ),
    )
    opts = pulumi.ResourceOptions(providers={"aws": provider})
    net = cfg.network
    network = Network(
        name,
        NetworkArgs(
            cidr=net.vpc_cidr,
            availability_zones=tuple(net.zones(cfg.region)),
            gpu_availability_zone=net.gpu_zone(cfg.region),
            create_placement_group=cfg.placement_group,
            cluster_name=name,
            nat_gateway_per_az=net.nat_gateway_per_az,
            region=cfg.region,
            existing_vpc_id=net.existing_vpc_id,
            existing_private_subnet_ids=tuple(net.existing_private_subnet_ids or ()),
            existing_public_subnet_ids=tuple(net.existing_public_subnet_ids or ()),
            existing_gpu_subnet_id=net.existing_gpu_subnet_id,
        ),
        opts=opts,
    )
    cl = cfg.cluster
    cluster = EksCluster(
        name,
        ClusterArgs(
            version=cl.kubernetes_version,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids,
            region=cfg.region,
            public_access_cidrs=tuple(cl.public_access_cidrs),
            admin_principal_arns=tuple(cl.admin_principal_arns),
            system_instance_type=cl.system_instance_type,
            system_node_count=cl.system_node_count,
            enable_fsx_csi=cl.fsx_csi,
            protect=life.production,
            cluster_name=name,
        ),
        opts=opts,
    )
    gpu_nodes = GpuNodeGroup(
        f"{name}-gpu",
        GpuNodeGroupArgs(
            cluster_name=cluster.cluster_name,
            node_role_arn=cluster.node_role_arn,
            subnet_id=network.gpu_subnet_id,
            # EFA needs its self-referencing group; nodes need the cluster group to
            # reach the control plane (EKS does not add it when interfaces are declared).
            security_group_ids=[network.efa_security_group_id, cluster.cluster_security_group_id],
            instance_type=plan.instance,
            node_count=plan.nodes,
            root_volume_gib=root_volume_gib(cfg, plan),
            ami_type=cfg.gpu.ami_type,
            capacity_kind=cfg.gpu.capacity.type,
            reservation_id=cfg.gpu.capacity.reservation_id,
            placement_group_name=network.placement_group_name,
            kubernetes_version=cl.kubernetes_version,
        ),
        # A GPU node without the VPC CNI (efa-only support), kube-proxy and the pod
        # identity agent never becomes Ready.
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=cluster.node_prerequisites)),
    )
    return Stack(provider=provider, network=network, cluster=cluster, gpu_nodes=gpu_nodes)
