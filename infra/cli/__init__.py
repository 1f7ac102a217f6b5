"""`python -m infra ...`: the command line (commands in app.py, the budget plot in budget_plot.py)."""

from infra.cli.app import app, main

__all__ = ["app", "main"]
