"""Moved to infra/planning/monitoring_sizing.py (the plan sizes the system nodes for Prometheus); kept for its importers."""

from infra.planning.monitoring_sizing import *  # noqa: F401,F403
from infra.planning.monitoring_sizing import Shape, Sizing, series, sizing  # noqa: F401
