"""Where intermediates kept on chip live in L3: the rule the compiler plans by and the loader binds by.

An intermediate whose tensor says `home: "L3"` stays in L3 from the kernel that writes it to the
last kernel that reads it. Its region sits at the top of L3, below those of the others live at
the same time, and every kernel while it lives binds its own L3 buffers below all the regions
live during it. Both sides run this one packing on their own figures of what each kernel needs
(the compiler per its target, the loader per the concrete machine), so where a machine has the
room the compiler counted on, the loader keeps what the compiler planned. The kernels of a chain
(`Program.chains`) run at once: a home live during one of them is live during all, and each
needs room for all their buffers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .dtypes import itemsize
from .graph import Tensor


@dataclass(frozen=True)
class Home:
    """A tensor's region of L3: `bytes` at `address`, held from kernel `first` (its writer) to
    kernel `last` (its last reader), both positions in the program's kernel list (widened to the
    whole chain of either, whose kernels run at once). Of a tensor kept in L2, `bytes` at
    `address` of every L2 bank (`l2_piece`)."""

    tensor: str
    address: int
    bytes: int
    first: int
    last: int

    def live(self, kernel: int) -> bool:
        return self.first <= kernel <= self.last


@dataclass(frozen=True)
class Resident:
    """A tensor asking for a home: its bytes and the kernels that write and last read it, and
    (kernel position, bytes) of L3 buffers its home frees while each runs: a plain L3 tile of it
    is then that region of the home, no buffer of its own (the pointwise reading a whole image
    in place), counted for every kernel of the chain of the one holding it."""

    tensor: str
    bytes: int
    first: int
    last: int
    frees: tuple[tuple[int, int], ...] = ()


def in_lines(size: int, line: int) -> int:
    """The bytes a buffer (or a home) of `size` takes: each starts on a line and takes whole lines,
    as the compiler counts them and the loader places them."""
    return -(-size // line) * line


def home_bytes(t: Tensor) -> int:
    """The bytes of a tensor's home: all of it, or with a ring, `ring` slices along `ring_dim`."""
    whole = t.size * itemsize(t.dtype)
    if t.ring is None:
        return whole
    extent = t.shape[t.ring_dim]
    return whole // max(extent, 1) * min(t.ring, extent)


def first_fit(sizes: list[int], banks: int, room: int) -> bool:
    """Whether buffers of `sizes` pack into `banks` banks of `room` bytes each, first fit, the
    largest first (the compiler's check that a tiling fits; the binder places them exactly)."""
    total = sum(sizes)
    if total <= room:  # all in the first bank
        return True
    if banks == 1 or total > banks * room:  # no packing holds them
        return False
    free = [room] * banks
    for size in sorted(sizes, reverse=True):
        for i, left in enumerate(free):
            if size <= left:
                free[i] -= size
                break
        else:
            return False
    return True


def l2_piece(size: int, banks: int, line: int) -> int:
    """The bytes a home in L2 of `size` takes at the top of each of the `banks` (of every compute
    tile): an equal piece of it, in whole lines, so every bank keeps the same room below."""
    return in_lines(-(-size // banks), line)


def below_homes(homes: list[Home], kernel: int, capacity: int) -> int:
    """Where a kernel's own buffers must end, in L3 (or in each L2 bank, for homes in L2): below
    every home live while it runs."""
    return min((h.address for h in homes if h.live(kernel)), default=capacity)


def freed(saved: dict[int, int], spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """`Resident.frees` of a tensor whose home frees `saved[j]` bytes of kernel j's L3 buffers:
    for each kernel of j's chain (`spans[j]`: its first and last position), as they run at once."""
    out: dict[int, int] = {}
    for j, n in saved.items():
        first, last = spans[j]
        for k in range(first, last + 1):
            out[k] = out.get(k, 0) + n
    return tuple(sorted((k, n) for k, n in out.items() if n))


def pack_homes(wanted: list[Resident], demands: list[int], capacity: int, line: int) -> list[Home]:
    """Homes for as many of `wanted` as fit, in their order: each as high in L3 as the homes live
    beside it leave room, and only where every kernel of its span still has `demands[k]` bytes,
    less what the homes taken free (`Resident.frees`), below all the homes live while it runs.
    Consecutive ones of one span (a chain's links) are first tried all at once: each may free
    more than it takes, so that they fit together where the first would not alone; where they
    do not, each is tried alone (a subset that fits only together is not sought: a chain's
    links, which the planner fitted together, fit all at once where the target's room is there).
    `line`: regions start and end on whole lines.
    Packed so in `wanted`'s order and again with the longest-lived first of those starting
    together (placed higher, they leave the room below them whole when the shorter-lived end):
    the second where it holds every tensor the first does and more (so it never leaves out a
    chain's link the first holds), else the first."""
    first = _pack(wanted, demands, capacity, line)
    again = _pack(sorted(wanted, key=lambda r: (r.first, -r.last)), demands, capacity, line)
    return again if {h.tensor for h in again} > {h.tensor for h in first} else first


def _pack(wanted: list[Resident], demands: list[int], capacity: int, line: int) -> list[Home]:
    """`pack_homes` in `wanted`'s order."""
    homes: list[Home] = []
    frees: dict[int, int] = {}  # kernel -> bytes the homes taken free of its demand
    live: list[Home] = []  # those still live where the next one starts: `wanted` comes by `first`

    def take(batch: list[Resident]) -> bool:
        placed: list[Home] = []
        for r in batch:
            size = in_lines(r.bytes, line)
            beside = sorted((h for h in [*live, *placed] if h.first <= r.last and h.last >= r.first),
                            key=lambda h: -h.address)
            address = (capacity - size) // line * line
            for h in beside:  # highest first: go below each region this one would share a byte with
                if address < h.address + in_lines(h.bytes, line) and h.address < address + size:
                    address = h.address - size
            if address < 0:
                return False
            placed.append(Home(r.tensor, address, r.bytes, r.first, r.last))
        after = dict(frees)
        for r in batch:
            for k, n in r.frees:
                after[k] = after.get(k, 0) + n
        if not all(demands[k] - after.get(k, 0) <= below_homes([*live, *placed], k, capacity)
                   for r in batch for k in range(r.first, r.last + 1)):
            return False
        homes.extend(placed)
        live.extend(placed)
        frees.update(after)
        return True

    for _, group in itertools.groupby(wanted, key=lambda r: (r.first, r.last)):
        group = list(group)
        live = [h for h in live if h.last >= group[0].first]
        if len(group) == 1 or not take(group):
            for r in group:
                take([r])
    return homes
