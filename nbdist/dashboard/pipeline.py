"""The pipeline timeline (`--mode pipeline`): forward, backward and update of each micro-batch
per stage across one step, like a Gantt chart, with idle time as the gaps, and the measured
bubble fraction next to its ideal (S - 1) / (M + S - 1) and each stage's utilisation.

Pure: plain dicts in (the stages' reported `[kind, micro-batch, start, end]` timings), a
plotly figure dict out.
"""

from __future__ import annotations

from nbdist.core.partition import ideal_bubble
from nbdist.dashboard.style import empty_figure, layout

KIND_NAMES = {"F": "forward", "B": "backward", "U": "optimizer step"}
KIND_COLORS = {"F": "#4C78A8", "B": "#F58518", "U": "#54A24B"}
TITLE = "pipeline timeline"


def pipeline_summary(info: dict, stages: int, micro_batches: int) -> dict:
    """Bubble fraction measured over the complete steps (1 - busy / (S x wall)), its ideal, and
    each stage's utilisation (busy / wall); with the messages each stage sent, and what each
    stage and the kernel refused (by reason: see nbdist.modes.pipeline.link and .kernel_link).

    Example:
        >>> s = pipeline_summary({"busy": [3.0, 1.0], "wall": 4.0, "measured_steps": 2}, 2, 2)
        >>> s["bubble"], s["utilisation"], round(s["ideal_bubble"], 4)
        (0.5, [0.75, 0.25], 0.3333)
    """
    wall, busy = info.get("wall", 0.0), info.get("busy", [0.0] * stages)
    measured = wall > 0
    return {"stages": stages, "micro_batches": micro_batches,
            "ideal_bubble": ideal_bubble(stages, micro_batches),
            "bubble": 1.0 - sum(busy) / (stages * wall) if measured else None,
            "utilisation": [b / wall for b in busy] if measured else [None] * stages,
            "measured_steps": info.get("measured_steps", 0), "steps": info.get("steps", []),
            "messages": info.get("messages", []), "dropped": info.get("dropped", [{}] * stages),
            "kernel_dropped": info.get("kernel_dropped", {})}


def step_bubble(ops_by_stage: dict) -> float:
    """The idle share of one step:
    1 - (sum of every op's time) / (stages x (last end - first start)).

    Example:
        >>> round(step_bubble({0: [["F", 0, 0.0, 1.0], ["B", 0, 2.0, 3.0]],
        ...                    1: [["F", 0, 1.0, 2.0], ["B", 0, 1.5, 2.0]]}), 4)
        0.4167
    """
    ops = [op for stage_ops in ops_by_stage.values() for op in stage_ops]
    start, end = min(op[2] for op in ops), max(op[3] for op in ops)
    busy = sum(op[3] - op[2] for op in ops)
    return 1.0 - busy / (len(ops_by_stage) * (end - start))


def pipeline_figure(ops_by_stage: dict, stages: int, micro_batches: int,
                    summary: dict | None = None) -> dict:
    """One horizontal bar per forward, backward and optimizer step, per stage (stage 0 on top),
    in milliseconds from the step's first op; the title gives the bubble, measured and ideal."""
    if not ops_by_stage:
        return empty_figure(TITLE)
    origin = min(op[2] for ops in ops_by_stage.values() for op in ops)
    traces = []
    for kind, name in KIND_NAMES.items():
        ys, xs, bases, texts = [], [], [], []
        for s in sorted(ops_by_stage, key=int):
            for op in ops_by_stage[s]:
                if op[0] == kind:
                    ys.append(f"stage {int(s)}")
                    bases.append((op[2] - origin) * 1e3)
                    xs.append((op[3] - op[2]) * 1e3)
                    texts.append("" if kind == "U" else str(op[1]))
        if ys:
            traces.append({"type": "bar", "orientation": "h", "name": name, "y": ys, "x": xs,
                           "base": bases, "text": texts, "textposition": "inside",
                           "marker": {"color": KIND_COLORS[kind]},
                           "hovertemplate": f"{name} micro-batch %{{text}}: %{{x:.2f}} ms"
                                            "<extra></extra>"})
    summary = summary or {}
    bubble, ideal = step_bubble(ops_by_stage), ideal_bubble(stages, micro_batches)
    overall = summary.get("bubble")
    util = summary.get("utilisation") or []
    title = (f"{TITLE} (latest step): bubble {bubble:.0%} this step"
             + (f", {overall:.0%} over the run" if overall is not None else "")
             + f"; ideal (S-1)/(M+S-1) = {ideal:.0%}")
    if util and all(u is not None for u in util):
        title += "<br>utilisation " + ", ".join(f"stage {s} {u:.0%}" for s, u in enumerate(util))
    fig_layout = layout(title, "time in the step (ms)", "", traces, barmode="overlay")
    fig_layout["yaxis"] = {"autorange": "reversed", "automargin": True, "categoryorder": "array",
                           "categoryarray": [f"stage {s}" for s in range(stages)]}
    fig_layout["margin"]["t"] = 80
    return {"data": traces, "layout": fig_layout}
