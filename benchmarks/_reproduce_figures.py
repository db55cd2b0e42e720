"""reproduce.py's figures: plain SVG (no plotting library), viewable offline and diff-able.

One figure per claim: per regime, the mean learning curve over seeds (validation accuracy or
loss against virtual time) of the two algorithms in the claim's hardest setting, and their
staleness distributions (share of pushes per delay) in the same setting.
"""

from __future__ import annotations

import html
import math

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
PANEL_W, PANEL_H, PAD = 340, 220, 40


def _mean_curve(runs: list[dict], index: int, steps: int = 40) -> list[tuple[float, float]]:
    """Mean over seeds of a step-wise curve (last value at or before t), on a common grid."""
    runs = [r for r in runs if r.get("curve")]
    if not runs:
        return []
    t_end = max(r["curve"][-1][0] for r in runs)
    out = []
    for k in range(1, steps + 1):
        t = t_end * k / steps
        vals = [next((c[index] for c in reversed(r["curve"]) if c[0] <= t * (1 + 1e-9)), math.nan)
                for r in runs]
        vals = [v for v in vals if math.isfinite(v)]
        if vals:
            out.append((t, sum(vals) / len(vals)))
    return out


def _panel(x0: float, y0: float, title: str, series: list[tuple[str, list[tuple[float, float]]]],
           y_range: tuple[float, float], x_label: str) -> list[str]:
    """Axes, a title and one polyline per series, inside a PANEL_W x PANEL_H box at (x0, y0)."""
    xs = [p[0] for _, pts in series for p in pts] or [1.0]
    x_max = max(xs) or 1.0
    lo, hi = y_range
    left, right, top, bottom = x0 + PAD, x0 + PANEL_W - 10, y0 + 24, y0 + PANEL_H - 28

    def sx(x):
        return left + (right - left) * x / x_max

    def sy(y):
        return bottom - (bottom - top) * (min(max(y, lo), hi) - lo) / (hi - lo)
    out = [f'<text x="{x0 + 6}" y="{y0 + 14}" font-size="12">{html.escape(title)}</text>',
           f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/>',
           f'<text x="{(left + right) / 2:.0f}" y="{bottom + 24}" '
           f'text-anchor="middle">{html.escape(x_label)}</text>']
    for k in range(5):
        y = lo + (hi - lo) * k / 4
        out.append(f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2g}</text>')
        x = x_max * k / 4
        out.append(f'<text x="{sx(x):.1f}" y="{bottom + 12}" text-anchor="middle">{x:.3g}</text>')
    for i, (name, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        if pts:
            points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                       f'points="{points}"/>')
        out.append(f'<text x="{right - 4}" y="{top + 12 + 13 * i}" text-anchor="end" '
                   f'fill="{color}">{html.escape(name)}</text>')
    return out


def _delay_share(runs: list[dict]) -> list[tuple[float, float]]:
    counts: dict[int, int] = {}
    for r in runs:
        for d, c in r.get("delays", {}).items():
            counts[int(d)] = counts.get(int(d), 0) + c
    total = sum(counts.values()) or 1
    out = []
    for d in range(0, max(counts, default=0) + 1):  # a step line: flat over each delay value
        share = counts.get(d, 0) / total
        out += [(d, share), (d + 1, share)]
    return out


def claim_svg(rows: list[dict], regimes: list[str], profile: str, algos: list[str], loss: bool,
              title: str) -> str:
    """The claim's figure: per regime (a row), learning curves and staleness distributions."""
    width, height = 2 * PANEL_W + 20, 30 + PANEL_H * len(regimes)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="10">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="8" y="18" font-size="13">{html.escape(title)} ({html.escape(profile)}, '
             'mean of seeds)</text>']
    for i, regime in enumerate(regimes):
        mine = {a: [r for r in rows if r["regime"] == regime and r["profile"] == profile
                    and r["algo"] == a]
                for a in algos}
        curves = [(a, _mean_curve(runs, 2 if loss else 1)) for a, runs in mine.items()]
        y_range = (0.0, 2.5) if loss else (0.0, 1.0)  # loss: ln 10 = 2.3 is guessing
        y0 = 26 + PANEL_H * i
        parts += _panel(0, y0, f"{regime}: val {'loss' if loss else 'accuracy'}", curves, y_range,
                        "virtual seconds")
        shares = [(a, _delay_share(runs)) for a, runs in mine.items()]
        peak = max((s for _, pts in shares for _, s in pts), default=1.0) or 1.0
        parts += _panel(PANEL_W + 10, y0, f"{regime}: staleness (share of pushes)", shares,
                        (0.0, min(1.0, peak * 1.1)), "delay (versions)")
    return "\n".join([*parts, "</svg>"])


def paired_svg(title: str, panels: list[tuple[str, str, list[tuple[str, list[float]]]]]) -> str:
    """A measured claim's figure: per panel, one line per side over the pairs (seed or repeat
    1..n), so each pair's two values sit above each other. `panels`: (title, y label, series)."""
    width, height = PANEL_W * len(panels) + 10 * (len(panels) - 1), 30 + PANEL_H
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="10">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="8" y="18" font-size="13">{html.escape(title)}</text>']
    for i, (panel_title, x_label, series) in enumerate(panels):
        values = [v for _, vs in series for v in vs if math.isfinite(v)] or [0.0, 1.0]
        lo, hi = min(values), max(values)
        margin = (hi - lo) * 0.15 or abs(hi) * 0.1 or 1.0
        lines = [(name, [(k + 1, v) for k, v in enumerate(vs)]) for name, vs in series]
        parts += _panel((PANEL_W + 10) * i, 26, panel_title, lines,
                        (max(0.0, lo - margin), hi + margin), x_label)
    return "\n".join([*parts, "</svg>"])
