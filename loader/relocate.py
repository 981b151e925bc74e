"""Between kernels: move a kernel's buffers off the memory the kernels before it still hold.

Each kernel is bound on its own, so both binders start every kernel at the bottom of the same
banks; the task stream then makes a kernel's first fills wait until the earlier kernel is done
with those bytes, and consecutive kernels cannot overlap. Within a pool (one level, or one
worker's L1) banks are interchangeable, and a bank's contents can move as one block to another
offset, without changing anything the binders weigh (bank port loads follow the banks, engines
are untouched, each bank holds the same bytes). So each kernel's banks are relabelled and
shifted onto the bytes the most recent kernels did not use.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace

from dfx import in_lines
from hardware import Machine

from .binding import Binding, BoundBuffer
from .buffers import level_banks

Place = tuple[str, int, int]  # (level, L1 owner worker or -1, bank)


class Occupancy:
    """Which kernel's buffer last held each byte of on-chip memory, with a tag per buffer (the
    task stream tags each with the id of the buffer's last use). A bank's spans never share a
    byte (a claim hides every span it touches), so they are kept sorted: by start and by end alike."""

    def __init__(self) -> None:
        self.spans: dict[Place, list[tuple[int, int, int]]] = {}
        self._ends: dict[Place, list[int]] = {}  # each bank's span ends, in the same order

    def _overlapping(self, place: Place, start: int, end: int) -> tuple[int, int]:
        """The index range of the spans that share a byte with [start, end) of a bank."""
        spans = self.spans.get(place, [])
        first = bisect_right(self._ends.get(place, []), start)
        last = first
        while last < len(spans) and spans[last][0] < end:
            last += 1
        return first, last

    def under(self, place: Place, start: int, end: int) -> list[tuple[int, int, int]]:
        """The (start, end, tag) spans that share a byte with [start, end) of a bank."""
        first, last = self._overlapping(place, start, end)
        return self.spans[place][first:last] if last > first else []

    def claim(self, bb: BoundBuffer, tag: int) -> None:
        """A later kernel's buffer hides what earlier ones left under it."""
        place = place_of(bb)
        first, last = self._overlapping(place, bb.address, bb.end)
        self.spans.setdefault(place, [])[first:last] = [(bb.address, bb.end, tag)]
        self._ends.setdefault(place, [])[first:last] = [bb.end]


def place_of(bb: BoundBuffer) -> Place:
    return bb.buffer.level, bb.buffer.owner, bb.bank


def relocate(binding: Binding, taken: Occupancy, machine: Machine) -> Binding:
    """The same binding with each pool's banks relabelled and their contents shifted, so that
    its buffers overlap as few bytes as possible of the newest kernel in `taken`, then of the one
    before, and so on (greedy, fullest bank first): small kernels run many at once. Tags of
    `taken` are kernel numbers."""
    newest = max((t for spans in taken.spans.values() for _, _, t in spans), default=0)

    def cost(place: Place, spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """Bytes shared with each earlier kernel, newest first, ordered as the list of them would
        be (the first kernel that differs decides, fewer bytes first): only the kernels shared
        with, each as (-age, bytes), so a kernel missing from one cost (0 bytes) makes it the less."""
        shared: dict[int, int] = {}
        for start, end in spans:
            for s, e, t in taken.under(place, start, end):
                shared[newest - t] = shared.get(newest - t, 0) + min(e, end) - max(s, start)
        return tuple((-age, shared[age]) for age in sorted(shared) if shared[age])

    line = machine.line_bytes
    by_pool: dict[tuple[str, int], dict[int, list[BoundBuffer]]] = {}
    for bb in binding.buffers:
        by_pool.setdefault(place_of(bb)[:2], {}).setdefault(bb.bank, []).append(bb)
    moved: dict[int, BoundBuffer] = {}  # id of the original -> its new placement
    for (level, owner), banks in by_pool.items():
        count, size = level_banks(machine, level)
        held = {k for lv, ow, k in taken.spans if (lv, ow) == (level, owner)}
        chosen: set[int] = set()
        for bank, members in sorted(banks.items(), key=lambda kv: (-sum(b.buffer.bytes for b in kv[1]), kv[0])):
            low = min(bb.address for bb in members)
            extent = max(bb.end for bb in members) - low
            # every bank earlier kernels hold, the bank itself, and the lowest empty one: any other
            # empty bank costs the same and loses the tie-break, so a machine's unused banks cost nothing
            empty = next((k for k in range(count) if k not in held and k not in chosen), None)
            # in tie-break order (the bank itself, then the lowest bank and offset), so the first
            # placement of least cost is the one taken, and one that overlaps nothing ends the search
            places = sorted((k != bank, k, offset) for k in ({*held, bank, empty} - {None}) - chosen
                            for offset in _offsets(taken.spans.get((level, owner, k), []), extent, size, line))
            best_cost, best = None, None
            for place in places:
                _, k, offset = place
                shift = offset - low
                spent = cost((level, owner, k), [(bb.address + shift, bb.end + shift) for bb in members])
                if best_cost is None or spent < best_cost:
                    best_cost, best = spent, place
                    if not spent:
                        break
            _, target, offset = best
            chosen.add(target)
            moved.update((id(bb), BoundBuffer(bb.buffer, target, bb.address - low + offset)) for bb in members)
    return replace(binding, buffers=[moved[id(bb)] for bb in binding.buffers])


def _offsets(spans: list[tuple[int, int, int]], extent: int, size: int, line: int) -> list[int]:
    """Aligned starts for a block of `extent` bytes in a bank: either end of the bank, and
    against either side of each span earlier kernels left there."""
    top = (size - extent) // line * line
    candidates = {0, top}
    for s, e, _ in spans:
        candidates.add(in_lines(e, line))
        candidates.add((s - extent) // line * line)
    return sorted(o for o in candidates if 0 <= o <= top)
