"""The per-stage memory budget as a stacked bar chart (PNG or SVG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402

from infra.planning import Plan  # noqa: E402

GiB = 2**30
# Bottom to top, the order vLLM takes memory in (CUDA graphs are captured after
# the KV cache is allocated, so the KV cache tops out near the usable line);
# headroom is what is left.
PARTS = [
    ("weights_bytes", "weights", "#4e79a7"),
    ("activation_bytes", "activation peak", "#f28e2b"),
    ("comm_buffer_bytes", "communication buffers", "#76b7b2"),
    ("kv_cache_bytes", "KV cache", "#59a14f"),
    ("cuda_overhead_bytes", "CUDA context, graphs, non-torch", "#e15759"),
    ("headroom_bytes", "headroom", "#bab0ac"),
]


def draw_budget(plan: Plan, path: Path) -> None:
    stages = plan.stages
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(stages) + 3), 5))
    labels = [f"stage {s.stage}\n({s.layers} layers)" for s in stages]
    bottoms = [0.0] * len(stages)
    for field, name, color in PARTS:
        values = [max(getattr(s, field), 0) / GiB for s in stages]
        ax.bar(labels, values, bottom=bottoms, label=name, color=color, width=0.6)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    if stages:
        visible = stages[0].gpu_visible_bytes / GiB
        ax.axhline(visible, color="black", linewidth=0.8, linestyle="--", label=f"visible to CUDA ({visible:.1f} GiB)")
        usable = stages[0].usable_bytes / GiB
        util = plan.knobs.gpu_memory_utilization
        ax.axhline(usable, color="grey", linewidth=0.8, linestyle=":", label=f"usable at utilization {util:.2f} ({usable:.1f} GiB)")
    lay = plan.layout
    ax.set_title(f"{plan.model.name} on {plan.nodes} x {plan.instance.name}: TP {lay.tp} x PP {lay.pp} x DP {lay.dp}", fontsize=10)
    ax.set_ylabel("GiB per GPU")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
