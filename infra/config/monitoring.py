"""`gpu-serving:monitoring`: the stack's own monitoring (issue 20).

`mode`:
- `in-cluster` (the default): kube-prometheus-stack in the `monitoring` namespace
  (components/monitoring.py). It implies, whatever `serving.monitoring` says, the
  serving PodMonitor and the DCGM exporter's ServiceMonitor, and it admits the
  monitoring namespace's Prometheus to the metrics ports of the serving and the
  operators' namespaces on top of `serving.metricsClients` (which keeps naming any
  other scraper). `serving.monitoring: annotations` keeps the scrape annotations
  on the serving pods as well: they cost nothing, and taking them off would change
  the RayCluster's pod templates, which KubeRay's Recreate strategy answers by
  restarting every serving pod; so a stack file written before this area gains
  monitoring without its serving pods being touched.
- `amp` (Amazon Managed Service for Prometheus): not built yet; refused with a
  message rather than silently deploying nothing.
- `off`: no monitoring stack; `serving.monitoring` and `serving.metricsClients`
  work as before (for a Prometheus the stack does not own).

Alert receivers: `alerts.receiver` `none` (alerts show in Alertmanager and Grafana
only) or `webhook`: Alertmanager posts to the URL in the secret key
`gpu-serving:alertWebhookUrl` (`pulumi config set --secret`), which reaches the
cluster only as a Kubernetes Secret Alertmanager reads the URL from (`url_file`),
never in plain Helm values or the state.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from infra.config.base import _Area

IN_CLUSTER = "in-cluster"
AMP = "amp"
OFF = "off"
MONITORING_MODES = (IN_CLUSTER, AMP, OFF)
MonitoringMode = Literal["in-cluster", "amp", "off"]

# Prometheus' own default (`--storage.tsdb.retention.time`, "15d", Prometheus docs, "Storage",
# "Operational aspects"): two weeks and a day hold this weekday of last week and the week
# before, to tell a regression from the weekly traffic cycle; at prod's estimated series
# count it is about 11 GiB of TSDB (infra/k8s/monitoring_sizing.py). The chart's own default is 10d.
DEFAULT_RETENTION_DAYS = 15
WEBHOOK_SECRET_KEY = "alertWebhookUrl"


class AlertsConfig(_Area):
    """Where Alertmanager sends the stack's alerts."""

    receiver: Literal["none", "webhook"] = Field(
        default="none",
        description="`none`: alerts show in Alertmanager and Grafana only; `webhook`: Alertmanager also posts them to "
        f"the URL in the secret `gpu-serving:{WEBHOOK_SECRET_KEY}` (Slack, PagerDuty, Opsgenie and others take webhooks).",
    )


class MonitoringConfig(_Area):
    """`gpu-serving:monitoring`: Prometheus, Alertmanager and Grafana for the stack."""

    mode: MonitoringMode = Field(  # type: ignore[valid-type]
        default=IN_CLUSTER,
        description="`in-cluster`: kube-prometheus-stack in the `monitoring` namespace on the system nodes (it implies "
        "the serving PodMonitor and admits its Prometheus to the metrics ports besides `serving.metricsClients`); "
        "`amp`: Amazon Managed Service for Prometheus (not available yet); `off`: none (`serving.monitoring` and "
        "`serving.metricsClients` then serve a Prometheus of your own).",
    )
    retention_days: int = Field(
        default=DEFAULT_RETENTION_DAYS,
        ge=1,
        le=365,
        description="Days Prometheus keeps its samples; sizes its volume (Prometheus' own default, 15 days, holds two "
        "weeks of a weekly traffic cycle).",
    )
    alerts: AlertsConfig = Field(
        default_factory=lambda: AlertsConfig(), description="Where Alertmanager sends alerts."
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _unquoted_off(cls, v: object) -> object:
        # YAML 1.1 (PyYAML, the offline tools) reads an unquoted `off` as false; Pulumi's YAML keeps the string.
        return OFF if v is False else v

    @model_validator(mode="after")
    def _available(self) -> "MonitoringConfig":
        if self.mode == AMP:
            raise PydanticCustomError(
                "monitoring_not_available",
                "'amp' (Amazon Managed Service for Prometheus) is not available yet; use in-cluster (Prometheus, "
                "Alertmanager and Grafana in the cluster) or off",
                {"key": "mode"},
            )
        if self.mode == OFF and self.alerts.receiver != "none":
            raise PydanticCustomError(
                "monitoring_not_available",
                "a receiver '{receiver}' is set but monitoring is off: nothing would send to it; set mode to "
                "in-cluster or the receiver to none",
                {"loc": ("monitoring", "alerts", "receiver"), "receiver": self.alerts.receiver},
            )
        return self

    @property
    def in_cluster(self) -> bool:
        return self.mode == IN_CLUSTER
