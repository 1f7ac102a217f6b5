"""Cost model: cluster price, total cost of ownership, cost per token, break-even."""

from __future__ import annotations

from dataclasses import dataclass

# AWS bills and quotes monthly figures at 730 hours a month (365 x 24 / 12).
HOURS_PER_MONTH = 730.0
DAYS_PER_MONTH = HOURS_PER_MONTH / 24.0
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600.0


@dataclass(frozen=True)
class CostLines:
    hourly_usd: float  # cloud on-demand price of the cluster's GPU nodes
    monthly_usd: float  # the same over a month of HOURS_PER_MONTH
    tco_monthly_usd: float | None  # total cost of ownership, when categories are given
    tco_categories: dict[str, float]
    basis_monthly_usd: float  # what the per-token figures use: TCO if given, else cloud
    # Output tokens/s the per-token figures use: the measurement when given, else the
    # prediction at the SLA capacity; and each of the two (None when absent).
    throughput_tokens_per_s: float | None
    measured_tokens_per_s: float | None
    predicted_tokens_per_s: float | None
    throughput_source: str  # "measured", "predicted" or "none"
    usd_per_million_tokens: dict[str, float | None]  # {"cloud": ..., "tco": ...} per million output tokens
    duty_cycle: float
    capacity_tokens_per_month: float | None  # output tokens a month at that throughput and duty cycle
    breakeven: dict  # {"tokens_per_month", "tokens_per_day", "share_of_capacity", "verdict"} against the API price
    api_price_usd_per_mtok: float | None

    @property
    def breakeven_tokens_per_month(self) -> float | None:
        return self.breakeven.get("tokens_per_month")


def cost_per_million_tokens(monthly_usd: float, tokens_per_second: float) -> float:
    return monthly_usd / (tokens_per_second * SECONDS_PER_MONTH) * 1e6


def breakeven_tokens_per_month(monthly_usd: float, api_usd_per_mtok: float) -> float:
    """Tokens a month at which paying the API would cost as much as running the cluster."""
    return monthly_usd / api_usd_per_mtok * 1e6


def breakeven_verdict(breakeven: float, capacity: float | None, api_usd_per_mtok: float, usd_per_mtok: float | None) -> str:
    """Whether the cluster can produce its break-even volume within the SLA. More clusters do
    not help one that cannot: each costs as much and produces as much."""
    if capacity is None or capacity <= 0:
        return "no throughput within the SLA is known, so nothing says whether the break-even is reachable"
    share = breakeven / capacity
    if share <= 1.0:
        return (f"this cluster produces at most {_tokens(capacity)} output tokens/month within the SLA: "
                f"the break-even of {_tokens(breakeven)} needs {share:.0%} of it")  # fmt: skip
    return (f"cannot reach the break-even within the SLA: it would need {share:.1f}x the {_tokens(capacity)} output "
            f"tokens/month this cluster produces at most; at that most, a million output tokens costs "
            f"${usd_per_mtok:,.2f} against the API's ${api_usd_per_mtok:,.2f}")  # fmt: skip


def _tokens(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.2f}{unit}"
    return f"{n:,.0f}"


def cost_lines(
    *,
    price_usd_per_hour: float,
    nodes: int,
    tco_categories: dict[str, float] | None,
    api_price_usd_per_mtok: float | None,
    throughput_tokens_per_s: float | None,
    predicted_tokens_per_s: float | None = None,
    duty_cycle: float = 1.0,
) -> CostLines:
    """`throughput_tokens_per_s` is a measurement (the config's); `predicted_tokens_per_s` the
    plan's output tokens/s at the SLA capacity. The measurement wins when both are given."""
    hourly = price_usd_per_hour * nodes
    monthly = hourly * HOURS_PER_MONTH
    tco = float(sum(tco_categories.values())) if tco_categories else None
    basis = tco if tco is not None else monthly
    used = throughput_tokens_per_s or predicted_tokens_per_s
    source = "measured" if throughput_tokens_per_s else "predicted" if predicted_tokens_per_s else "none"
    per_mtok = {
        "cloud": cost_per_million_tokens(monthly, used * duty_cycle) if used else None,
        "tco": cost_per_million_tokens(tco, used * duty_cycle) if used and tco is not None else None,
    }
    capacity = used * duty_cycle * SECONDS_PER_MONTH if used else None
    breakeven: dict = {}
    if api_price_usd_per_mtok:
        be = breakeven_tokens_per_month(basis, api_price_usd_per_mtok)
        breakeven = {
            "tokens_per_month": be,
            "tokens_per_day": be / DAYS_PER_MONTH,
            "share_of_capacity": be / capacity if capacity else None,
            "verdict": breakeven_verdict(be, capacity, api_price_usd_per_mtok, per_mtok["tco" if tco is not None else "cloud"]),
        }
    return CostLines(
        hourly_usd=hourly,
        monthly_usd=monthly,
        tco_monthly_usd=tco,
        tco_categories=dict(tco_categories or {}),
        basis_monthly_usd=basis,
        throughput_tokens_per_s=used,
        measured_tokens_per_s=throughput_tokens_per_s,
        predicted_tokens_per_s=predicted_tokens_per_s,
        throughput_source=source,
        usd_per_million_tokens=per_mtok,
        duty_cycle=duty_cycle,
        capacity_tokens_per_month=capacity,
        breakeven=breakeven,
        api_price_usd_per_mtok=api_price_usd_per_mtok,
    )
