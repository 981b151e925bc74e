"""What the sliding-window lowerings (lower_conv, lower_window) share: the input bands an output
tile needs, what crossing external memory costs them, the extents their tilings try, and the
body they append loads to."""

from __future__ import annotations

from dataclasses import dataclass, field

from dfx import DataMove, Op, TileRef, lookup


def band_elements(window, out_dim: int, out_tile: int, dim: int) -> int:
    """Input elements inside the tensor summed over the bands of one spatial dim: what crosses
    the external memory link for them, halo included."""
    extent, step, offset = window.band(out_tile)
    bands = -(-out_dim // out_tile)
    # the bands from `first` (the first to start inside the tensor) up to `last` lie wholly
    # inside it and hold `extent` each; only those over its start's padding and from `last` on
    # (at its end, or past it) are cut, and counted one by one
    first = min(bands, max(0, -(offset // step)))
    last = max(first, min(bands, (dim - extent - offset) // step + 1))
    cut = (offset + i * step for i in (*range(first), *range(last, bands)))
    return (last - first) * extent + sum(max(0, min(start + extent, dim) - max(start, 0)) for start in cut)


def band_ref(tensor: str, level: str, indices: list[str], hw: tuple, R: int, C: int, channels: int) -> TileRef:
    """The input bands that output tiles of R x C positions (and `channels` channels) need:
    NHWC tiles of rows and columns with their halo, holding their share of the padding."""
    (top, bottom), (left, right) = (hw[0].before, hw[0].after), (hw[1].before, hw[1].after)
    return TileRef(tensor, level, indices, [1, hw[0].band(R)[0], hw[1].band(C)[0], channels],
                   offset=[0, -top, -left, 0], step=[1, R * hw[0].stride, C * hw[1].stride, channels],
                   padding=[[0, 0], [top, bottom], [left, right], [0, 0]] if any((top, bottom, left, right)) else None)


def padding_fill(op: Op, dtype: str, hw: tuple) -> int | float | None:
    """What the moves of an input band write where it holds padding: the registry's value for
    the op (zero unless it says otherwise); None with no padding."""
    if not any((hw[0].before, hw[0].after, hw[1].before, hw[1].after)):
        return None
    return lookup(op.op_type).padding_value(dtype)


def widths(out_dim: int) -> list[int]:
    """Output tile extents to try along W, widest first: the whole row, then halves of it."""
    return sorted({-(-out_dim // 2 ** j) for j in range(out_dim.bit_length())}, reverse=True)


def channel_splits(dim: int) -> list[int]:
    """Tile extents to try along a channel dim: all of it, then the powers of two below it."""
    return [dim] + [1 << j for j in range((dim - 1).bit_length() - 1, -1, -1)]


@dataclass
class Body:
    """A kernel body being built over a loop order (outermost first, loops of one trip left out)."""

    order: tuple[str, ...]
    depth: int  # buffers of a load that repeats
    ops: list = field(default_factory=list)

    def index(self, *loops: str) -> list[str]:
        """Tile indices by these loops, "0" for one that does not run."""
        return [v if v in self.order else "0" for v in loops]

    def at(self, tile: TileRef) -> str | None:
        """A move sits at the innermost loop indexing its destination tile (None: before all)."""
        deepest = max((self.order.index(i) for i in tile.tile_indices if i in self.order), default=-1)
        return self.order[deepest] if deepest >= 0 else None

    def loads(self, hops: list[tuple[TileRef, TileRef]], fill: int | float | None = None,
              repeat: bool = True) -> int:
        """Append the loads of one operand hop by hop, each double-buffered where it repeats
        (and `repeat`); the id of the last. A move names its destination's tile at both ends."""
        prev: list[int] = []
        for src, dst in hops:
            place = self.at(dst)
            self.ops.append(DataMove(len(self.ops), "LOAD", src, dst, at=place,
                                     depth=self.depth if repeat and place is not None else 1, depends_on=prev,
                                     fill=fill))
            prev = [len(self.ops) - 1]
        return prev[0]
