"""The frontier plot: one panel per workload, two objectives, PNG and SVG (matplotlib, Agg).

Every point that ran is a grey dot; the frontier of the two objectives plotted is drawn over
them in colour, joined in the order of the horizontal objective and labelled with its points'
axis values. Where the sweep's frontier is over more objectives than the two plotted, its other
points are ringed, so the plot shows what the frontier table lists. An axis spanning more than a
factor of 20 is logarithmic. Both files come out the same for the same rows (no dates in them,
SVG ids from a fixed salt). Every text is drawn as given, never as matplotlib's mathtext: a label,
workload or spec file name with `$...$` in it is the user's text, not a formula to typeset. A
character the font lacks shows as a box, without matplotlib's warning (three lines, with source
lines of this module) on stderr.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass

from .pareto import frontier
from .spec import OBJECTIVES

LOG_SPAN = 20  # an objective whose largest value is this many times its smallest is shown on a log scale


@dataclass(frozen=True)
class Panel:
    workload: str
    xs: list[float]  # the horizontal objective of each point that ran, in results units
    ys: list[float]
    labels: list[str]  # each point's axis values, as the spec's labels show them
    failed: int  # points of this workload that did not run
    ringed: list[bool]  # on the sweep's frontier over more objectives than x and y
    ringed_over: str  # those objectives, for the legend


def render(panels: list[Panel], x: str, y: str, title: str) -> tuple[bytes, bytes]:
    """The figure as PNG and as SVG bytes."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    columns = min(len(panels), 2)
    rows = math.ceil(len(panels) / columns)
    with plt.rc_context({"svg.hashsalt": "kpu-dse", "font.size": 9}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 5.2 * rows), squeeze=False)
        labels = [_draw(ax, panel, x, y) for ax, panel in zip(axes.flat, panels)]
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle(title, parse_math=False)
        fig.tight_layout()
        for ax, points in zip(axes.flat, labels):  # placed once the layout has sized the axes
            _label(ax, points)
        png, svg = io.BytesIO(), io.BytesIO()
        fig.savefig(png, format="png", dpi=120, metadata={"Software": None})
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return png.getvalue(), svg.getvalue()


def _draw(ax, panel: Panel, x: str, y: str) -> list[tuple[float, float, str]]:
    """Draw one panel; the frontier's points and their labels, to place once the layout is done."""
    (_, x_up, x_unit, x_scale), (_, y_up, y_unit, y_scale) = OBJECTIVES[x], OBJECTIVES[y]
    xs = [v * x_scale for v in panel.xs]
    ys = [v * y_scale for v in panel.ys]
    ax.set_xlabel(f"{x}, {x_unit} ({'higher' if x_up else 'lower'} is better)", parse_math=False)
    ax.set_ylabel(f"{y}, {y_unit} ({'higher' if y_up else 'lower'} is better)", parse_math=False)
    failed = f", {panel.failed} failed" if panel.failed else ""
    if not xs:
        ax.set_title(f"{panel.workload}: no point ran{failed}", parse_math=False)
        ax.text(0.5, 0.5, "no point ran", ha="center", va="center", transform=ax.transAxes, parse_math=False)
        return []
    front = sorted(frontier(list(zip(xs, ys)), (x_up, y_up)), key=lambda i: (xs[i], ys[i]))
    ax.set_title(f"{panel.workload}: {len(xs)} points, {len(front)} on the frontier{failed}", parse_math=False)
    ax.grid(True, which="both", color="0.92", linewidth=0.6)
    ax.scatter(xs, ys, s=18, color="0.6", label="design points", zorder=2)
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "-o", color="tab:red", markersize=6, linewidth=1.5,
            label=f"Pareto frontier of {x} and {y}", zorder=3)
    ringed = [i for i, r in enumerate(panel.ringed) if r and i not in front]
    if ringed:
        ax.scatter([xs[i] for i in ringed], [ys[i] for i in ringed], s=60, facecolors="none", edgecolors="tab:red",
                   linewidths=1, label=f"also on the frontier of {panel.ringed_over}", zorder=3)
    for values, set_scale in ((xs, ax.set_xscale), (ys, ax.set_yscale)):
        if min(values) > 0 and max(values) / min(values) >= LOG_SPAN:
            set_scale("log")
    for text in ax.legend(loc="best", fontsize=8).get_texts():
        text.set_parse_math(False)
    return [(xs[i], ys[i], panel.labels[i]) for i in front]


def _label(ax, points: list[tuple[float, float, str]]) -> None:
    """Label each point beside it, on the side away from the nearer edge of the axes, then move
    down (or up, near the bottom) each label that overlaps one placed before it."""
    ax.autoscale_view()
    to_axes = ax.transData + ax.transAxes.inverted()
    renderer = ax.figure.canvas.get_renderer()
    placed = []
    for x, y, text in points:
        fx, fy = to_axes.transform((x, y))
        right, low = fx > 0.6, fy < 0.15
        label = ax.annotate(text, (x, y), xytext=(-6 if right else 6, 6 if fy < 0.85 else -12),
                            textcoords="offset points", ha="right" if right else "left", fontsize=7, zorder=4,
                            parse_math=False,
                            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none",
                                  "alpha": 0.8})
        for _ in range(len(placed)):  # a move per label placed before clears a column of them
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            step = (box.height + 2) * 72 / ax.figure.dpi  # pixels to the offset's points
            dx, dy = label.xyann
            label.xyann = (dx, dy + step if low else dy - step)
        placed.append(label.get_window_extent(renderer))
