"""The throughput-interactivity curve: output tokens/s per GPU against tokens/s per user."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402


def draw_curve(points: list[dict], path: Path, *, title: str, sla_tpot_ms: float | None = None) -> None:
    """One marker per point (labelled with its load); the SLA's TPOT as the vertical line
    of the slowest per-user speed it allows (1000 / TPOT tokens/s)."""
    xs = [p["output_tokens_per_s_per_user"] or 0.0 for p in points]
    ys = [p["output_tokens_per_s_per_gpu"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, ys, marker="o", color="#4e79a7")
    for p, x, y in zip(points, xs, ys):
        label = f"C={p['concurrency']}" if p["concurrency"] else f"{p['request_rate']:g}/s"
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if sla_tpot_ms:
        ax.axvline(1000.0 / sla_tpot_ms, color="#e15759", linestyle="--", label=f"SLA: TPOT {sla_tpot_ms:g} ms")
        ax.legend(loc="upper right")
    ax.set_xlabel("output tokens/s per user (1000 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
