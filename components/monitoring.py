"""The in-cluster monitoring stack (`gpu-serving:monitoring` mode `in-cluster`, issue 20).

One `Monitoring` component (`gpu-serving:k8s:Monitoring`) creates, in this order:

- the `monitoring` namespace (labelled privileged for Pod Security admission: node exporter
  runs in the host's network and PID namespaces with host paths mounted);
- its NetworkPolicies (infra/k8s/monitoring.py `namespace_policies`: deny by default, DNS,
  the API server, the namespace's pods with each other, Prometheus to its scrape targets,
  the API server to the operator's admission webhook, Alertmanager to a webhook receiver);
- Grafana's admin credentials: a `random.RandomPassword` (kept in the state as a secret,
  exported as the secret output `grafanaAdminPassword`) in a Secret the chart reads
  (`grafana.admin.existingSecret`), so the password is never in Helm values;
- with a webhook receiver, a Secret holding its URL (the secret config `alertWebhookUrl`),
  which Alertmanager reads as a file (`url_file`);
- the `gp3` StorageClass Prometheus' volume claims (EBS CSI, encrypted, bound where the pod
  lands). The EBS CSI driver itself is the cluster's add-on (components/cluster.py), not this component's;
- the kube-prometheus-stack release (infra/k8s/helm_values.py KUBE_PROMETHEUS_STACK, values
  from infra/k8s/monitoring.py), after all of the above;
- a PrometheusRule with `rule_groups` and one ConfigMap a Grafana dashboard (`dashboards`),
  both after the release (its CRDs, its Grafana sidecar), when given.

With `amp` (`gpu-serving:monitoring.mode: amp`, infra/aws/amp.py and infra/k8s/monitoring.py
`amp_values`), before the release: a KMS key and the encrypted log group the workspace logs its
rule evaluation and alert manager errors to; an Amazon Managed Service for Prometheus workspace
(tagged, logging there) and its configuration (`retentionDays` as its retention); for each of
Prometheus' and Grafana's service accounts an IAM role EKS Pod Identity assumes, an inline policy
on that workspace alone (remote write; the query actions) and the Pod Identity association (it
must exist before the pod starts: Pod Identity injects credentials only into pods created
after it). No StorageClass (the agent keeps no volume). Instead of the PrometheusRule, the same
groups as the workspace's rule groups namespace; with `sns`, an SNS topic encrypted with the same
key, its policy (AMP publishes for this workspace only) and the workspace's alert manager
definition routing every alert to it.

`release` is exposed for `depends_on`: whatever creates a PodMonitor or ServiceMonitor (the
serving layer, the GPU operator's DCGM ServiceMonitor) waits for the release's CRDs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pulumi_random as random

from components.pod_identity import PodIdentityNames, pod_identity
from components.protection import encrypted_log_group, kms_key
from infra.aws import amp as amp_data
from infra.aws.iam import key_policy
from infra.k8s import monitoring as mon, network_policies
from infra.k8s.helm_values import KUBE_PROMETHEUS_STACK
from infra.k8s.monitoring_sizing import Sizing

TYPE = "gpu-serving:k8s:Monitoring"
GRAFANA_ADMIN_SECRET = "grafana-admin"
WEBHOOK_SECRET = "alertmanager-webhook"
RULE_NAME = "gpu-serving"
PASSWORD_LENGTH = 32
NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "privileged"}
# Helm waits for the operator, Grafana and kube-state-metrics Deployments and the node exporter DaemonSet on every
# node (GPU nodes included); Prometheus and Alertmanager are the operator's StatefulSets, not Helm's, so a volume
# that takes long to bind does not hold `pulumi up`.
RELEASE_TIMEOUT_S = 600


@dataclass(frozen=True)
class AmpArgs:
    """The workspace's place: the stack's region, account and cluster (for Pod Identity), tags and log retention."""

    region: str
    account_id: pulumi.Input[str]
    cluster_name: pulumi.Input[str]
    tags: Mapping[str, str]
    log_retention_days: int
    production: bool
    sns: bool = False  # receiver `sns`: an alert topic and the workspace's alert manager definition


@dataclass(frozen=True)
class MonitoringArgs:
    sizing: Sizing
    retention_days: int
    serving_namespace: str
    operator_ports: Mapping[str, Sequence[int]]  # the operators' namespaces -> their metrics ports (METRICS_TARGETS)
    # The cluster's service CIDR (the API server's ClusterIP for the NetworkPolicies) and the nodes' CIDR (the VPC's;
    # None when the stack does not own the VPC: the node ports are then open to anywhere, module doc of monitoring.py).
    kubernetes_service_cidr: pulumi.Input[str]
    node_cidr: Optional[str] = None
    webhook_url: Optional[pulumi.Input[str]] = None  # a secret Output
    rule_groups: Sequence[Mapping[str, Any]] = ()
    dashboards: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    amp: Optional[AmpArgs] = None


def amp_log_group_name(name: str) -> str:
    """The workspace's log group: under /aws/vendedlogs/, the prefix CloudWatch Logs gives logs AWS services deliver
    (CloudWatch Logs User Guide, "Enable logging from AWS services": such groups share one short resource policy)."""
    return f"/aws/vendedlogs/prometheus/{name}"


def storage_class() -> dict:
    """gp3 through the EBS CSI driver: encrypted, bound in the zone the pod is scheduled in, expandable."""
    return {
        "metadata": {"name": mon.STORAGE_CLASS},
        "provisioner": "ebs.csi.aws.com",
        "parameters": {"type": "gp3", "encrypted": "true"},
        "reclaim_policy": "Delete",
        "volume_binding_mode": "WaitForFirstConsumer",
        "allow_volume_expansion": True,
    }


def prometheus_rule(groups: Sequence[Mapping[str, Any]]) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULE_NAME, "namespace": mon.NAMESPACE, "labels": dict(mon.MONITOR_LABELS)},
        "spec": {"groups": [dict(g) for g in groups]},
    }


def dashboard_config_map(file_name: str, dashboard: Mapping[str, Any]) -> dict:
    """One dashboard (`serving.json`) in a ConfigMap the Grafana sidecar provisions (its default label)."""
    stem = file_name.removesuffix(".json")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"dashboard-{stem}", "namespace": mon.NAMESPACE, "labels": {mon.DASHBOARD_LABEL: mon.DASHBOARD_LABEL_VALUE}},
        "data": {file_name: json.dumps(dashboard, indent=2, sort_keys=True)},
    }


class Monitoring(pulumi.ComponentResource):
    """kube-prometheus-stack in the `monitoring` namespace, its policies, credentials, rules and dashboards."""

    release: k8s.helm.v3.Release
    pod_monitor: Optional[k8s.apiextensions.CustomResource] = None  # the serving PodMonitor, when stack.py makes it here

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ns = mon.NAMESPACE
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata=k8s.meta.v1.ObjectMetaArgs(name=ns, labels=dict(NAMESPACE_LABELS)), opts=child
        )
        in_ns = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.namespace]))
        api_server = pulumi.Output.from_input(args.kubernetes_service_cidr).apply(network_policies.kubernetes_service_ip)
        self.network_policies = [
            k8s.networking.v1.NetworkPolicy(f"{name}-np-{p['metadata']['name']}", metadata=p["metadata"], spec=p["spec"], opts=in_ns)
            for p in mon.namespace_policies(
                api_server_cidrs=[api_server],
                node_cidr=args.node_cidr,
                serving_namespace=args.serving_namespace,
                operator_ports=dict(args.operator_ports),
                webhook=args.webhook_url is not None,
                amp=args.amp is not None,
            )
        ]

        # Made once per stack: nothing in its inputs changes, so it never rotates by accident.
        password = random.RandomPassword(f"{name}-grafana-admin", length=PASSWORD_LENGTH, special=False, opts=child)
        self.grafana_admin_password = pulumi.Output.secret(password.result)
        admin = k8s.core.v1.Secret(
            f"{name}-grafana-admin",
            metadata={"name": GRAFANA_ADMIN_SECRET, "namespace": ns},
            type="Opaque",
            string_data={mon.ADMIN_USER_KEY: mon.ADMIN_USER, mon.ADMIN_PASSWORD_KEY: self.grafana_admin_password},
            opts=in_ns,
        )
        before_release: list[pulumi.Resource] = [self.namespace, *self.network_policies, admin]
        self.workspace: Optional[aws.amp.Workspace] = None
        self.alert_topic: Optional[aws.sns.Topic] = None
        amp_values = None
        if args.amp is not None:
            before_release += self._amp(name, args, args.amp, child)
            assert self.workspace is not None
            endpoint = self.workspace.prometheus_endpoint
            amp_values = mon.AmpValues(remote_write_url=endpoint.apply(amp_data.remote_write_url), query_url=endpoint,
                                       region=args.amp.region)  # fmt: skip
        webhook_secret = None
        if args.webhook_url is not None:
            webhook_secret = WEBHOOK_SECRET
            before_release.append(
                k8s.core.v1.Secret(
                    f"{name}-alertmanager-webhook",
                    metadata={"name": WEBHOOK_SECRET, "namespace": ns},
                    type="Opaque",
                    string_data={mon.WEBHOOK_URL_KEY: pulumi.Output.secret(args.webhook_url)},
                    opts=in_ns,
                )
            )
        if args.amp is None:  # the agent keeps no volume
            sc = storage_class()
            before_release.append(
                k8s.storage.v1.StorageClass(
                    f"{name}-storage-class",
                    metadata=sc["metadata"],
                    provisioner=sc["provisioner"],
                    parameters=sc["parameters"],
                    reclaim_policy=sc["reclaim_policy"],
                    volume_binding_mode=sc["volume_binding_mode"],
                    allow_volume_expansion=sc["allow_volume_expansion"],
                    opts=child,
                )
            )
        values = mon.kube_prometheus_stack_values(args.sizing, args.retention_days, GRAFANA_ADMIN_SECRET, webhook_secret,
                                                  amp=amp_values)  # fmt: skip
        chart = KUBE_PROMETHEUS_STACK
        self.release = k8s.helm.v3.Release(
            f"{name}-{chart.release}",
            name=chart.release,
            chart=chart.chart,
            version=chart.version,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository),
            namespace=self.namespace.metadata.name,
            values=values,
            atomic=False,
            cleanup_on_fail=False,
            timeout=RELEASE_TIMEOUT_S,
            max_history=10,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=before_release, delete_before_replace=True)
            ),
        )
        after_release = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.release]))
        self.rule = None
        self.rule_groups_namespace: Optional[aws.amp.RuleGroupNamespace] = None
        if args.rule_groups and self.workspace is not None:
            # The same groups, evaluated by the workspace (module doc); no release to wait for.
            self.rule_groups_namespace = aws.amp.RuleGroupNamespace(
                f"{name}-amp-rules", name=RULE_NAME, workspace_id=self.workspace.id,
                data=amp_data.rule_groups_namespace_data(args.rule_groups), opts=child,
            )  # fmt: skip
        elif args.rule_groups:
            rule = prometheus_rule(args.rule_groups)
            self.rule = k8s.apiextensions.CustomResource(
                f"{name}-rules", api_version=rule["apiVersion"], kind=rule["kind"], metadata=rule["metadata"],
                spec=rule["spec"], opts=after_release,
            )  # fmt: skip
        self.dashboards = [
            k8s.core.v1.ConfigMap(f"{name}-{cm['metadata']['name']}", metadata=cm["metadata"], data=cm["data"], opts=after_release)
            for cm in (dashboard_config_map(k, d if args.amp is None else mon.for_datasource_type(d, mon.AMP_PLUGIN))
                       for k, d in sorted(args.dashboards.items()))
        ]

        self.grafana_service = pulumi.Output.from_input(mon.GRAFANA_SERVICE)
        self.prometheus_service = pulumi.Output.from_input(mon.PROMETHEUS_SERVICE)
        self.grafana_port_forward = mon.port_forward(mon.GRAFANA_SERVICE, mon.GRAFANA_LOCAL_PORT, mon.GRAFANA_PORT)
        self.prometheus_port_forward = mon.port_forward(mon.PROMETHEUS_SERVICE, mon.PROMETHEUS_PORT, mon.PROMETHEUS_PORT)
        self.register_outputs(
            {
                "release_status": self.release.status,
                **({"workspace_id": self.workspace.id} if self.workspace is not None else {}),
                "grafana_service": self.grafana_service,
                "prometheus_service": self.prometheus_service,
                "grafana_admin_password": self.grafana_admin_password,
            }
        )

    def _amp(self, name: str, args: MonitoringArgs, amp: AmpArgs, child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """The workspace, its log group and key, alerting, and the two Pod Identity roles (module doc); returns what
        the release waits for (the associations)."""
        region, tags, group = amp.region, dict(amp.tags), amp_log_group_name(name)
        account = pulumi.Output.from_input(amp.account_id)

        def policy(account_id: str) -> str:
            base = key_policy(region, account_id, log_group_names=[group])
            return amp_data.with_amp_key_use(base, account_id) if amp.sns else base

        key = kms_key(f"{name}-amp-key", description=f"{name}: the AMP workspace's logs and alerts",
                      policy=account.apply(policy), tags=tags, opts=child, production=amp.production)  # fmt: skip
        logs = encrypted_log_group(f"{name}-amp-logs", name=group, key=key, retention_in_days=amp.log_retention_days,
                                   tags=tags, opts=child, production=amp.production)  # fmt: skip
        self.workspace = aws.amp.Workspace(
            f"{name}-amp",
            alias=name,
            # The Terraform provider's aws_prometheus_workspace example: the group's ARN with `:*`.
            logging_configuration=aws.amp.WorkspaceLoggingConfigurationArgs(log_group_arn=logs.arn.apply(lambda a: f"{a}:*")),
            tags=tags,
            # The samples are the stack's history: protected in production, not retained (a kept workspace bills).
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(protect=amp.production)),
        )
        aws.amp.WorkspaceConfiguration(
            f"{name}-amp-config", workspace_id=self.workspace.id, retention_period_in_days=args.retention_days, opts=child
        )
        if amp.sns:
            self._alerting(name, amp, key, account, child)
        return [
            self._pod_identity(name, "prometheus", mon.PROMETHEUS_SERVICE_ACCOUNT, amp_data.remote_write_policy, amp, tags, child),
            self._pod_identity(name, "grafana", mon.GRAFANA_SERVICE_ACCOUNT, amp_data.query_policy, amp, tags, child),
        ]

    def _alerting(self, name: str, amp: AmpArgs, key: aws.kms.Key, account: pulumi.Output, child: pulumi.ResourceOptions) -> None:
        assert self.workspace is not None
        self.alert_topic = aws.sns.Topic(f"{name}-alerts", kms_master_key_id=key.arn, tags=dict(amp.tags), opts=child)
        topic_policy = aws.sns.TopicPolicy(
            f"{name}-alerts-policy",
            arn=self.alert_topic.arn,
            policy=pulumi.Output.all(self.alert_topic.arn, self.workspace.arn, account).apply(lambda a: amp_data.topic_policy(*a)),
            opts=child,
        )
        aws.amp.AlertManagerDefinition(
            f"{name}-amp-alerts",
            workspace_id=self.workspace.id,
            definition=self.alert_topic.arn.apply(lambda arn: amp_data.alert_manager_definition(arn, amp.region)),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[topic_policy])),
        )

    def _pod_identity(self, name: str, who: str, service_account: str, policy_of: Any, amp: AmpArgs,
                      tags: dict[str, str], child: pulumi.ResourceOptions) -> aws.eks.PodIdentityAssociation:  # fmt: skip
        """A role EKS Pod Identity gives `service_account` in the monitoring namespace, with `policy_of(workspace ARN)`."""
        assert self.workspace is not None
        return pod_identity(
            PodIdentityNames(f"{name}-{who}-amp-role", f"{name}-{who}-amp-policy", f"{name}-{who}-amp-identity"),
            cluster_name=amp.cluster_name, namespace=mon.NAMESPACE, service_account=service_account,
            description=f"{mon.NAMESPACE}/{service_account}: the stack's AMP workspace",
            policy=self.workspace.arn.apply(policy_of), tags=tags, opts=child,
        )  # fmt: skip
