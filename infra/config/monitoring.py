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
- `amp` (Amazon Managed Service for Prometheus): a workspace keeps the samples and
  evaluates the alerts; the cluster keeps the same chart with Prometheus in agent
  mode (scrape and remote write to the workspace, no local storage), Grafana
  querying the workspace, and no Alertmanager (components/monitoring.py). The
  serving and operator namespaces admit it to their metrics ports as above.
- `off`: no monitoring stack; `serving.monitoring` and `serving.metricsClients`
  work as before (for a Prometheus the stack does not own).

Alert receivers: `alerts.receiver` `none` (alerts show in Alertmanager and Grafana
only), `webhook` (in-cluster): Alertmanager posts to the URL in the secret key
`gpu-serving:alertWebhookUrl` (`pulumi config set --secret`), which reaches the
cluster only as a Kubernetes Secret Alertmanager reads the URL from (`url_file`),
never in plain Helm values or the state; or `sns` (amp): the workspace's alert
manager publishes to an SNS topic the stack makes (output `alertTopicArn`; subscribe
e-mail, HTTPS, a chat bot or a Lambda to it). AMP's alert manager has SNS as its
only receiver (AMP User Guide, "Understand SNS topic" under "Alert manager": "the
only supported receiver is Amazon Simple Notification Service"), so `amp` with
`webhook` is refused, naming `sns`; `sns` without `amp` is refused, naming `webhook`.

`alerts.slaWindow` and `alerts.slaFor`: the SLA alerts' p99 window (the `rate`
range) and how long the p99 must stay above the SLA before they fire (`for:`),
as Prometheus durations (infra/monitoring/alerts.py explains the 10m defaults).
"""

from __future__ import annotations

import re
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
RECEIVERS = ("none", "webhook", "sns")
# Prometheus' <duration> (Prometheus docs, "Configuration", "Configuration file": a duration matching
# `((([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?|0)`): units from the
# largest to the smallest, each at most once. promtool, which parses the rules with the same code, has the last
# word in tests/test_alerts.py.
PROMETHEUS_DURATION = re.compile(r"^(?=\d)((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$|^0$")
DEFAULT_SLA_WINDOW = "10m"
DEFAULT_SLA_FOR = "10m"


def _duration(value: object, *, zero: bool) -> object:
    """A Prometheus duration, or a one-line error naming the syntax (`zero`: whether 0 is a valid value)."""
    shown = repr(value).replace("{", "{{").replace("}", "}}")  # the message is a template: braces are literal
    if not isinstance(value, str) or not PROMETHEUS_DURATION.match(value):
        raise PydanticCustomError(
            "prometheus_duration",
            f"{shown} is not a Prometheus duration: a number and a unit (ms, s, m, h, d, w, y), units from the "
            "largest down, such as 10m or 1h30m",
        )
    if not zero and not re.search(r"[1-9]", value):
        raise PydanticCustomError("prometheus_duration", f"{shown}: the window must be longer than zero")
    return value


class AlertsConfig(_Area):
    """Where Alertmanager sends the stack's alerts."""

    receiver: Literal["none", "webhook", "sns"] = Field(
        default="none",
        description="`none`: alerts show in Alertmanager (or the workspace) and Grafana only; `webhook` (mode "
        f"in-cluster): Alertmanager also posts them to the URL in the secret `gpu-serving:{WEBHOOK_SECRET_KEY}` "
        "(Slack, PagerDuty, Opsgenie and others take webhooks); `sns` (mode amp): the workspace's alert manager "
        "publishes them to an SNS topic the stack makes (output `alertTopicArn`), the only receiver AMP has.",
    )
    sla_window: str = Field(
        default=DEFAULT_SLA_WINDOW,
        json_schema_extra={"allowed": "a Prometheus duration longer than zero, such as 5m or 1h"},
        description="The window of the SLA alerts' p99 (TTFT, TPOT, ITL): the range of the `rate` over vLLM's "
        "histograms, a Prometheus duration such as 10m.",
    )
    sla_for: str = Field(
        default=DEFAULT_SLA_FOR,
        json_schema_extra={"allowed": "a Prometheus duration, such as 10m or 0"},
        description="How long the p99 must stay above the SLA before the SLA alerts fire (their `for:`), a Prometheus "
        "duration such as 10m (0 fires at the first evaluation).",
    )

    @field_validator("sla_window", mode="before")
    @classmethod
    def _window(cls, v: object) -> object:
        return _duration(v, zero=False)

    @field_validator("sla_for", mode="before")
    @classmethod
    def _for(cls, v: object) -> object:
        return _duration(v, zero=True)


class MonitoringConfig(_Area):
    """`gpu-serving:monitoring`: Prometheus, Alertmanager and Grafana for the stack."""

    mode: MonitoringMode = Field(  # type: ignore[valid-type]
        default=IN_CLUSTER,
        description="`in-cluster`: kube-prometheus-stack in the `monitoring` namespace on the system nodes (it implies "
        "the serving PodMonitor and admits its Prometheus to the metrics ports besides `serving.metricsClients`); "
        "`amp`: an Amazon Managed Service for Prometheus workspace keeps the samples and evaluates the alerts, the "
        "cluster's Prometheus only scrapes and remote-writes to it (agent mode, no volume) and Grafana queries it; "
        "`off`: none (`serving.monitoring` and `serving.metricsClients` then serve a Prometheus of your own).",
    )
    retention_days: int = Field(
        default=DEFAULT_RETENTION_DAYS,
        ge=1,
        le=365,
        description="Days Prometheus keeps its samples; sizes its volume (Prometheus' own default, 15 days, holds two "
        "weeks of a weekly traffic cycle). With `amp`, the workspace's retention.",
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
        receiver = self.alerts.receiver
        if self.mode == AMP and receiver == "webhook":
            raise PydanticCustomError(
                "monitoring_not_available",
                "'webhook' is not available with mode amp: the workspace's alert manager sends only to Amazon SNS; set "
                "the receiver to sns (the stack makes a topic: subscribe your endpoint to it) or the mode to in-cluster",
                {"loc": ("monitoring", "alerts", "receiver")},
            )
        if self.mode == IN_CLUSTER and receiver == "sns":
            raise PydanticCustomError(
                "monitoring_not_available",
                "'sns' is the receiver of mode amp; with in-cluster, set it to webhook (and the secret "
                f"gpu-serving:{WEBHOOK_SECRET_KEY}) or none",
                {"loc": ("monitoring", "alerts", "receiver")},
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

    @property
    def amp(self) -> bool:
        return self.mode == AMP

    @property
    def deployed(self) -> bool:
        """A monitoring release in the cluster (in-cluster or amp: both have Prometheus and Grafana there)."""
        return self.mode != OFF
