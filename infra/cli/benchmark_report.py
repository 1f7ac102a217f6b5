"""`python -m infra benchmark-report`: the benchmark Job's outcome in the plan's terms.

The Job (infra/k8s/checks.py) writes its outcome, measured beside predicted, as one JSON
object to its container's termination message, which Kubernetes keeps in the pod's status,
and as the last line of its log (infra/k8s/scripts/benchmark.py, SUMMARY_PREFIX). This
command reads either:

    kubectl -n NS get pods -l job-name=NAME-benchmark -o json | python -m infra benchmark-report - --stack prod
    kubectl -n NS logs job/NAME-benchmark | python -m infra benchmark-report -

and prints each figure with its ratio to the prediction, the SLA verdict (on the
measurement alone), and with `--stack` what the measured throughput makes of the cost
per million output tokens and the config line that records it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from infra.errors import UserError
from infra.k8s.scripts.benchmark import SUMMARY_PREFIX

KUBECTL_HINT = "kubectl -n NAMESPACE get pods -l job-name=NAME-benchmark -o json"


@dataclass(frozen=True)
class Row:
    metric: str
    predicted: float | None
    measured: float | None

    @property
    def ratio(self) -> float | None:
        if self.predicted and self.measured is not None:
            return self.measured / self.predicted
        return None


def read_summary(text: str) -> dict:
    """The Job's summary from pod JSON (a Pod or a List of them: the newest container's
    termination message) or from its log (the last summary line)."""
    stripped = text.strip()
    if not stripped:
        raise UserError(f"nothing to read: pipe in `{KUBECTL_HINT}` or the Job's log")
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise UserError(f"not JSON: {e}") from None
        if "measured" in doc and "passed" in doc:
            return doc
        return _from_pods(doc)
    lines = [ln for ln in stripped.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    if not lines:
        raise UserError(f"no '{SUMMARY_PREFIX.strip()}' line in the log: the benchmark has not finished, or this is not its log")
    return _parse(lines[-1][len(SUMMARY_PREFIX):], "the log's summary line")


def _from_pods(doc: dict) -> dict:
    pods = doc.get("items", [doc]) if doc.get("kind") in ("List", "PodList", None) else [doc]
    pods = [p for p in pods if p.get("kind", "Pod") == "Pod"]
    if not pods:
        raise UserError(f"no pod in the input: the Job has not started, or its pods were deleted ({KUBECTL_HINT})")
    newest = max(pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp", ""))
    name = newest.get("metadata", {}).get("name", "the pod")
    for status in newest.get("status", {}).get("containerStatuses", []):
        terminated = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
        if terminated:
            message = terminated.get("message", "")
            if not message.lstrip().startswith("{"):
                raise UserError(f"{name} ended (exit {terminated.get('exitCode')}) without a summary; its log's tail: {message[-400:]}")
            return _parse(message, f"{name}'s termination message")
    raise UserError(f"{name} has not finished: no termination message yet")


def _parse(text: str, where: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not the benchmark's summary: {e}") from None
    if not isinstance(doc, dict) or "passed" not in doc:
        raise UserError(f"{where} is not the benchmark's summary (no 'passed')")
    return doc


def verdict_line(summary: dict) -> str:
    """The SLA verdict, on the measurement alone (the prediction never decides)."""
    sla = summary.get("sla") or {}
    thresholds = ", ".join(f"{label} p99 < {sla[key]:g} ms" for key, label in (("ttft_p99_ms", "TTFT"), ("tpot_p99_ms", "TPOT"))
                           if isinstance(sla.get(key), (int, float)))  # fmt: skip
    if summary.get("passed"):
        return f"SLA ({thresholds}): met by the measurement"
    return f"SLA ({thresholds}): missed: " + "; ".join(summary.get("problems") or ["no reason given"])


def rows(summary: dict) -> list[Row]:
    measured, predicted = summary.get("measured") or {}, summary.get("predicted") or {}
    return [Row(k, predicted.get(k), measured.get(k)) for k in sorted(set(measured) | set(predicted))]


def cost_at_measurement(summary: dict, stack: str, root=None) -> list[str]:
    """The stack's cost per million output tokens at the measured output throughput, and
    the config line that makes the plan use it."""
    from infra.catalog.instances import get_instance_type
    from infra.config import load_stack_file
    from infra.planning.cost import cost_lines

    measured = (summary.get("measured") or {}).get("output_throughput")
    if not measured:
        return ["no measured output_throughput: nothing to price"]
    req = load_stack_file(stack, root).plan_request()
    if req.nodes is None or req.instance_type is None:
        return [f"stack {stack} leaves its node count to the planner: price the measurement with `bin/plan`"]
    itype = get_instance_type(req.instance_type)
    c = cost_lines(
        price_usd_per_hour=itype.price_usd_per_hour, nodes=req.nodes,
        tco_categories=req.tco.categories if req.tco else None, api_price_usd_per_mtok=req.api_price_usd_per_mtok,
        throughput_tokens_per_s=measured, duty_cycle=req.duty_cycle,
    )  # fmt: skip
    per = c.usd_per_million_tokens
    lines = [f"cost per million output tokens at the measured {measured:,.0f} output tokens/s: ${per['cloud']:,.2f} cloud"
             + (f", ${per['tco']:,.2f} TCO" if per["tco"] is not None else "")]  # fmt: skip
    if c.breakeven:
        lines.append(f"break-even: {c.breakeven['verdict']}")
    lines.append(f"record it: gpu-serving:cost.throughputTokensPerSecond: {measured:.0f}  (Pulumi.{stack}.yaml)")
    return lines
