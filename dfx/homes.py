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

from dataclasses import dataclass

from .dtypes import itemsize
from .graph import Tensor


@dataclass(frozen=True)
class Home:
    """A tensor's region of L3: `bytes` at `address`, held from kernel `first` (its writer) to
    kernel `last` (its last reader), both positions in the program's kernel list (widened to the
    whole chain of either, whose kernels run at once)."""

    tensor: str
    address: int
    bytes: int
    first: int
    last: int

    def live(self, kernel: int) -> bool:
        return self.first <= kernel <= self.last


@dataclass(frozen=True)
class Resident:
    """A tensor asking for a home: its bytes and the kernels that write and last read it."""

    tensor: str
    bytes: int
    first: int
    last: int


def in_lines(size: int, line: int) -> int:
    """The bytes a buffer (or a home) of `size` takes: each starts on a line and takes whole lines,
    as the compiler counts them and the loader places them."""
    return -(-size // line) * line


def home_bytes(t: Tensor) -> int:
    """The bytes of a tensor's home: all of it, or with a ring, `ring` rows along dim 1."""
    whole = t.size * itemsize(t.dtype)
    if t.ring is None:
        return whole
    return whole // max(t.shape[1], 1) * min(t.ring, t.shape[1])


def l3_limit(homes: list[Home], kernel: int, capacity: int) -> int:
    """Where a kernel's own L3 buffers must end: below every home live while it runs."""
    return min((h.address for h in homes if h.live(kernel)), default=capacity)


def pack_homes(wanted: list[Resident], demands: list[int], capacity: int, line: int) -> list[Home]:
    """Homes for as many of `wanted` as fit, in their order: each as high in L3 as the homes live
    beside it leave room, and only where every kernel of its span still has `demands[k]` bytes
    below all the homes live while it runs. `line`: regions start and end on whole lines."""
    homes: list[Home] = []
    live: list[Home] = []  # those still live where the next one starts: `wanted` comes in writer order
    for r in wanted:
        size = in_lines(r.bytes, line)
        live = [h for h in live if h.last >= r.first]
        beside = sorted((h for h in live if h.first <= r.last), key=lambda h: -h.address)
        address = (capacity - size) // line * line
        for h in beside:  # highest first: go below each region this one would share a byte with
            if address < h.address + in_lines(h.bytes, line) and h.address < address + size:
                address = h.address - size
        if address < 0:
            continue
        home = Home(r.tensor, address, r.bytes, r.first, r.last)
        if all(demands[k] <= l3_limit([*beside, home], k, capacity) for k in range(r.first, r.last + 1)):
            homes.append(home)
            live.append(home)
    return homes
