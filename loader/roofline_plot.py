"""`kpu-loader --plot FILE`: the run's kernels on the machine's rooflines, drawn with matplotlib.

Each kernel sits where `report.kernel_bound` places it, on the panel of the units doing its work:
- a kernel with MACs on the arrays' panel: x its arithmetic intensity, 2 * MACs per DRAM byte
  (FLOP/B), y the FLOP per cycle it achieved over its cycles (`report.kernel_cost`'s: its first
  compute to its end), under the roof of all the machine's arrays (2 * peak MACs/cycle) and the
  DRAM slope (`report.dram_bytes_per_cycle` times x), which meet at the ridge point;
- a kernel with vector work alone (softmax, norms, pools, elementwise ops, depthwise convolutions)
  on the vector units' panel: vector elements per DRAM byte against elements per cycle, under
  lanes times compute tiles elements per cycle and the same DRAM slope;
- a kernel that only moves data (a transpose, a reshape) has nothing to put on either axis: the
  footnote names it, so no kernel of the run goes missing unsaid.
A kernel that moved no DRAM byte has infinite intensity: it is drawn on the panel's right edge as
a triangle pointing right. Size and colour both give a kernel's share of the run's cycles; the
costliest are named.

matplotlib takes a second or more to load, so only the functions that draw import it, and only
its `Figure` (no pyplot: no GUI backend, no global state); PNG is rendered by Agg.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from dfx import OutputError
from hardware import Machine

from .report import dram_bytes_per_cycle

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg", ".pdf")
NAMED = 6  # the costliest kernels named on each panel: naming all of a network's would bury the points
MOVERS_NAMED = 6  # data-movement kernels named in the footnote before "and N more"
CMAP = "viridis_r"  # the costliest darkest, the cheap ones pale but outlined
# where a name may go from its point, tried in turn until it covers no other name or point: just
# off its edge in each direction, then 2 and 3 times as far; a leader line ties it to its point
PLACES = list(product((1.5, 3, 4.5), ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))))


def plot_format(path: Path) -> str:
    """The format `path`'s suffix asks for; checked before any work, as the path itself is."""
    if path.suffix.lower() not in FORMATS:
        got = f"'{path.suffix}'" if path.suffix else "no suffix"
        raise OutputError(f"{path}: --plot writes a .png, .svg or .pdf file, and this name has {got}")
    return path.suffix.lower()[1:]


class Point(NamedTuple):
    """One kernel on a panel: `intensity` its work per DRAM byte (inf: it moved none), `rate` the
    work per cycle it achieved, `share` its share of the run's cycles."""
    name: str
    intensity: float
    rate: float
    share: float


@dataclass
class Panel:
    """One kind of unit's roofline: its peak, in `work` per cycle, and its kernels."""
    title: str
    work: str
    peak: float
    points: list[Point] = field(default_factory=list)


def panels(s: dict[str, Any], machine: Machine) -> tuple[list[Panel], list[str]]:
    """The panels with kernels on them (the arrays' alone if none has any), and the kernels that
    only move data, in program order. `s` is `report.summary`'s."""
    c = machine.compute
    arrays = Panel(f"arrays: {c.tiles} compute tile(s) of {c.rows}x{c.cols}, 1 MAC = 2 FLOP", "FLOP",
                   2 * c.peak_macs_per_cycle)
    vector = Panel(f"vector units: {c.tiles} compute tile(s) of {machine.vector.lanes} lanes", "elements",
                   machine.vector.lanes * c.tiles)
    movers = []
    for name, k in s["kernels"].items():
        panel, work = (arrays, 2 * k["macs"]) if k["macs"] else (vector, k["vector_elements"])
        if work:  # work is done by a compute task, so the kernel's cycles (from it) are at least 1
            panel.points.append(Point(name, k["arithmetic_intensity"], work / k["cycles"], k["share"]))
        else:
            movers.append(name)
    return [p for p in (arrays, vector) if p.points] or [arrays], movers


def _shown(name: str) -> str:
    """A name from the user's graph as one short line (the labels sit among the points)."""
    text = name if name.isprintable() else repr(name)[1:-1]
    return text if len(text) <= 40 else text[:37] + "..."


def _size(share: float, norm: Normalize) -> float:
    """A point's area in points squared: from a dot for no cycles to a disc for the costliest."""
    return 16 + 240 * share / norm.vmax


def _draw(ax: Axes, panel: Panel, bw: float, norm: Normalize) -> None:
    """One panel: the ceilings, the ridge point and the kernels."""
    # the cheap drawn last: on top of the costly, which would hide them
    by_share = sorted(panel.points, key=lambda p: p.share, reverse=True)
    finite = [p for p in by_share if math.isfinite(p.intensity)]
    unmoved = [p for p in by_share if not math.isfinite(p.intensity)]
    # an unbounded DRAM rate (an ideal machine) has no slope: the roof alone bounds every kernel
    ridge = panel.peak / bw if math.isfinite(bw) else None
    # at least a decade either side of the ridge and two below the peak, so that both ceilings show
    xs = [p.intensity for p in finite] + ([ridge / 10, ridge * 10] if ridge else [])
    left, right = (min(xs) / 2, max(xs) * 2) if xs else (0.1, 10.0)
    bottom = min([p.rate for p in panel.points] + [panel.peak / 100]) / 2  # no points: moves-only kernels
    ax.set(xscale="log", yscale="log", xlim=(left, right), ylim=(bottom, panel.peak * 2),
           xlabel=f"arithmetic intensity ({panel.work} per DRAM byte)", ylabel=f"achieved {panel.work} per cycle")
    ax.set_title(panel.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.plot([ridge or left, right], [panel.peak] * 2, color="tab:red", lw=2, gid="peak",
            label=f"peak {panel.peak:,g} {panel.work}/cycle")
    if ridge:
        ax.plot([left, ridge], [bw * left, panel.peak], color="tab:blue", lw=2, gid="dram",
                label=f"DRAM {bw:,g} B/cycle")
        ax.plot([ridge, ridge], [bottom, panel.peak], color="grey", ls=":", lw=1)
        ax.plot([ridge], [panel.peak], "o", mfc="white", mec="black", ms=7, zorder=4, gid="ridge",
                label=f"ridge point {ridge:,.3g} {panel.work}/B")
    for points, marker, gid in ((finite, "o", "kernels"), (unmoved, ">", "no-dram")):
        if points:
            ax.scatter([right if gid == "no-dram" else p.intensity for p in points], [p.rate for p in points],
                       c=[p.share for p in points], s=[_size(p.share, norm) for p in points], cmap=CMAP, norm=norm,
                       marker=marker, edgecolors="black", linewidths=0.6, zorder=3, clip_on=False, gid=gid,
                       label="no DRAM byte moved (infinite intensity)" if gid == "no-dram" else None)
    ax.legend(loc="lower right", fontsize=8)


def _groups(points: list[Point], right: float) -> list[tuple[list[Point], tuple[float, float]]]:
    """The points, with those on one spot (a network's repeated layers) as one, in the order given:
    within 2% of each other on both log axes their names would print over each other."""
    groups: list[tuple[list[Point], tuple[float, float]]] = []
    for p in points:
        xy = (min(p.intensity, right), p.rate)
        for members, (x, y) in groups:
            if abs(math.log(xy[0] / x)) < 0.02 and abs(math.log(xy[1] / y)) < 0.02:
                members.append(p)
                break
        else:
            groups.append(([p], xy))
    return groups


def _label(ax: Axes, text: str, xy: tuple[float, float], radius: float, place: tuple[float, tuple[int, int]]):
    """`text` at `place` (one of `PLACES`) from its point of `radius` points, with a leader line."""
    reach, (dx, dy) = place
    offset = (radius + 3) * reach
    return ax.annotate(text, xy, xytext=(dx * offset, dy * offset), textcoords="offset points",
                       # a name right of its point starts there, one left of it ends there (-1: the last)
                       ha=("center", "left", "right")[dx], va=("center", "bottom", "top")[dy],
                       fontsize=7.5, parse_math=False, zorder=5,
                       bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
                       arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "grey", "shrinkB": radius})


def _name(ax: Axes, panel: Panel, norm: Normalize) -> None:
    """Name the panel's `NAMED` costliest kernels, each at the first of `PLACES` where it stays in
    the panel, covers no point, name, ceiling or legend and its leader line crosses no other; where
    none is free, beside its point anyway. Run on the figure's final layout: places are judged as
    drawn, in pixels."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    frame, right, px = ax.get_window_extent(renderer), ax.get_xlim()[1], ax.figure.dpi / 72

    def radius(p: Point) -> float:  # in points
        return math.sqrt(_size(p.share, norm)) / 2

    def disc(spot: list[Point], xy: tuple[float, float]) -> Bbox:  # around the spot's largest point
        (x, y), r = ax.transData.transform(xy), max(map(radius, spot)) * px
        return Bbox.from_extents(x - r, y - r, x + r, y + r)

    def put(text: str, xy: tuple[float, float], r: float, place):
        """The label, its text's box (with a margin) and its leader line, to the text's centre."""
        label = _label(ax, text, xy, r, place)
        label.get_window_extent(renderer)  # places the label
        box = Text.get_window_extent(label).padded(3 * px)  # the text alone: its leader may cross points
        return label, box, (ax.transData.transform(xy), (box.intervalx.mean(), box.intervaly.mean()))

    ceilings = [ax.transData.transform(line.get_xydata()) for line in ax.lines if line.get_gid() in ("peak", "dram")]
    spots = _groups(panel.points, right)
    # what the names may not cover: the legend, the ridge point, then each name placed
    boxes = [ax.get_legend().get_window_extent(renderer)] + \
        [line.get_window_extent(renderer) for line in ax.lines if line.get_gid() == "ridge"]
    leaders = []
    costliest = sorted(panel.points, key=lambda p: p.share, reverse=True)[:NAMED]
    # the costliest spot placed first; the names of one spot in program order
    named = sorted(_groups([p for p in panel.points if p in costliest], right),
                   key=lambda group: max(p.share for p in group[0]), reverse=True)
    for members, xy in named:
        text, r = "\n".join(_shown(m.name) for m in members), max(map(radius, members))
        others = boxes + [disc(spot, at) for spot, at in spots if not set(spot) & set(members)]
        for place in PLACES:
            label, box, leader = put(text, xy, r, place)
            if frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1 \
                    and not any(box.overlaps(b) for b in others) and not any(_through(c, box) for c in ceilings) \
                    and not any(_cross(leader, l) for l in leaders):
                break
            label.remove()
        else:  # nowhere free: beside its point, over whatever is there
            _, box, leader = put(text, xy, r, PLACES[0])
        boxes.append(box)
        leaders.append(leader)


def _cross(ab, cd) -> bool:
    """Whether segments ab and cd cross (two leader lines crossing would swap their names)."""
    (a, b), (c, d) = ab, cd

    def side(p, q, r) -> float:  # > 0: r left of the line pq, < 0: right of it
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0


def _through(segment, box) -> bool:
    """Whether the segment (a ceiling: straight on log-log axes) runs into the box."""
    corners = [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
    return any(box.contains(*end) for end in segment) or \
        any(_cross(segment, (corners[i - 1], corners[i])) for i in range(4))


def figure(s: dict[str, Any], machine: Machine) -> Figure:
    """The roofline figure of the run that `s` (`report.summary`'s) sums up, on `machine`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    drawn, movers = panels(s, machine)
    bw = dram_bytes_per_cycle(machine)
    fig = Figure(figsize=(1.5 + 6.5 * len(drawn), 6), layout="constrained")
    FigureCanvasAgg(fig)  # measures the names' extents while placing them
    axes = fig.subplots(1, len(drawn), squeeze=False)[0]
    norm = Normalize(0, max((p.share for panel in drawn for p in panel.points), default=0) or 1)
    for ax, panel in zip(axes, drawn):
        _draw(ax, panel, bw, norm)
    fig.colorbar(ScalarMappable(norm, CMAP), ax=axes, label="share of the run's cycles (also the point's size)",
                 format=PercentFormatter(1.0))
    n = len(s["kernels"])
    fig.suptitle(f"{_shown(Path(s['object']).name)} on {_shown(s['config'])}: {s['cycles']:,} cycles, "
                 f"{n} kernel{'s' * (n != 1)}", parse_math=False)
    notes = [f"Each kernel at its intensity and the rate it achieved over its cycles (its first compute to its "
             f"end); named: the {NAMED} costliest of each panel."]
    if not math.isfinite(bw):
        notes.append("DRAM feeds this machine at an unbounded rate: its peaks alone bound the kernels.")
    if movers:
        shown = ", ".join(map(_shown, movers[:MOVERS_NAMED]))
        more = f" and {len(movers) - MOVERS_NAMED} more" if len(movers) > MOVERS_NAMED else ""
        notes.append(f"Not drawn, moving data only (no MACs, no vector work): {shown}{more}.")
    # supxlabel, not a free fig.text: the constrained layout keeps room for it
    fig.supxlabel("\n".join(notes), fontsize=8, parse_math=False)
    # lay the figure out once and keep that layout, so that the names are placed on it for good
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    for ax, panel in zip(axes, drawn):
        _name(ax, panel, norm)
    return fig


def write(s: dict[str, Any], machine: Machine, f: BinaryIO, fmt: str) -> None:
    """Draw the run's roofline figure into `f` as `fmt` (png, svg or pdf: `plot_format`'s)."""
    figure(s, machine).savefig(f, format=fmt, dpi=150)
