"""The whole stack, wired from the config and the plan.

Every number a component needs comes from the plan (node count, instance type,
root volume) or the config; nothing here invents one. Names are derived from the
stack name, so renaming a Python variable never replaces a cloud resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.cluster import ClusterArgs, EksCluster
from components.gpu_nodes import GpuNodeGroup, GpuNodeGroupArgs
from components.monitoring import AmpArgs, Monitoring, MonitoringArgs
from components.network import Network, NetworkArgs
from components.operators import METRICS_TARGETS, Operators, OperatorsArgs
from components.serving import Serving, ServingArgs
from components.storage import ModelStorage, ModelStorageArgs
from infra.config import PROJECT, StackConfig, secret
from infra.planning import Plan
from infra.planning.contract import Deployment
from infra.errors import UserError
from infra.k8s import monitoring as monitoring_values, network_policies, pod_security
from infra.k8s.exposure import pod_monitor
from infra.k8s.monitoring_sizing import Shape, sizing
from infra.monitoring.alerts import AlertSpec, prometheus_rule_groups
from infra.monitoring.dashboards import dashboard_spec_from, dashboards
from infra.k8s.serving_spec import Clients, ServingSpec
from infra.catalog.models import checkpoint_repo, pinned_revision
from infra.k8s.serving_image import by_digest, serving_image_tag
from infra.k8s.staging import staged_checkpoint, staging_image_tag
from infra.aws import names
from infra.aws.tags import cluster_name as stack_cluster_name, default_tags, launch_template_tags
from infra.catalog import eks_versions


def cluster_name(stack: str) -> str:
    """EKS cluster name: project and stack (infra/aws/tags.py; the leak sweeper derives it the same way)."""
    return stack_cluster_name(PROJECT, stack)


def _clients(config) -> Clients:  # noqa: ANN001 - one of the config's client objects (namespaces, cidrs)
    return Clients(namespaces=tuple(config.namespaces), cidrs=tuple(config.cidrs))


def metrics_clients(cfg: StackConfig) -> Clients:
    """Who may scrape the metrics ports: `serving.metricsClients`, and the stack's own Prometheus when it has one."""
    own = (monitoring_values.NAMESPACE,) if cfg.monitoring.deployed else ()
    configured = cfg.serving.metrics_clients
    return Clients(namespaces=tuple(dict.fromkeys((*configured.namespaces, *own))), cidrs=tuple(configured.cidrs))


def prometheus_shape(cfg: StackConfig, plan: Plan) -> Shape:
    """What the in-cluster Prometheus' series count depends on (infra/k8s/monitoring_sizing.py)."""
    return Shape(
        gpu_nodes=plan.nodes,
        gpus_per_node=plan.instance.gpu_count,
        vcpus_per_gpu_node=plan.instance.vcpus,
        system_nodes=cfg.cluster.system_node_count,
        engines=plan.layout.dp,
        ray_pods=plan.nodes,  # one Ray pod per GPU node (infra/planning/contract.py)
    )


def root_volume_gib(cfg: StackConfig, deployment: Deployment) -> int:
    return cfg.gpu.root_volume_gib or deployment.nodes.root_volume_gib


@dataclass
class Stack:
    provider: aws.Provider
    network: Network
    cluster: EksCluster
    gpu_nodes: GpuNodeGroup
    image_repository: aws.ecr.Repository
    operators: Operators
    storage: ModelStorage
    serving: Serving
    monitoring: Optional[Monitoring] = None


def benchmark_load(plan: Plan) -> dict:
    """The benchmark Job's load: the stack's workload at the plan's SLA capacity, with what the
    plan predicts for it (infra/planning/performance.py benchmark_load); the Job's defaults
    when the plan has no SLA."""
    b = plan.benchmark
    if b is None:
        return {}
    return dict(
        benchmark_input_len=b.input_len, benchmark_output_len=b.output_len, benchmark_range_ratio=b.range_ratio,
        benchmark_prefix_len=b.prefix_len, benchmark_concurrency=b.concurrency, benchmark_prompts=b.prompts,
        benchmark_predicted=b.predicted,
    )


def build(cfg: StackConfig, plan: Plan) -> Stack:
    deployment = plan.deployment()  # refuses a plan that cannot be served, before any resource
    eks_name = cluster_name(cfg.stack)
    name = names.resource_prefix(eks_name)  # every resource name starts with it: what Pulumi names after it fits
    life = cfg.lifecycle
    # Default tags on every AWS resource, through the provider (the leak sweeper
    # finds stacks by them; non-production stacks carry their expiry).
    tags = default_tags(
        project=PROJECT,
        stack=cfg.stack,
        owner=life.owner,
        production=life.production,
        expires_at=life.expires_at,
    )
    # An explicit provider reads no `aws:` stack config of its own: the profile is passed, when set.
    provider = aws.Provider(
        "aws", region=cfg.region, default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
        **({"profile": cfg.aws_profile} if cfg.aws_profile else {}),
    )  # fmt: skip
    opts = pulumi.ResourceOptions(providers={"aws": provider})
    # The account the provider deploys into (STS GetCallerIdentity), for the key policies and the flow-log role.
    account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=provider)).account_id
    net = cfg.network
    network = Network(
        name,
        NetworkArgs(
            cidr=net.vpc_cidr,
            availability_zones=tuple(net.zones(cfg.region)),
            gpu_availability_zone=net.gpu_zone(cfg.region),
            create_placement_group=cfg.placement_group,
            existing_placement_group_name=net.placement_group_name,
            cluster_name=eks_name,
            account_id=account_id,
            nat_gateway_per_az=net.nat_gateway_per_az,
            flow_log_traffic_type=net.flow_log_traffic_type,
            log_retention_days=life.log_retention_days,
            protect=life.production,
            region=cfg.region,
            existing_vpc_id=net.existing_vpc_id,
            existing_private_subnet_ids=tuple(net.existing_private_subnet_ids or ()),
            existing_public_subnet_ids=tuple(net.existing_public_subnet_ids or ()),
            existing_gpu_subnet_id=net.existing_gpu_subnet_id,
        ),
        opts=opts,
    )
    cl = cfg.cluster
    day = eks_versions.today()  # the Kubernetes version and AMI release: the config's, or the defaults on the day of `up`
    kubernetes_version = cfg.kubernetes_version(day)
    cluster = EksCluster(
        name,
        ClusterArgs(
            version=kubernetes_version,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids,
            region=cfg.region,
            addon_versions=eks_versions.addon_versions(kubernetes_version),
            account_id=account_id,
            log_retention_days=life.log_retention_days,
            endpoint_access=cl.endpoint_access,
            deployer_cidrs=tuple(cl.deployer_cidrs),
            api_tunnel_port=cl.api_tunnel_port,
            aws_profile=cfg.aws_profile,
            bastion_subnet_id=network.private_subnet_ids.apply(lambda ids: ids[0]),
            system_release_version=cfg.system_ami_release_version(day),
            instance_tags=launch_template_tags(tags),  # only tags that never change: a change rolls nodes
            admin_principal_arns=tuple(cl.admin_principal_arns),
            system_instance_type=cl.system_instance_type,
            system_node_count=cl.system_node_count,
            enable_fsx_csi=cl.fsx_csi,
            support_type=cl.support_type,
            protect=life.production,
            cluster_name=eks_name,
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
            root_volume_gib=root_volume_gib(cfg, deployment),
            ami_type=cfg.gpu.ami_type,
            capacity_kind=cfg.gpu.capacity.type,
            reservation_id=cfg.gpu.capacity.reservation_id,
            placement_group_name=network.placement_group_name,
            kubernetes_version=kubernetes_version,
            release_version=cfg.ami_release_version(day),
            tags=launch_template_tags(tags),  # into the launch template: only tags that never change
            # A GPU node without the node role's policies, the VPC CNI (efa-only support), kube-proxy and
            # the pod identity agent never becomes Ready.
            prerequisites=tuple(cluster.node_prerequisites),
        ),
        opts=opts,
    )
    # The serving image (images/vllm/Dockerfile), pushed by bin/build-image.
    repository = aws.ecr.Repository(
        f"{name}-vllm",
        name=names.image_repository_name(eks_name),
        image_tag_mutability="IMMUTABLE",  # a tag always means the same image
        image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
        encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS")],
        force_delete=not life.production,  # ephemeral stacks take their images with them
        opts=pulumi.ResourceOptions(provider=provider),
    )

    kube = pulumi.ResourceOptions(providers={"kubernetes": cluster.k8s_provider})
    both = pulumi.ResourceOptions(providers={"aws": provider, "kubernetes": cluster.k8s_provider})
    # The serving namespace: Pod Security admission at the strictest level its pods pass
    # (infra/k8s/pod_security.py), and its NetworkPolicies' default deny and DNS before any pod.
    namespace = k8s.core.v1.Namespace(
        f"{name}-serving",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=cfg.serving.namespace, labels=pod_security.namespace_labels(kubernetes_version, cfg.storage.type)
        ),
        opts=pulumi.ResourceOptions(provider=cluster.k8s_provider),
    )
    in_cluster = cfg.monitoring.deployed  # a monitoring release in the cluster: in-cluster, or amp's agent and Grafana
    service_cidr = cluster.cluster.kubernetes_network_config.apply(lambda c: c.service_ipv4_cidr)
    after_gpu_nodes = pulumi.ResourceOptions.merge(kube, pulumi.ResourceOptions(depends_on=[gpu_nodes]))
    monitoring = None
    if in_cluster:
        webhook_url = None
        if cfg.monitoring.alerts.receiver == "webhook":
            webhook_url = secret("alertWebhookUrl")
            if webhook_url is None:
                raise UserError(
                    "gpu-serving:monitoring.alerts.receiver is 'webhook' but gpu-serving:alertWebhookUrl is not set; set "
                    "it with `pulumi config set --secret gpu-serving:alertWebhookUrl <url>`, or set the receiver to none"
                )
        monitoring = Monitoring(
            f"{name}-monitoring",
            MonitoringArgs(
                sizing=sizing(prometheus_shape(cfg, plan), cfg.monitoring.retention_days),
                retention_days=cfg.monitoring.retention_days,
                serving_namespace=cfg.serving.namespace,
                operator_ports={ns: [p for t in targets for p in t.ports] for ns, targets in METRICS_TARGETS.items()},
                kubernetes_service_cidr=service_cidr,
                node_cidr=None if cfg.network.existing_vpc_id else cfg.network.vpc_cidr,
                webhook_url=webhook_url,
                # Rules and dashboards from the stack's SLA and plan (infra/monitoring/), for the serving RayCluster.
                rule_groups=prometheus_rule_groups(AlertSpec.from_stack(cfg, deployment, raycluster=ServingSpec.name)),
                dashboards=dashboards(dashboard_spec_from(cfg, plan, ray_cluster=ServingSpec.name)),
                amp=AmpArgs(
                    region=cfg.region,
                    account_id=account_id,
                    cluster_name=cluster.cluster_name,
                    tags=tags,
                    log_retention_days=life.log_retention_days,
                    production=life.production,
                    sns=cfg.monitoring.alerts.receiver == "sns",
                ) if cfg.monitoring.amp else None,
            ),
            # After the GPU nodes: Helm's wait covers node exporter there too. With amp, the AWS provider too.
            opts=pulumi.ResourceOptions.merge(after_gpu_nodes, both) if cfg.monitoring.amp else after_gpu_nodes,
        )
    operators = Operators(
        f"{name}-operators",
        OperatorsArgs(
            instance_type=plan.instance,
            # KubeRay acts in the serving namespace only (a Role there, no ClusterRole), and its release
            # waits for that namespace (the chart puts the Role and RoleBinding in it).
            kuberay_watch_namespaces=(cfg.serving.namespace,),
            kuberay_watch_namespace_resources=(namespace,),
            # The stack's Prometheus selects ServiceMonitors by its release label (infra/k8s/monitoring.py).
            dcgm_service_monitor=cfg.serving.monitoring == "podmonitor" or in_cluster,
            dcgm_monitor_labels=monitoring_values.MONITOR_LABELS if in_cluster else {},
            # The operators' namespaces' NetworkPolicies: the API server's ClusterIP comes from the service CIDR
            # EKS chose, and the metrics ports open to the serving metrics' clients (infra/k8s/network_policies.py).
            kubernetes_service_cidr=service_cidr,
            metrics_clients=metrics_clients(cfg),
        ),
        # After the GPU nodes: Helm's wait then covers the GPU DaemonSets, and on
        # destroy they go before the nodes. After the monitoring release: DCGM's ServiceMonitor needs its CRDs.
        opts=pulumi.ResourceOptions.merge(
            kube, pulumi.ResourceOptions(depends_on=[gpu_nodes, *([monitoring.release] if monitoring else [])])
        ),
    )
    namespace_policies = [
        k8s.networking.v1.NetworkPolicy(
            f"{name}-serving-{np['metadata']['name']}",
            metadata=np["metadata"],
            spec=np["spec"],
            opts=pulumi.ResourceOptions(provider=cluster.k8s_provider, depends_on=[namespace]),
        )
        for np in network_policies.namespace_policies(cfg.serving.namespace)
    ]
    in_namespace = [namespace, *namespace_policies]
    # The VPC's CIDR, when the stack makes the VPC (an existing VPC's is not in the config).
    vpc_cidr = None if cfg.network.existing_vpc_id else cfg.network.vpc_cidr
    # The weight-staging image (images/staging/, pushed by bin/build-image), or the config's digest.
    st = cfg.storage
    staging_tag = staging_image_tag()
    staging_image = st.staging_image or pulumi.Output.concat(repository.repository_url, ":", staging_tag)
    storage = ModelStorage(
        f"{name}-weights",
        ModelStorageArgs(
            kind=st.type,
            vpc_id=network.vpc_id,
            subnet_id=network.gpu_subnet_id,
            client_security_group_ids=[cluster.cluster_security_group_id, network.efa_security_group_id],
            storage=deployment.storage,
            production=life.production,
            namespace=cfg.serving.namespace,
            checkpoint=st.s3_uri if st.source == "s3" else _staged_checkpoint(cfg, deployment),
            source=st.source,
            staging_image=staging_image,
            staging_image_id=st.staging_image or staging_tag,
            vpc_cidr=vpc_cidr,
            hf_token=secret("hfToken") if st.source == "hf" else None,
            staging_run=st.staging_run,
            cluster_name=cluster.cluster_name,
            region=cfg.region,
            kms_key_arn=cluster.kms_key.arn,  # the stack's key: retained in production, as the weights are
            # What the EFS CSI driver's node plugin mounts with: the nodes' role (infra/aws/efs_access.py).
            mount_role_arn=cluster.node_role_arn,
        ),
        opts=pulumi.ResourceOptions.merge(both, pulumi.ResourceOptions(depends_on=[*in_namespace, *(addon for addon_name, addon in cluster.addons.items() if addon_name.endswith("csi-driver"))])),
    )
    image, check_image = _serving_image(cfg, repository, storage, provider)
    checks = cfg.checks
    spec = ServingSpec(
        deployment=deployment,
        namespace=cfg.serving.namespace,
        image=None,  # the Serving component fills in `image` below
        ray_version=cfg.serving.ray_version,
        pvc_name=storage.pvc_name,
        model_path=storage.model_path,
        marker_path=storage.marker_path,
        service_type=cfg.serving.service_type,
        monitoring=cfg.serving.monitoring,
        monitor_labels=monitoring_values.MONITOR_LABELS if in_cluster else {},
        suspended=cfg.serving.suspended,
        efa_check=checks.efa,
        nccl_busbw_floor_gbps=checks.nccl_bus_bandwidth_floor_gbps,
        vllm_version=cfg.serving.vllm_version,
        production=life.production,
        benchmark=checks.benchmark and not cfg.serving.suspended,  # nothing to measure while suspended
        ttft_p99_ms=cfg.serving.sla.ttft_p99_ms,
        tpot_p99_ms=cfg.serving.sla.tpot_p99_ms,
        **benchmark_load(plan),
        load_balancer_tags=tags,
        api_clients=_clients(cfg.serving.api_clients),
        metrics_clients=metrics_clients(cfg),
        dashboard_clients=_clients(cfg.serving.ray_dashboard_clients),
        vpc_cidr=vpc_cidr,
    )
    serving = Serving(
        f"{name}-serving",
        ServingArgs(
            spec=spec,
            # Created after, and deleted before, the operators (KubeRay must remove
            # its finalizers) and the weights.
            # With `podmonitor` the Serving component makes the PodMonitor: after the release's CRDs.
            depends_on=[*operators.releases, storage, *in_namespace,
                        *([monitoring.release] if monitoring and cfg.serving.monitoring == "podmonitor" else [])],
            # The EFA check needs the device plugins, not the weights: it runs while they are staged.
            check_depends_on=[*operators.releases, *in_namespace],
            image=image,
            check_image=check_image,
        ),
        opts=kube,
    )
    if monitoring is not None and cfg.serving.monitoring != "podmonitor":
        # The serving pods keep their scrape annotations (infra/config/monitoring.py); the stack's Prometheus
        # finds them through this PodMonitor, which the Serving component makes itself with `podmonitor`.
        pm = pod_monitor(spec)
        monitoring.pod_monitor = k8s.apiextensions.CustomResource(
            f"{name}-monitoring-podmonitor", api_version=pm["apiVersion"], kind=pm["kind"], metadata=pm["metadata"],
            spec=pm["spec"], opts=pulumi.ResourceOptions(parent=monitoring, depends_on=[monitoring.release, *in_namespace]),
        )  # fmt: skip
    if monitoring is not None:
        pulumi.export("grafanaService", monitoring.grafana_service)
        pulumi.export("grafanaPortForward", monitoring.grafana_port_forward)
        pulumi.export("grafanaAdminPassword", monitoring.grafana_admin_password)  # a secret; user `admin`
        pulumi.export("prometheusService", monitoring.prometheus_service)
        pulumi.export("prometheusPortForward", monitoring.prometheus_port_forward)
    if monitoring is not None and monitoring.workspace is not None:
        pulumi.export("ampWorkspaceId", monitoring.workspace.id)
        pulumi.export("ampQueryEndpoint", monitoring.workspace.prometheus_endpoint)
    if monitoring is not None and monitoring.alert_topic is not None:
        pulumi.export("alertTopicArn", monitoring.alert_topic.arn)  # subscribe the alerts' destination to it
    return Stack(
        monitoring=monitoring,
        provider=provider,
        network=network,
        cluster=cluster,
        gpu_nodes=gpu_nodes,
        image_repository=repository,
        operators=operators,
        storage=storage,
        serving=serving,
    )


def _serving_image(cfg: StackConfig, repository: aws.ecr.Repository, storage: pulumi.Resource,
                   provider: pulumi.ProviderResource) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
    """The serving image by digest, for the serving pods and the checks alike.

    The config's own image as given (by digest in production, infra/config/stack.py). Otherwise the
    image bin/build-image pushed to the stack's repository, by the digest its (immutable) tag holds,
    asked of ECR once the weight storage and the staging Job exist (the Job is not waited for:
    pulumi.com/skipAwait), which gives bin/build-image, run beside the first `pulumi up` of a new
    stack, the cluster's and the nodes' creation to push in (docs/deploying.md, Images); a tag not
    pushed yet fails the `up`, which then succeeds once it is. The EFA check runs the same digest:
    it is created beside the staging Job, so it still runs while the weights are staged.
    """
    if cfg.serving.image:
        return cfg.serving.image, cfg.serving.image
    tag = serving_image_tag(cfg.serving.vllm_version, cfg.serving.ray_version)
    pushed = aws.ecr.get_image_output(
        repository_name=repository.name,
        image_tag=tag,
        opts=pulumi.InvokeOutputOptions(provider=provider, depends_on=[storage]),
    )
    image = pulumi.Output.all(repository.repository_url, pushed.image_digest).apply(lambda a: by_digest(a[0], tag, a[1]))
    return image, image


def _staged_checkpoint(cfg: StackConfig, deployment: Deployment) -> str:
    """The Hugging Face checkpoint the staging Job downloads, at its pinned commit: the config's
    (for the model's own checkpoint) or the catalog's; refused unpinned when serving runs its code, or in production."""
    checkpoint = deployment.serve.checkpoint
    own = checkpoint.lower() == checkpoint_repo(cfg.model.name).lower()
    revision = (cfg.model.revision if own else None) or pinned_revision(checkpoint)
    if not own and not revision and cfg.lifecycle.production:
        # gpu-serving:model.revision names a commit of the model's own repository, not of a variant's.
        raise UserError(
            f"the plan stages {checkpoint}, a published variant of {cfg.model.name}'s checkpoint, and no commit of it is "
            "pinned; a production stack stages only pinned commits: pin it in infra/catalog/models.py (the entry's "
            "variants), or plan the model's own checkpoint (gpu-serving:model.weightFormat)"
        )
    return staged_checkpoint(checkpoint, revision, "--trust-remote-code" in deployment.serve.vllm_args,
                             production=cfg.lifecycle.production)
