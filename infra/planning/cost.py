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
    usd_per_million_tokens: float | None  # at the configured throughput
    breakeven_tokens_per_month: float | None  # against the API price
    breakeven_tokens_per_day: float | None
    api_price_usd_per_mtok: float | None
    throughput_tokens_per_s: float | None



def cost_per_million_tokens(monthly_usd: float, tokens_per_second: float) -> float:
    return monthly_usd / (tokens_per_second * SECONDS_PER_MONTH) * 1e6


def breakeven_tokens_per_month(monthly_usd: float, api_usd_per_mtok: float) -> float:
    """Tokens a month at which paying the API would cost as much as running the cluster."""
    return monthly_usd / api_usd_per_mtok * 1e6


def cost_lines(
    *,
    price_usd_per_hour: float,
    nodes: int,
    tco_categories: dict[str, float] | None,
    api_price_usd_per_mtok: float | None,
    throughput_tokens_per_s: float | None,
) -> CostLines:
    hourly = price_usd_per_hour * nodes
    monthly = hourly * HOURS_PER_MONTH
    tco = float(sum(tco_categories.values())) if tco_categories else None
    basis = tco if tco is not None else monthly
    per_mtok = cost_per_million_tokens(basis, throughput_tokens_per_s) if throughput_tokens_per_s else None
    be_month = breakeven_tokens_per_month(basis, api_price_usd_per_mtok) if api_price_usd_per_mtok else None
    return CostLines(
        hourly_usd=hourly,
        monthly_usd=monthly,
        tco_monthly_usd=tco,
        tco_categories=dict(tco_categories or {}),
        basis_monthly_usd=basis,
        usd_per_million_tokens=per_mtok,
        breakeven_tokens_per_month=be_month,
        breakeven_tokens_per_day=be_month / DAYS_PER_MONTH if be_month is not None else None,
        api_price_usd_per_mtok=api_price_usd_per_mtok,
        throughput_tokens_per_s=throughput_tokens_per_s,
    )
