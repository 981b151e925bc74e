"""Chains: consecutive sliding-window kernels that the loader runs at once, band by band, so the
units of one work under those of the next and the intermediates between them (their links) need
not cross the external memory link.

A convolution writes its result band of rows by band of rows, and the window op after it needs,
for its next band of output rows, only those input rows and their halo. Run together and
interleaved by rows (`Program.chains`), the two never need the whole intermediate: its home in
L3 may hold a ring of rows (`Tensor.ring`, row r in slot r mod ring) that the writer refills as
the reader moves down. A pointwise convolution holding the whole image writes its result tile of
output channels by tile, and a depthwise op after it needs, for a chunk of its channels, only
those: interleaved by channels, the depthwise works on the vector unit while the pointwise goes
on on the array, the link in L3 (whole, or a ring of channels the pointwise refills as the
depthwise moves on) or passing through external memory. This pass runs after
lowering, before the homes and the barriers:

- Which kernels may chain: consecutive fusion groups, each anchored on a sliding-window op
  (`WINDOWED`, with its epilogue), each after the first taking as its window input the result of
  the one before (its link), which nothing else reads, one image along dim 0.
- The members' tilings: the loader runs them at once, their buffers disjoint, so each is lowered
  again for a share of the target (`SHARES`: of every L1 and L2 bank's bytes and of L3), the
  shares cut member by member (the cut that frees the most room for the least cost first: the
  objective's figure, then energy; of their banks alone, and again of their rows too, the better
  of the two) until all their buffers and the links' homes fit the target together, then grown
  back (or cut one step more) where a member's other share still fits and ranks better (`_rank`; under `TRADING`, a
  window op's larger banks also at the rows that keep its bands as tall, `_as_tall`), then the
  best change of one member's usable share taken until none ranks better (`_descended`); for two kernels
  whose cut falls short by more than `SHORT`, every pair of usable shares is tried, where their
  least cost leaves more than `SEARCHED` to gain. A member
  must go by bands of its links: its band loop (`Kernel.band_loop`: the outermost loop of more
  than one trip, or the next inside a parallel one that indexes none of their slices) indexes
  their rows (or, the whole image in one tile, their channels), stepping upward; one reading
  and writing links, both by one loop; one reading a link, going through its bands once on each
  compute tile; one writing a link, through more than one band on each. A convolution reading
  its link by channels is lowered to hold chunks of them (`CHANNEL_BANDS`). A chain costs what its
  kinds of engine do, overlapping, plus its pipeline's fill (`pipeline`: how much later than its
  slowest member its last ends, each band waiting for the bands of the member before it reads,
  and its last member's `tail`, as a kernel alone ends with its own);
  one of more than two members in rings of one band's slack, taking the array and the vector unit
  in turns (`_turns`), at least their cycles one after the other (each member waits on the next
  band by band).
- Each link's ring, of rows or of channels as the chain goes: the slices the reader's bands span
  on every compute tile at once, plus those the writer's next bands write on every compute tile
  (so neither waits on the other for room); the whole tensor where that is all of them. Where
  the chain fits no other way, under `TIGHT_OBJECTIVES`: a band of each (a reader's bands dealt
  to the compute tiles still a step apart). A member's plain L3 tiles of a link kept on chip lie
  in its home and take no room of their own.
- Which chains: the cut of the kernels into chains and single kernels with the lowest figure of
  the target's objective (`usage`: cycles, from what each kind of engine has to do; pJ, from the
  bytes moved at each level), a chain's members as tiled for their shares and without their
  links' external-memory bytes where the links stay on chip, each chain paying by more than `TIE`
  of what its members cost on their own; planned only where it would pay at its least cost
  (`Planner.least`: its members as lowered for the whole target, the fill no pipeline of theirs
  avoids, the last one's tail).
- Homes between chains (`boundary_homes`): what one chain writes whole and the next one's
  pointwise reads whole, kept in L3 or in L2 where both chains, planned again beside its home,
  cost the objective less and no more cycles.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from dfx import DataMove, Graph, Kernel, Op, TileLoop, home_bytes, in_lines, itemsize, l2_piece, lookup

from .errors import CompileError
from .requirements import body_buffers, fits
from .residency import l3_demand, workers
from .target import Level, Target
from .tiling import link_busy

# the anchors whose kernels go by bands of rows of NHWC tensors (lower_conv, lower_window)
WINDOWED = frozenset({"CONV2D", "DEPTHWISE_CONV2D", "MAXPOOL2D", "AVGPOOL2D", "SUMPOOL2D"})
SHARES = (1, 1 / 2, 1 / 4, 1 / 8, 1 / 16)  # a member's fraction of the target, largest first
# the share of its output rows a member's tiles may hold: a member starts from the largest with
# which it goes by rows (less than all where with all of them it takes the whole image in one
# band, as a 14 x 14 depthwise does), the cut takes it lower (to a row or two of a 112-row
# image), and the search over pairs tries every one; None: the whole image in one tile, so it
# goes by bands of channels
ROWS = (1, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, None)
# a share of rows past `ROWS`: the whole image, as None, its window input read by bands of channels
# (`Target.reads_by_channels`: a convolution holding every input channel in L3 could not)
CHANNEL_BANDS = len(ROWS)
BY_ROWS, BY_CHANNELS = 1, 3  # the dims of an NHWC link a chain may go by
ENGINES = ("dma", "block_mover", "streamer", "array", "vector")  # the kinds in `Usage.busy`, in order
MAX_MEMBERS = 8  # kernels per chain: each more takes its share of every bank, and a ring
WHOLE = (0, 0, 0)  # a member's share of everything: its own lowering
# a ring holding the slices the writer and the reader work on this many times over, where that
# costs no more: with room for one band of each, each waits on the other's every band (MobileNet
# v1's conv1 .. pw1 chained: 261,591 cycles; twice over 230,281)
RING_DEPTH = 2
# the objectives under which a chain that fits no other way may hold its links in rings of one
# band of each member, its units then taking turns: under `latency` no such chain was the faster
# (MobileNet v1 and v2 planned alike), and weighing them took v1's compile from 7.5 to 12.4 s
TIGHT_OBJECTIVES = frozenset({"energy", "edp"})
# the objectives under which a window op growing into larger banks may take them at fewer rows
# (`Planner._as_tall`): under `latency` its estimate took such trades 0.4 to 0.9% faster that ran
# 0.1% slower, for 0.9% more energy (MobileNet v1); by energy and edp v1 ran 5% and 3% faster
TRADING = frozenset({"energy", "edp"})
# the objectives under which a chain offers its rings once as deep (`Plan.shallow`) to make room
# for a home: the bytes that saves count in their figure, and a deeper ring's cycles, which the
# figure does not tell apart, may be worth more than the bytes under `latency` (EfficientNet-B0 by
# latency took offers and ran 0.08% slower for 1.6 MB less DRAM)
GIVING = frozenset({"energy", "edp"})
# by how much of its members' figure (each on its own) a chain must pay: their estimates'
# rounding. Of the members', not of the whole network's so far: with that, a chain near a
# network's end had to save ten times what one near its start did (MobileNet v1's last
# pointwise and depthwise, 5.8% faster chained by their estimate, went unchained)
TIE = 0.01
# by how much the cut of shares may fall short of the members tiled for the whole target before
# every pair of shares is tried (a two-kernel chain): the cut goes wrong seldom, but far (the
# search lowers each member under many shares: MobileNet v1 takes 1,052 lowerings, 451 without)
SHORT = 0.1
# how much of the stake a pair's least cost (`Planner.least`) must leave to gain for the search to
# run: on the 73 comparison inputs under the three objectives, 68 of the 721 searches left less,
# none of which found the chain the planner took (27 of the searches' 398 s in process; light
# resnet50's two by latency: it compiles in 4.2 s, not 5.9, wall)
SEARCHED = 0.02

# lower a fusion group (anchor and epilogue) of the graph for a target, under a kernel name
Lower = Callable[[Graph, list[Op], str, Target], Kernel]


@dataclass(frozen=True)
class Rung:
    """A member lowered for a share of the target, and what it holds while it runs."""

    kernel: Kernel
    buffers: tuple[tuple[str, int], ...]  # its L1 and L2 buffers on one compute tile
    workers: int  # the compute tiles it runs on (`residency.workers`)
    # (written, dim) -> `band`'s: every state of every chain the rung is in asks for them
    _link_bands: dict[tuple[bool, int], tuple[int, int, int]] = field(default_factory=dict, compare=False, repr=False)
    _loops: dict[tuple[bool, int], TileLoop | None] = field(default_factory=dict, compare=False, repr=False)

    def band(self, written: bool, dim: int) -> tuple[int, int, int]:
        """`_band` of its result (`written`) or its window input, along `dim`."""
        key = (written, dim)
        if key not in self._link_bands:
            k = self.kernel
            self._link_bands[key] = _band(k, k.outputs[0] if written else k.inputs[0], written, dim)
        return self._link_bands[key]

    def loop(self, written: bool, dim: int) -> TileLoop | None:
        """Its band loop (`Kernel.band_loop`) of its result (`written`) or of its window input
        along `dim` (a 1x1 convolution whose tiles of output channels or rows are dealt to the
        compute tiles reads its input by the next loop)."""
        key = (written, dim)
        if key not in self._loops:
            k = self.kernel
            self._loops[key] = k.band_loop(k.outputs[0] if written else k.inputs[0], dim)
        return self._loops[key]


@dataclass(frozen=True)
class Plan:
    """A chain as it would run: its members' shares of the target and each link's ring (None: the
    whole tensor), its links on chip or passing through external memory band by band."""

    first: int  # its first kernel's position
    shares: tuple[tuple[int, int, int], ...]  # each member's (`Planner`)
    rings: dict[str, int | None]
    usage: Usage  # the members' (`together`)
    on_chip: bool = True
    dim: int = BY_ROWS  # what its bands and rings are of
    # its rings once as deep as the slices in flight, in the order of `rings`, where they are
    # `RING_DEPTH` times that, at the same shares, and the figure so is within `TIE` of its own
    # (for two members the figure does not tell the depths apart): rings `residency.keep_on_chip`
    # may take to make room for a home, under `GIVING`
    shallow: tuple[int | None, ...] | None = None


@dataclass(frozen=True)
class Fit:
    """Members at some shares: their links' rings, how far they are from fitting the target at
    once (0: they fit), what they cost running together."""

    shares: list[tuple[int, int, int]]
    rings: list[int | None]
    over: float
    usage: Usage


@dataclass(frozen=True)
class Way:
    """A way to run the kernels so far: its cycles and pJ, its chains."""

    cycles: float
    pj: float
    chains: list[Plan]

    def then(self, u: Usage, plan: Plan | None = None) -> Way:
        """This way, then kernels costing `u` (a chain as `plan`)."""
        return Way(self.cycles + u.cycles, self.pj + u.pj, self.chains + ([plan] if plan is not None else []))

    def better(self, other: Way, objective: str, stake: Usage, margin: float = TIE) -> bool:
        """A figure of the objective lower than `other`'s with `margin` of `stake` (what the kernels
        that would chain cost alone) taken off its cycles and pJ, by default `TIE`: a chain must pay
        by more than the rounding of their estimates (so for `edp` too, whose figure is no sum)."""
        return figure(self, objective) < figure(Way(other.cycles - margin * stake.cycles,
                                                    other.pj - margin * stake.pj, []), objective)


def link(before: Kernel, after: Kernel, graph: Graph, readers: Counter) -> str | None:
    """The tensor through which `after` may follow `before` in a chain, or None: both anchored on
    a sliding-window op, `after`'s window input (its first operand) `before`'s one result, read by
    `after` alone, an intermediate NHWC tensor of one image. `readers`: tensor -> kernels reading it."""
    if before.op not in WINDOWED or after.op not in WINDOWED or len(before.outputs) != 1:
        return None
    t = graph.tensors[before.outputs[0]]
    if (after.inputs[0] != t.name or readers[t.name] != 1 or after.inputs.count(t.name) != 1
            or t.role != "intermediate" or len(t.shape) != 4 or t.shape[0] != 1):
        return None
    return t.name


def share_of(target: Target, near: float, l3: float, rows: float | None = 1.0, by_channels: bool = False) -> Target:
    """The target with `near` of every L1 and L2 bank's bytes and `l3` of L3's (in whole lines),
    its window ops' tiles at most `rows` of their output rows (None: the whole image), reading
    their window input `by_channels` or not."""
    line = target.line_bytes

    def part(level: Level, share: float) -> Level:
        return Level(level.banks, int(level.bank_bytes * share) // line * line)

    return dataclasses.replace(target, l1=part(target.l1, near), l2=part(target.l2, near), l3=part(target.l3, l3),
                               rows_share=rows, reads_by_channels=by_channels)


def _runs(kernel: Kernel, compute_tiles: int) -> dict[int, int]:
    """How often each op of the body runs, on all compute tiles: once per step of the loops
    enclosing its place; a move outside the parallel loop on each compute tile but a shared one."""
    shared, tiles = kernel.shared_moves(), workers(kernel, compute_tiles)
    return {op.op_id: kernel.runs(op) * (1 if kernel.in_parallel_loop(op) or op.op_id in shared else tiles)
            for op in kernel.body}


@dataclass(frozen=True)
class Usage:
    """What running kernels costs: cycles, and the pJ their moves take (as `hardware.energy`
    charges them)."""

    cycles: float
    pj: float
    busy: tuple[float, ...] = ()  # the cycles of each kind of engine (`usage`: ENGINES)
    port: float = 0.0  # the cycles the busiest L2 bank's ports are held

    @property
    def in_turn(self) -> float:
        """The cycles of its array and its vector unit, one after the other."""
        return self.busy[ENGINES.index("array")] + self.busy[ENGINES.index("vector")]


def together(usages: list[Usage]) -> Usage:
    """A chain's members: the loader runs them at once, interleaved by bands, so each kind of
    engine does all their work and the kinds overlap; their pJ add up. Their L2 buffers count as
    in banks of their own, as each member's do (where the binder cannot spread them so, the
    port takes longer)."""
    busy = tuple(map(sum, zip(*(u.busy for u in usages))))
    port = max(u.port for u in usages)
    return Usage(max(*busy, port), sum(u.pj for u in usages), busy, port)


def usage(kernel: Kernel, graph: Graph, target: Target, links: frozenset[str] = frozenset(),
          chained: bool = False, in_l2: frozenset[str] = frozenset()) -> Usage:
    """What the kernel costs. Its cycles: those of its busiest kind of engine (all of a kind
    together, the kinds overlapping): the DMAs with its external-memory bytes and moves (each
    holds its engine for the memory's latency), the BlockMovers and the Streamers with their
    bytes, the array with its cycles on the busiest compute tile, the vector unit with its
    elements (the kernel's, or its epilogue's) on each compute tile it runs on; or of the busiest
    L2 bank's ports (a 14 x 14 pointwise taken a row at a time brings all its weights down through
    one bank for each row: MobileNet v2's 576 -> 96 pointwise, rated by its array at 26,040
    cycles, took 61,203). Each compute tile's copy of an L2 buffer has a bank, whose ports (each
    at a Streamer's rate) take every byte moved into it and out of it; but a load more than one
    deep of whole lines has a bank per slot, where the kernel is not `chained` (as the loader
    binds them, `kernel_demands`). A move of one of `links` at its home is none of the DMAs': it
    runs in place, or as a BlockMover's copy where it makes a padded band; of one of `in_l2`
    (kept in L2, `Tensor.home`), neither a move to or from external memory nor one between its
    plain L2 tile and L3 runs at all: the tile is that region of its home."""
    c, runs = target.costs, _runs(kernel, target.compute_tiles)
    pj = c.energy.access_pj_per_byte
    tiles = workers(kernel, target.compute_tiles)
    moves = movers = streamers = 0
    energy = 0.0
    ported: Counter = Counter()  # L2 buffer -> the bytes its bank's port takes in and gives out
    banks: dict[int, int] = {}  # L2 buffer -> the banks its slots lie in, a bank each where unchained
    for op in kernel.body:
        if not isinstance(op, DataMove) or op.move_type == "VIEW":
            continue
        levels = {op.source.level, op.destination.level}
        if op.destination.tensor in in_l2 and levels <= {"EXTERNAL", "L3", "L2"}:
            continue
        tile = math.prod(op.destination.tile_shape) * itemsize(graph.tensors[op.destination.tensor].dtype)
        moved = runs[op.op_id] * tile
        if (buffer := op.l2_port()) is not None:
            ported[buffer] += moved
            if op.destination.tensor in in_l2:  # its home lies in pieces in every bank
                banks[buffer] = target.l2.banks
        if not chained and op.move_type == "LOAD" and op.destination.level == "L2" and tile % target.line_bytes == 0:
            banks[op.op_id] = op.depth
        if "EXTERNAL" in levels:
            if op.source.tensor not in links:
                moves += runs[op.op_id]  # its bytes are the hints' exact count
            elif op.destination.padding is not None:
                movers += moved
                energy += moved * 2 * pj["l3"]
            continue
        if levels <= {"L3", "L2"}:
            movers += moved
        else:
            streamers += moved
        energy += moved * (pj[op.source.level.lower()] + pj[op.destination.level.lower()])
    dram = sum(b for t, b in kernel.hints["dram_bytes_per_stream"].items() if t not in links | in_l2)
    vector = c.vector_cycles(kernel.hints.get("vector_elements", {})) / tiles
    port = max((n / banks.get(b, 1) for b, n in ported.items()), default=0) / tiles / c.l2_bank_bytes_per_cycle
    busy = (*link_busy(c, dram, moves, movers, streamers), kernel.hints.get("estimated_compute_cycles", 0), vector)
    return Usage(max(*busy, port), energy + dram * (pj["external"] + pj["l3"]), busy, port)


def _rank(u: Usage, objective: str) -> tuple[float, float, float]:
    """How plans of one chain rank: by the objective's figure, then by the work of all the
    engines (the figure counts the busiest kind alone, but the others wait on each other too),
    then by pJ."""
    return figure(u, objective), sum(u.busy), u.pj


def _turns(rungs: list[Rung]) -> bool:
    """Whether a chain's members take the array and the vector unit in turns: more than two of
    them, a member of one unit between members of the other (MobileNet's pointwise, depthwise,
    pointwise), not a pointwise on the array and then its pool and its classifier on the vector
    unit."""
    units = [r.kernel.dataflow == "vector" for r in rungs]
    return len(units) > 2 and sum(a != b for a, b in zip(units, units[1:])) > 1


def _whole_rows(kernel: Kernel, graph: Graph) -> bool:
    """Whether a kernel on the vector unit takes whole rows of its output a tile (one on the array
    need not). A tile of part of a row holds few outputs, and its step's moves (its band in
    through three levels, its result out), not its vector work, set its pace, which `usage` does
    not count: MobileNet v2's dw10 chained between its 1x1s at 4 x 8 outputs a tile kept its
    vector unit 39% busy, and the chain ran 26,480 cycles longer than its first 1x1 alone and
    the other two chained. A product of one row on the vector unit (`lower_gemv`) has one output
    position: it goes by bands of its input's channels, each step a chunk of K for a whole tile of
    its results."""
    if kernel.dataflow != "vector" or "Tk" in kernel.tiling:
        return True
    return "C" in kernel.tiling and kernel.tiling["C"] >= graph.tensors[kernel.outputs[0]].shape[2]


def _rows(kernel: Kernel, graph: Graph, dim: int) -> list[int]:
    """The indices into `ROWS` of a member going by bands along `dim`: the whole image, or the
    shares of its output rows that each leave its tiles fewer rows than the one before (a
    7 x 7 image takes 1 row at 1/8 and at 1/16: one lowering, not two)."""
    if dim == BY_CHANNELS:
        return [ROWS.index(None)] + ([CHANNEL_BANDS] if kernel.op == "CONV2D" else [])
    height = graph.tensors[kernel.outputs[0]].shape[1]
    most = {r: max(1, math.ceil(height * share)) for r, share in enumerate(ROWS) if share is not None}
    return [r for r in most if r == 0 or most[r] < most[r - 1]]


def figure(u: Usage | Way, objective: str) -> float:
    """What the target's objective ranks by: cycles, pJ, or their product."""
    return {"latency": u.cycles, "energy": u.pj, "edp": u.pj * u.cycles}[objective]


def _band(kernel: Kernel, tensor: str, written: bool, dim: int) -> tuple[int, int, int]:
    """(slices along `dim`, slices between the starts of consecutive bands, where the first
    starts: before the tensor for a band with its halo) of the kernel's tiles of `tensor` where
    it meets external memory."""
    for op in kernel.body:
        if isinstance(op, DataMove) and op.move_type != "VIEW":
            ref = op.destination if written else op.source
            if ref.tensor == tensor and ref.level == "EXTERNAL":
                offset = ref.offset[dim] if ref.offset else 0
                return ref.tile_shape[dim], (ref.step or ref.tile_shape)[dim], offset
    raise ValueError(f"kernel '{kernel.name}' moves no tile of '{tensor}' at external memory")


def goes_along(kernel: Kernel, tensor: str, dim: int) -> bool:
    """Whether every move of the kernel that reads or writes `tensor` at its home (the external
    side, or a plain L3 tile) indexes its `dim` by its band loop (`Kernel.band_loop`; loops step
    upward): the order a chain's kernels visit the bands of a link in."""
    return kernel.band_loop(tensor, dim) is not None and kernel.off_band(tensor, dim) is None


def _once(rung: Rung, dim: int) -> bool:
    """Whether each compute tile of the rung goes through the bands of its window input along
    `dim` once: a parallel loop outside its band loop takes one step on each at most (as the
    loader's binder requires of a ring, `ring_passes`)."""
    k = rung.kernel
    return k.band_passes(k.inputs[0], dim, rung.workers) == 1


def _in_flight(rung: Rung, written: bool, dim: int, apart: bool = True) -> int:
    """Slices along `dim` of the rung's result (`written`) or window input its bands span at
    once: a band on each compute tile, the tiles consecutive bands apart (the loader deals them
    the steps of the band loop, or they go through the bands alike and one may get a band ahead
    of another); or, not `apart`, one band, the compute tiles waiting on each other for room. A
    reader's bands dealt to the compute tiles are apart regardless: one that has read its last
    band holds it to the end, while another may still need the band after (MobileNet-like
    1x1s and depthwise ops on 112 x 112 x 48, by energy, chained in rings one step short and
    stopped the loader)."""
    extent, step, _ = rung.band(written, dim)
    loop = rung.loop(written, dim)
    return extent + ((rung.workers - 1) * step if apart or (not written and loop is not None and loop.parallel)
                     else 0)


def ring_slices(writer: Rung, reader: Rung, extent: int, depth: int = 1, dim: int = BY_ROWS,
                apart: bool = True) -> int | None:
    """The slices along `dim` (rows, or channels), of its `extent` there, a link's home holds
    (the writer's one result, the reader's window input): the reader's bands in flight and the
    writer's next ones on every compute tile (`apart`) or on one (a reader's bands dealt to the
    compute tiles on every one regardless), `depth` times over; None where that is all of them."""
    slices = depth * (_in_flight(reader, False, dim, apart) + _in_flight(writer, True, dim, apart))
    return slices if slices < extent else None


@dataclass(frozen=True)
class Stage:
    """A chain member as its pipeline goes (`pipeline`): its cycles spread evenly over the bands of
    its band loop, each compute tile's one after another."""

    cycles: float
    bands: int
    tiles: int  # the compute tiles its bands are dealt to round-robin (1: each band on all at once)
    # of the link from the member before, along the dim the chain goes by: (extent, step, offset)
    # of the band it reads, and the link's extent there
    reads: tuple[int, int, int, int] = (0, 0, 0, 0)
    writes: int = 1  # slices along that dim between the starts of the bands of its result it writes
    tail: float = 0.0  # cycles after its last band before its result is in L3 (`tail`)


def pipeline(stages: list[Stage]) -> float:
    """When the last of a chain's members ends, a band of each starting once its compute tile
    has ended the one before and the member before has ended every band of the slices it reads.
    A reader waits for as much of its writer as its first band needs: a pointwise taking 9 of 14
    rows a band waits for 5 of its depthwise's 7 bands, not one. The last member ends its
    `tail` after its last band."""
    ends: list[float] = []  # the member before's: when each of its bands ends, the latest so far
    written = 1
    for stage in stages:
        # the planner runs this for every state it weighs: plain comparisons, not min and max
        each = stage.cycles / -(-stage.bands // stage.tiles)
        extent, step, offset, size = stage.reads
        free = [0.0] * stage.tiles
        mine: list[float] = []
        latest = 0.0
        for b in range(stage.bands):
            tile = b % stage.tiles
            start = free[tile]
            if ends:
                last = b * step + offset + extent
                last = (size if last > size else last) - 1
                band = (last if last > 0 else 0) // written
                ready = ends[band] if band < len(ends) else ends[-1]
                if ready > start:
                    start = ready
            free[tile] = start = start + each
            if start > latest:
                latest = start
            mine.append(latest)
        ends, written = mine, stage.writes
    return ends[-1] + stages[-1].tail


def tail(kernel: Kernel, graph: Graph, target: Target) -> float:
    """The cycles a kernel on the array takes after its last step, on each compute tile, before its
    result is in L3: its last result tile's epilogue on the vector unit and its moves up through
    L2, one after another; alone, or last in a chain (a member before another ends under the
    work of the next). A 1x1 reading its link by channels, its tiles of output channels dealt to
    the compute tiles, holds each until its last chunk: its tail is its whole tile's (MobileNet v1
    on datacenter, a 14 x 14 pointwise holding its 512 output channels on 4 compute tiles: 2,352
    cycles from its array's last step to its result in L3, which the depthwise after it waited
    for; going by rows, a band's). None for a kernel on the vector unit: its drain shrinks with
    its tiles while the cost of their steps, which no estimate counts, grows."""
    stores = [op for op in kernel.body if isinstance(op, DataMove) and op.move_type == "STORE"
              and op.destination.level != "EXTERNAL"]
    if kernel.dataflow in ("vector", "moves") or not stores:
        return 0.0
    costs, first = target.costs, stores[0]
    tiles = kernel.runs(first) * (1 if kernel.in_parallel_loop(first) else workers(kernel, target.compute_tiles))
    cycles = costs.vector_cycles(kernel.hints.get("vector_elements", {})) / tiles
    for op in stores:
        rate = costs.block_mover_bytes_per_cycle if {op.source.level, op.destination.level} == {"L2", "L3"} \
            else costs.streamer_bytes_per_cycle
        cycles += math.prod(op.destination.tile_shape) * itemsize(graph.tensors[op.destination.tensor].dtype) / rate
    return cycles


def _stages(each: list[Usage], rungs: list[Rung], graph: Graph, dim: int, target: Target) -> list[Stage]:
    """The chain's members (their cycles `each`) as `pipeline` takes them, going by `dim`."""
    out = []
    for i, (u, rung) in enumerate(zip(each, rungs)):
        last = i == len(rungs) - 1
        loop = rung.loop(not last, dim)
        reads = (*rung.band(False, dim), graph.tensors[rung.kernel.inputs[0]].shape[dim]) if i else (0, 0, 0, 0)
        writes = rung.band(True, dim)[1] if not last else 1
        out.append(Stage(u.cycles, loop.trip_count, rung.workers if loop.parallel else 1, reads, writes,
                         tail(rung.kernel, graph, target) if last else 0.0))
    return out


def ring_bytes(tensor: str, ring: int | None, graph: Graph, dim: int = BY_ROWS) -> int:
    """The bytes of a link's home holding `ring` slices along `dim` (None: all of them)."""
    return home_bytes(dataclasses.replace(graph.tensors[tensor], ring=ring, ring_dim=dim))


def group_signature(group: list[Op], graph: Graph) -> tuple:
    """What a group's lowering depends on: its ops, how they wire their tensors, and those
    tensors' shapes, dtypes and roles (networks repeat their layers: each is planned once)."""
    names = list(dict.fromkeys(t for op in group for t in op.inputs + op.outputs))
    return (tuple((op.op_type, repr(sorted(op.attrs.items())), tuple(names.index(t) for t in op.inputs),
                   tuple(names.index(t) for t in op.outputs)) for op in group),
            tuple((graph.tensors[t].shape, graph.tensors[t].dtype, graph.tensors[t].role) for t in names))


class Planner:
    """The chains of a program's kernels (in execution order): which, their tilings, their rings.
    A member's share is a triple of indices: into `SHARES`, its fraction of every L1 and L2
    bank's bytes, and of L3's; into `ROWS`, of its output rows a tile may hold. Kernels of one
    signature are planned on the first of them, their `proxy`: its tiles, buffers and cycles are
    theirs; a member's links are its window input and its result, the proxy's own."""

    def __init__(self, kernels: list[Kernel], graph: Graph, target: Target, lower: Lower):
        self.kernels, self.graph, self.target, self.lower = kernels, graph, target, lower
        # the tensors between chains kept on chip (`boundary_homes`): their plain tiles in their
        # homes hold nothing, and their homes' room is off the target's
        kept = target.in_l3 | target.in_l2
        readers = Counter(t for k in kernels for t in set(k.inputs))
        self.links = [link(a, b, graph, readers) for a, b in zip(kernels, kernels[1:])]
        ops = {op.name: op for op in graph.ops}
        self.groups = [[ops[k.graph_op]] + [ops[name] for name in k.epilogue] for k in kernels]
        first: dict[tuple, int] = {}
        # one touching a tensor kept on chip is its own: it is lowered for that tensor's home
        self.proxy = [i if kept.intersection([*k.inputs, *k.outputs]) else first.setdefault(group_signature(g, graph), i)
                      for i, (k, g) in enumerate(zip(kernels, self.groups))]
        self._rungs: dict[tuple[int, int, int, int], Rung | None] = {}
        self._linked: dict[tuple, tuple[Usage, int]] = {}
        self._unfit: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (proxy, rows) -> shares no tiling fits
        self._fitting: dict[tuple, bool] = {}  # sorted buffers of a level -> whether they fit its banks
        self._homes: dict[tuple[str, int | None, int], int] = {}  # (link, ring, dim) -> its home's bytes in lines
        self._fills: dict[tuple, float] = {}  # (state, dim) -> its pipeline's fill (`_filled`)
        self._alone: dict[int, Usage] = {}  # `alone`
        # the members' proxies -> their `plan`, and whether the pair search had its turn
        self._plans: dict[tuple[int, ...], tuple[Plan | None, bool]] = {}

    def lowered(self, i: int, share: tuple[int, int, int]) -> Kernel:
        """Kernel i lowered for `share` of the target (CompileError: no tiling fits it); for the
        whole target, its own lowering."""
        if share == WHOLE:
            return self.kernels[i]
        near, l3, rows = share
        return self.lower(self.graph, self.groups[i], self.kernels[i].name,
                          share_of(self.target, SHARES[near], SHARES[l3], ROWS[rows] if rows < len(ROWS) else None,
                                   rows == CHANNEL_BANDS))

    def rung(self, i: int, share: tuple[int, int, int]) -> Rung | None:
        """Kernel i's proxy lowered for `share` (None: no tiling fits it; nor, without lowering,
        where none fits a share no smaller of L1 and L2 and of L3, with the same share of its rows)."""
        key = (self.proxy[i], *share)
        if key not in self._rungs:
            near, l3, rows = share
            unfit = self._unfit.setdefault((self.proxy[i], rows), [])
            if any(n <= near and l <= l3 for n, l in unfit):
                self._rungs[key] = None
            else:
                try:
                    m = self.lowered(self.proxy[i], share)
                    self._rungs[key] = Rung(m, tuple(b for b in body_buffers(m.body, self.graph, self.target.in_l2)
                                                     if b[0] != "L3"), workers(m, self.target.compute_tiles))
                except CompileError:
                    self._rungs[key] = None
                    unfit.append((near, l3))
        return self._rungs[key]

    def linked(self, i: int, share: tuple[int, int, int], ends: tuple[bool, bool]) -> tuple[Usage, int]:
        """`usage` of kernel i's proxy lowered for `share` and the L3 bytes of its buffers
        (`residency.l3_demand`), with its window input (ends[0]) and its result (ends[1]) on chip
        where they are links: no external-memory bytes, their plain L3 tiles in their homes."""
        key = (self.proxy[i], *share, ends)
        if key not in self._linked:
            k = self.rung(i, share).kernel
            links = frozenset(t for t, linked in zip((k.inputs[0], k.outputs[0]), ends) if linked)
            target = self.target
            self._linked[key] = (usage(k, self.graph, target, links | target.in_l3, chained=True, in_l2=target.in_l2),
                                 l3_demand(k, self.graph, target, links | target.in_l3 | target.in_l2))
        return self._linked[key]

    def l3_beside(self, plan: Plan, tensor: str) -> int:
        """The bytes of L3 a chain as planned takes beside a home of `tensor`, that home's with
        them: its members' buffers (their tiles of `tensor` and of its links in their homes) and
        its links' homes, in the shallower rings it offers (`Plan.shallow`)."""
        last = plan.first + len(plan.shares) - 1
        own = sum(self.linked(i, s, (i > plan.first or self.kernels[i].inputs[0] == tensor,
                                     i < last or self.kernels[i].outputs[0] == tensor))[1]
                  for i, s in enumerate(plan.shares, plan.first))
        rings = zip(plan.rings, plan.shallow or plan.rings.values())
        homes = sum(self._home_lines(t, n, plan.dim) for t, n in rings) if plan.on_chip else 0
        return own + homes + in_lines(home_bytes(self.graph.tensors[tensor]), self.target.line_bytes)

    def alone(self, i: int) -> Usage:
        """Kernel i run on its own, as lowered: its usage and its tail (each way `boundary_homes`
        weighs asks again for every kernel outside chains)."""
        if i not in self._alone:
            own = usage(self.kernels[i], self.graph, self.target)
            self._alone[i] = dataclasses.replace(own, cycles=own.cycles + tail(self.kernels[i], self.graph, self.target))
        return self._alone[i]

    def usage(self, i: int, share: tuple[int, int, int], ends: tuple[bool, bool]) -> Usage:
        """`linked`'s usage."""
        return self.linked(i, share, ends)[0]

    def unshared(self, first: int, last: int) -> Usage:
        """Kernels first .. last chained, each tiled for the whole target."""
        return together([self.usage(i, WHOLE, (i > first, i < last)) for i in range(first, last + 1)])

    def least(self, first: int, last: int) -> Usage:
        """What kernels first .. last chained cost at the least, each as lowered for the whole
        target, none lowered again: `unshared`, and the fill no pipeline of theirs avoids
        (`pipeline`), going by rows or by channels, whichever is less. Each member but the first
        starts once the one before has written what its first band reads; the slowest ends no
        sooner than its cycles after its start; each after it then reads what the last bands of
        the one before wrote (one on each compute tile, ending at once); the last ends with its
        `tail` (`_reads`: how much of a link those are). Planning a chain costs lowerings by the
        dozen: DenseNet-121 has 58 pairs of a 1x1 and a 3x3, no two alike, none of which pays
        chained (their fill outweighs the tail of the 1x1 they would hide); planned, they took
        its compile from 3.9 to 28.5 s in process."""
        members = range(first, last + 1)
        usages = [self.usage(i, WHOLE, (i > first, i < last)) for i in members]
        each = [u.cycles for u in usages]
        fills = []
        for dim in (BY_ROWS, BY_CHANNELS):
            starts, lasts = [0.0], [0.0]
            for i, writer, reader in zip(members, each, each[1:]):
                extent = self.graph.tensors[self.links[i]].shape[dim]
                first_read, last_read = self._reads(i + 1, dim)
                starts.append(starts[-1] + writer * min(first_read, extent) / extent)
                lasts.append(reader * min(last_read * self.target.compute_tiles, extent) / extent)
            ends = max(start + cycles + sum(lasts[m + 1:]) for m, (start, cycles) in enumerate(zip(starts, each)))
            fills.append(ends - max(each))
        chained = together(usages)  # as `unshared`
        return dataclasses.replace(chained, cycles=chained.cycles + min(fills) + tail(self.kernels[last], self.graph,
                                                                                     self.target))

    def _reads(self, i: int, dim: int) -> tuple[int, int]:
        """The slices along `dim` of its link kernel i reads at the least before its first band,
        and of one band of the writer's (`least`): by rows, what its first row's windows read, and
        its stride; by channels, the writer's tile of them (a convolution's at least the array's
        columns, as `lower_conv` takes them)."""
        if dim == BY_CHANNELS:
            band = self.target.cols if self.kernels[i - 1].op == "CONV2D" else 1
            return band, band
        op = self.groups[i][0]
        opdef = lookup(op.op_type)
        rows, _ = opdef.windows(opdef.normalize_attrs(op.attrs), [self.graph.tensors[t].shape for t in op.inputs])
        return max(1, rows.span - rows.before), rows.stride

    def _bands(self, rung: Rung, written: bool, dim: int) -> int:
        """The bands of its result (`written`) or window input along `dim` one compute tile of the
        rung's kernel goes through: its band loop's, dealt to the compute tiles where that loop is
        the parallel one."""
        loop = rung.loop(written, dim)
        return loop.trip_count // self.target.compute_tiles if loop.parallel else loop.trip_count

    def _usable(self, i: int, share: tuple[int, int, int], ends: tuple[bool, bool], dim: int) -> bool:
        """Whether kernel i lowered for `share` goes by bands along `dim` of its links (both by one
        loop where it reads one and writes one), and, where it writes one, through more than one on
        each compute tile (with one, its bands all end at once and the reader waits for the whole
        link); on the vector unit, by tiles of whole rows (`_whole_rows`). Lowered to read its window
        input by channels (`CHANNEL_BANDS`) only where that is a link."""
        r = None if share[2] == CHANNEL_BANDS and not ends[0] else self.rung(i, share)
        return r is not None and all(goes_along(r.kernel, t, dim)
                                     for t, linked in zip((r.kernel.inputs[0], r.kernel.outputs[0]), ends) if linked) \
            and (not all(ends) or r.loop(False, dim) == r.loop(True, dim)) and (not ends[0] or _once(r, dim)) \
            and (not ends[1] or self._bands(r, True, dim) > 1) and _whole_rows(r.kernel, self.graph)

    def _first(self, i: int, ends: tuple[bool, bool], dim: int) -> tuple[int, int, int] | None:
        """The largest equal shares of every level for which kernel i goes by bands along `dim`
        of its links: by rows, with the largest share of its rows for which those do; by
        channels, holding the whole image."""
        shares = ((s, s, r) for s in range(len(SHARES)) for r in _rows(self.kernels[i], self.graph, dim))
        return next((share for share in shares if self._usable(i, share, ends, dim)), None)

    def _home_lines(self, tensor: str, ring: int | None, dim: int) -> int:
        """The bytes in whole lines of a link's home holding `ring` slices along `dim`."""
        key = (tensor, ring, dim)
        if key not in self._homes:
            self._homes[key] = in_lines(ring_bytes(tensor, ring, self.graph, dim), self.target.line_bytes)
        return self._homes[key]

    def _overflow(self, rungs: list[Rung], l3: int) -> float:
        """How far the rungs' L1 and L2 buffers and `l3` bytes of L3 are from fitting the target at
        once: 0 where they fit, else the fractions by which each level is over (a little where
        only the packing of banks fails)."""
        target = self.target
        capacity = target.l3.banks * target.l3.bank_bytes * target.compute_tiles
        over = max(0.0, l3 / capacity - 1)
        for name, level in (("L1", target.l1), ("L2", target.l2)):
            buffers = tuple(sorted(b for r in rungs for b in r.buffers if b[0] == name))
            if buffers not in self._fitting:  # the states of a cut share most of their members' buffers
                self._fitting[buffers] = fits(buffers, target)
            if not self._fitting[buffers]:
                over += max(0.01, sum(b for _, b in buffers) / (level.banks * level.bank_bytes) - 1)
        return over

    def _filled(self, took: Usage, each: list[Usage], rungs: list[Rung], dim: int, state: tuple) -> Usage:
        """A chain (`took`, its members `each`) with its pipeline's fill: how much later than its
        slowest member alone its last member ends, each member's bands going one after another
        on each compute tile, each once the member before has written all it reads (`pipeline`).
        `state`: what sets `each` and `rungs` (the members' proxies, their shares, and whether the
        links are on chip)."""
        key = (state, dim)
        if key not in self._fills:  # the cut and the growth weigh most states many times
            stages = _stages(each, rungs, self.graph, dim, self.target)
            self._fills[key] = pipeline(stages) - max(u.cycles for u in each)
        return dataclasses.replace(took, cycles=took.cycles + max(self._fills[key], 0.0))

    def _usables(self, i: int, ends: tuple[bool, bool], dim: int) -> list[tuple[int, int, int]]:
        """Every share for which kernel i goes by bands along `dim` of its links, its shares of
        L1 and L2 and of L3 a step apart at most (the pair search's: the others cost lowerings
        that seldom pay)."""
        return [(n, l, r) for r in _rows(self.kernels[i], self.graph, dim) for n in range(len(SHARES))
                for l in range(max(n - 1, 0), min(n + 2, len(SHARES))) if self._usable(i, (n, l, r), ends, dim)]

    def _steps(self, i: int, share: tuple[int, int, int], ends: tuple[bool, bool], dim: int,
               way: int = 1, rows: bool = True) -> list[tuple[int, int, int]]:
        """The next smaller shares (`way` -1: larger), of L1 and L2, of L3, or of both alike, and
        with `rows` of its rows (the next that changes how many bands it goes by), for which kernel
        i goes by bands along `dim` of its links; growing with `rows` under `TRADING`, a window
        op's larger banks also at fewer rows (`_as_tall`)."""
        out = []
        if rows:
            row_shares = _rows(self.kernels[i], self.graph, dim)
            at, bands = row_shares.index(share[2]), self._bands(self.rung(i, share), ends[1], dim)
            for r in (row_shares[at + 1:] if way > 0 else reversed(row_shares[:at])):
                other = (share[0], share[1], r)
                if self._usable(i, other, ends, dim) and self._bands(self.rung(i, other), ends[1], dim) != bands:
                    out.append(other)
                    break
        for step in ((way, 0), (0, way), (way, way)):
            near, l3 = share[0] + step[0], share[1] + step[1]
            while 0 <= min(near, l3) and max(near, l3) < len(SHARES):
                if self.rung(i, (near, l3, share[2])) is None:
                    break  # no tiling fits: none fits a smaller share either (a larger one has one)
                if self._usable(i, (near, l3, share[2]), ends, dim):
                    out.append((near, l3, share[2]))
                    if way < 0 and rows and self.kernels[i].dataflow == "vector" and self.target.objective in TRADING:
                        out += self._as_tall(i, share, (near, l3), ends, dim)
                    break
                near, l3 = near + step[0], l3 + step[1]
        return out

    def _band_slices(self, i: int, share: tuple[int, int, int], ends: tuple[bool, bool], dim: int) -> int:
        """The slices along `dim` of a band of kernel i's result (where it is a link) or of its
        window input, lowered for `share`."""
        return self.rung(i, share).band(ends[1], dim)[0]

    def _as_tall(self, i: int, share: tuple[int, int, int], banks: tuple[int, int], ends: tuple[bool, bool],
                 dim: int) -> list[tuple[int, int, int]]:
        """Where kernel i's larger shares of L1 and L2 and of L3, `banks`, would make its bands
        taller than at `share` (and its links' rings larger), the same banks at the first fewer
        rows at which they are as tall: the room in more channels a tile, fewer and larger moves
        (docs/DESIGN.md, Chains: MobileNet v1's dw2 by edp)."""
        tall = self._band_slices(i, share, ends, dim)
        if self._band_slices(i, (*banks, share[2]), ends, dim) <= tall:
            return []
        row_shares = _rows(self.kernels[i], self.graph, dim)
        for r in row_shares[row_shares.index(share[2]) + 1:]:
            if self._usable(i, (*banks, r), ends, dim):
                found = self._band_slices(i, (*banks, r), ends, dim)
                if found <= tall:
                    return [(*banks, r)] if found == tall else []
        return []

    def plan(self, first: int, last: int, search: bool = True) -> Plan | None:
        """Kernels first .. last as one chain, or None where they do not fit the target at once
        going by bands of rows or of channels (each member holding the whole image), the links in
        rings of `RING_DEPTH` times the slices in flight where that costs no more than the
        objective's `TIE`, else of them once, else (under `TIGHT_OBJECTIVES`) of one band of each
        member; or of channels, the links through external memory (`_fitted`).
        The one of lower figure (`_rank`); for two kernels where even that falls short of them
        tiled for the whole target by more than `SHORT`, of those and of the best of every pair of
        usable shares, where `search`. Members of the signatures of ones planned before are planned
        as those were (networks repeat their blocks: their links have the same shapes), but for the
        search: a pair planned without it is searched where it recurs with `search`."""
        members = range(first, last + 1)
        key = tuple(self.proxy[i] for i in members)
        rank = lambda p: _rank(p.usage, self.target.objective)  # noqa: E731
        if key not in self._plans:
            self._plans[key] = min(self._ways(first, last, False), key=rank, default=None), False
        plan, searched = self._plans[key]
        if search and not searched and last == first + 1:
            if self._short([plan] if plan else [], first, last):
                plan = min(([plan] if plan else []) + self._ways(first, last, True), key=rank, default=None)
            self._plans[key] = plan, True
        return plan and dataclasses.replace(plan, first=first, rings={self.links[i]: n for i, n in
                                                                      zip(members, plan.rings.values())})

    def _ways(self, first: int, last: int, search: bool) -> list[Plan]:
        """The plans by rows and by channels on chip (rings as deep as pays; where none fits, under
        `TIGHT_OBJECTIVES`, of one band of each member), and by channels through external memory."""
        objective = self.target.objective
        ways = []
        for dim in (BY_ROWS, BY_CHANNELS):
            once = self._fitted(first, last, dim, 1, search=search)
            deep = self._fitted(first, last, dim, RING_DEPTH, search=search) if once is not None else None
            if deep is not None and figure(deep.usage, objective) <= figure(once.usage, objective) * (1 + TIE):
                offered = (objective in GIVING and once.shares == deep.shares
                           and figure(once.usage, objective) <= figure(deep.usage, objective) * (1 + TIE))
                once = dataclasses.replace(deep, shallow=tuple(once.rings.values()) if offered else None)
            if once is None and objective in TIGHT_OBJECTIVES:
                once = self._fitted(first, last, dim, 1, search=search, apart=False)
            ways.append(once)
        ways.append(self._fitted(first, last, BY_CHANNELS, 1, on_chip=False, search=search))
        return [p for p in ways if p is not None]

    def _short(self, plans: list[Plan], first: int, last: int) -> bool:
        """Whether every one of `plans` (none: the cut found none that fits) costs more than the
        kernels tiled for the whole target by `SHORT`."""
        objective = self.target.objective
        bound = figure(self.unshared(first, last), objective) * (1 + SHORT)
        return all(figure(p.usage, objective) > bound for p in plans)

    def _fitted(self, first: int, last: int, dim: int, depth: int, on_chip: bool = True,
                search: bool = False, apart: bool = True) -> Plan | None:
        """Kernels first .. last as one chain going by bands along `dim` of its links, rings
        `depth` times the slices in flight (on every compute tile, or on one where not `apart`:
        `ring_slices`), the links on chip or through external memory:
        their shares cut until everything fits (`_cut`: of their banks alone and, going by rows,
        of their rows too; the better of the two), or, with `search`, the best of every
        combination of usable shares that fits; then grown where that pays (`_grown`), and
        without the search the best change of one member's usable share taken until none ranks
        better (`_descended`). Members
        taking the units in turns (`_turns`) in rings of one band's slack, or any whose rings hold
        one band of each, count as their array and vector unit taking turns."""
        members = range(first, last + 1)
        ends = [(i > first, i < last) for i in members]  # whether its window input, its result are links
        objective = self.target.objective

        def alone(shares: list[tuple[int, int, int]]) -> list[Usage]:
            """What each member costs at its share."""
            return [self.usage(i, s, e if on_chip else (False, False)) for i, s, e in zip(members, shares, ends)]

        def state(shares: list[tuple[int, int, int]]) -> Fit:
            """The rings, how far the members are from fitting, what they cost running at once."""
            rungs = [self.rung(i, s) for i, s in zip(members, shares)]
            rings = [ring_slices(a, b, self.graph.tensors[self.links[i]].shape[dim], depth, dim, apart)
                     for i, a, b in zip(members, rungs, rungs[1:])]
            homes = sum(self._home_lines(self.links[i], n, dim) for i, n in zip(members, rings)) if on_chip else 0
            l3 = sum(self.linked(i, s, e if on_chip else (False, False))[1] for i, s, e in zip(members, shares, ends))
            each = alone(shares)
            took = self._filled(together(each), each, rungs, dim,
                                (tuple(self.proxy[i] for i in members), tuple(shares), on_chip))
            # a middle member waits on both its rings; with one band's slack in each, the units
            # take turns (two members, one ring: they overlapped within 4% of their rating), as
            # they do with one band of each in a ring; where one unit's members all come before
            # the other's, the first never waits on the second's results, only for room
            if on_chip and depth == 1 and (_turns(rungs) or not apart):
                took = dataclasses.replace(took, cycles=max(took.cycles, took.in_turn))
            return Fit(shares, rings, self._overflow(rungs, l3 + homes), took)

        steps = [functools.partial(self._steps, i, ends=e, dim=dim) for i, e in zip(members, ends)]
        found: list[Fit] = []
        if search:
            # the pairs by the figure of their work without the fill, which no state of theirs
            # beats: past the best fit's figure, none ranks better
            pairs = sorted(((figure(together(alone(list(pair))), objective), pair) for pair in
                            itertools.product(*(self._usables(i, e, dim) for i, e in zip(members, ends)))),
                           key=lambda floored: floored[0])
            for floor, pair in pairs:
                if found and floor > figure(found[0].usage, objective):
                    break
                f = state(list(pair))
                if f.over == 0 and (not found or _rank(f.usage, objective) < _rank(found[0].usage, objective)):
                    found = [f]
        else:
            first_shares = [self._first(i, e, dim) for i, e in zip(members, ends)]
            # the cut is greedy: of the members' banks alone, or of their rows too, either may end
            # better (more ways to cut leave more ways to go wrong); by channels, no rows to cut
            bank_steps = [functools.partial(self._steps, i, ends=e, dim=dim, rows=False) for i, e in zip(members, ends)]
            ways = [bank_steps, steps] if dim == BY_ROWS else [steps]
            for by in ways if None not in first_shares else []:
                cut = self._cut(state(first_shares), state, by)
                if cut is not None and all(cut.shares != f.shares for f in found):
                    found.append(cut)
        fit = min((self._grown(f, state, steps) for f in found), key=lambda f: _rank(f.usage, objective), default=None)
        if fit is None:
            return None
        if not search:
            fit = self._descended(fit, state, [self._usables(i, e, dim) for i, e in zip(members, ends)])
        return Plan(first, tuple(fit.shares), {self.links[i]: n for i, n in zip(members, fit.rings)}, fit.usage,
                    on_chip, dim)

    def _cut(self, fit: Fit, state: Callable[[list], Fit], steps: list[Callable]) -> Fit | None:
        """Cut a level of the member whose cut frees the most room for the least it adds to the
        objective's figure, then to the energy (a cut that costs no cycles may cost DRAM bytes),
        until everything fits (None: no cut helps)."""
        objective = self.target.objective
        while fit.over > 0:
            moves = []
            for m, step in enumerate(steps):
                for cut in step(fit.shares[m]):
                    trial = state(fit.shares[:m] + [cut] + fit.shares[m + 1:])
                    if trial.over < fit.over:
                        freed = fit.over - trial.over
                        added = figure(trial.usage, objective) - figure(fit.usage, objective)
                        pj = trial.usage.pj - fit.usage.pj
                        moves.append((max(added, 0.0) / freed, max(pj, 0.0) / freed, trial.over, m, trial))
            if not moves:
                return None
            fit = min(moves, key=lambda move: move[:4])[4]
        return fit

    def _grown(self, fit: Fit, state: Callable[[list], Fit], steps: list[Callable]) -> Fit:
        """Give a member the next larger share, or the next smaller one (the cut stops at the
        first shares that fit), where it still fits beside the others and ranks better
        (`_rank`), the best such each time, until none does."""
        objective = self.target.objective
        while True:
            grown = [trial for m, step in enumerate(steps) for way in (-1, 1) for more in step(fit.shares[m], way=way)
                     if (trial := state(fit.shares[:m] + [more] + fit.shares[m + 1:])).over == 0
                     and _rank(trial.usage, objective) < _rank(fit.usage, objective)]
            if not grown:
                return fit
            fit = min(grown, key=lambda f: _rank(f.usage, objective))

    def _descended(self, fit: Fit, state: Callable[[list], Fit], usables: list[list]) -> Fit:
        """Take the one change of one member to another of its usable shares that ranks best
        beside the others' as they are, again and again until none ranks better: the cut and the
        growth go a step at a time, and a step can lead away from a better share (MobileNet v1's
        pw6 chained: of two shares that fit alike and rate alike in cycles, the cut reached the
        one of 4% more pJ, which ran 28,000 cycles longer)."""
        objective = self.target.objective
        while True:
            trials = (state(fit.shares[:m] + [share] + fit.shares[m + 1:])
                      for m, shares in enumerate(usables) for share in shares if share != fit.shares[m])
            better = min((t for t in trials if t.over == 0), key=lambda t: _rank(t.usage, objective), default=None)
            if better is None or _rank(better.usage, objective) >= _rank(fit.usage, objective):
                return fit
            fit = better

    def chains(self) -> list[Plan]:
        """The cut of the kernels into chains and single kernels with the lowest figure of the
        target's objective, each chain paying by more than `TIE` (a shortest path over cut
        points: best[j] is the best way to run the first j kernels)."""
        objective = self.target.objective
        best = [Way(0.0, 0.0, [])]
        alone = [Way(0.0, 0.0, [])]  # the first j kernels each on its own
        for j, kernel in enumerate(self.kernels, 1):
            own = self.alone(j - 1)
            best.append(best[j - 1].then(own))
            alone.append(alone[j - 1].then(own))
            first = j - 1
            while first > 0 and j - first < MAX_MEMBERS and self.links[first - 1] is not None:
                first -= 1
                stake = Usage(alone[j].cycles - alone[first].cycles, alone[j].pj - alone[first].pj)
                # no chain does better than its members tiled for the whole target with the fill
                # they cannot avoid: where even that is no better, plan none (most of the time it takes)
                least = best[first].then(self.least(first, j - 1))
                if not least.better(best[j], objective, stake):
                    continue
                plan = self.plan(first, j - 1, least.better(best[j], objective, stake, SEARCHED))
                if plan is None:  # these members do not fit at once (that the cut, or the search, finds)
                    break  # with one more, no more would
                chained = best[first].then(plan.usage, plan)
                if chained.better(best[j], objective, stake):
                    best[j] = chained
        return best[-1].chains


def form_chains(kernels: list[Kernel], graph: Graph, target: Target,
                lower: Lower) -> tuple[Graph, list[list[str]], frozenset[str], dict[str, tuple[int | None, int]]]:
    """Chain what pays: each chain's members replace their kernels in `kernels` (in place),
    lowered for their shares; its links get a home in L3 (a ring of rows or of channels where it
    holds fewer than the tensor), but those of a chain planned through external memory. The
    graph so, the chains by kernel name, their links, and the shallower rings links may take
    (`Plan.shallow`) by link, with the dim they go by."""
    if target.costs is None:
        return graph, [], frozenset(), {}  # nothing to rank the ways to run them by
    planner = Planner(kernels, graph, target, lower)
    plans = planner.chains()
    planners = {plan.first: planner for plan in plans}
    kept = boundary_homes(planner, plans, planners)
    tensors = dict(graph.tensors)
    for plan in plans:
        for i, share in enumerate(plan.shares, plan.first):
            kernels[i] = dataclasses.replace(planners[plan.first].lowered(i, share), depends_on=kernels[i].depends_on)
        for t, ring in plan.rings.items() if plan.on_chip else ():
            tensors[t] = dataclasses.replace(tensors[t], home="L3", ring=ring,
                                             ring_dim=plan.dim if ring is not None else BY_ROWS)
    for t, level in kept.items():
        tensors[t] = dataclasses.replace(tensors[t], home=level)
    chains = [[k.name for k in kernels[plan.first:plan.first + len(plan.shares)]] for plan in plans]
    links = frozenset(t for plan in plans for t in plan.rings)
    shallower = {t: (ring, plan.dim if ring is not None else BY_ROWS) for plan in plans
                 if plan.on_chip and plan.shallow is not None
                 for t, ring in zip(plan.rings, plan.shallow) if ring != plan.rings[t]}
    return Graph(graph.name, tensors, graph.ops, graph.constants), chains, links, shallower


def _way(planner: Planner, plans: list[Plan]) -> Way:
    """How the planner's kernels run as `plans` chain them, the others each on its own."""
    by_first = {p.first: p for p in plans}
    way, i = Way(0.0, 0.0, []), 0
    while i < len(planner.kernels):
        if i in by_first:
            way, i = way.then(by_first[i].usage, by_first[i]), i + len(by_first[i].shares)
            continue
        way, i = way.then(planner.alone(i)), i + 1
    return way


def _plain_between(writer: Kernel, reader: Kernel, tensor: str) -> bool:
    """Whether every L3 and L2 tile of `tensor` the two kernels name is plain (no padding, no
    table, no view): each can be a region of a home holding the whole tensor."""
    for k in (writer, reader):
        for op in k.body:
            if isinstance(op, DataMove) and tensor in (op.source.tensor, op.destination.tensor):
                if op.move_type == "VIEW" or op.source.table is not None or any(
                        ref.padding is not None for ref in (op.source, op.destination) if ref.level in ("L3", "L2")):
                    return False
    return True


def boundary_homes(planner: Planner, plans: list[Plan], planners: dict[int, Planner]) -> dict[str, str]:
    """The tensors between consecutive chains kept on chip, by their home's level, the chains'
    plans changed for them (in place, with the planner lowering each in `planners`, by first
    kernel). A pointwise convolution after a chain by channels holds its whole input on chip,
    which the chain before wrote whole: on MobileNet v1's 14 x 14 tail, the input and the result
    of one chain (401 KB each) do not fit L3 (512 KB) together, and planned as they are, a chain
    fills L3 with its rings. So each such tensor, in order, that does not fit L3 beside both
    chains as they are (`residency.keep_on_chip` keeps those) is tried in L3 and in L2 (in an
    equal piece at the top of every bank, `dfx.l2_piece`): its writer's chain and its reader's
    planned again for what its home and the homes taken before leave them, going by what they
    went by, and it is kept where the objective's figure of the whole program so is lowest and
    its cycles no more. A home in L2 frees its reader's L3 for a home in L3 of what that reader
    writes. Only as the estimates see it: they rate chains gone to bands of a channel or two
    faster than they run (MobileNet v2's conv2d_15 .. 17 by channels beside a home in L2,
    68,502 cycles rated, 86,000 run; by rows, as planned without it, 65,000), and a figure
    that pays in pJ for cycles took v2 past its 1,500,000 by 23,000."""
    kernels, graph, target = planner.kernels, planner.graph, planner.target
    readers = Counter(t for k in kernels for t in set(k.inputs))
    capacity = target.l3.bank_bytes * target.compute_tiles
    kept: dict[str, str] = {}
    during: list[dict[str, str]] = [{} for _ in plans]  # the homes each plan was planned beside
    replanned: dict[tuple, Plan | None] = {}  # networks repeat their blocks: `_replan`'s
    best = _way(planner, plans)
    for n in range(len(plans) - 1):
        w, r = plans[n], plans[n + 1]
        w_last, r_last = w.first + len(w.shares) - 1, r.first + len(r.shares) - 1
        writer, reader = kernels[w_last], kernels[r.first]
        t = writer.outputs[0] if len(writer.outputs) == 1 else None
        if (r.first != w_last + 1 or t is None or reader.inputs[0] != t or readers[t] != 1
                or graph.tensors[t].role != "intermediate" or not _plain_between(writer, reader, t)
                or all(planners[p.first].l3_beside(p, t) <= capacity for p in (w, r))):
            continue
        tried = []
        for level in ("L3", "L2"):
            # the loader places t below the homes of its level live beside it in the writer's
            # chain, and keeps it there while the reader's runs
            homes = ({**during[n], t: level},
                     {**during[n + 1], **{u: at for u, at in during[n].items() if at == level}, t: level})
            beside = [_beside(target, graph, h) for h in homes]
            if None in beside:
                continue
            again = [Planner(kernels, graph, b, planner.lower) for b in beside]
            # no plan of theirs does better than their members as lowered for the whole target
            # with the fill they cannot avoid (`Planner.least`): where even that is no better, plan none
            floor = _way(planner, [*plans[:n], dataclasses.replace(w, usage=again[0].least(w.first, w_last)),
                                   dataclasses.replace(r, usage=again[1].least(r.first, r_last)), *plans[n + 2:]])
            if floor.cycles > best.cycles or figure(floor, target.objective) >= figure(best, target.objective):
                continue
            w2, r2 = (_replan(replanned, a, p) for a, p in zip(again, (w, r)))
            if w2 is not None and r2 is not None:
                way = _way(planner, [*plans[:n], w2, r2, *plans[n + 2:]])
                if way.cycles <= best.cycles and figure(way, target.objective) < figure(best, target.objective):
                    tried.append((figure(way, target.objective), level, way, w2, r2, again, homes))
        if tried:
            _, level, best, w2, r2, again, homes = min(tried, key=lambda x: x[0])
            plans[n:n + 2] = [w2, r2]
            planners[w.first], planners[r.first] = again
            during[n], during[n + 1] = homes
            kept[t] = level
    return kept


def _replan(replanned: dict[tuple, Plan | None], again: Planner, plan: Plan) -> Plan | None:
    """The chain of `plan` planned again by `again` (beside homes, `_beside`), going by what it
    went by (None: it cannot); chains of the same members' signatures beside homes of the same
    roles are planned once (`replanned`)."""
    first, last = plan.first, plan.first + len(plan.shares) - 1
    target, members = again.target, range(first, last + 1)
    roles = tuple((k.inputs[0] in target.in_l3, k.inputs[0] in target.in_l2, k.outputs[0] in target.in_l3,
                   k.outputs[0] in target.in_l2) for k in again.kernels[first:last + 1])
    key = (tuple(group_signature(again.groups[i], again.graph) for i in members), roles, plan.dim,
           dataclasses.replace(target, in_l3=frozenset(), in_l2=frozenset()))
    if key not in replanned:
        found = again.plan(first, last)
        replanned[key] = found if found is not None and found.dim == plan.dim else None
    found = replanned[key]
    return found and dataclasses.replace(found, first=first, rings={again.links[i]: ring for i, ring in
                                                                    zip(members, found.rings.values())})


def _beside(target: Target, graph: Graph, homes: dict[str, str]) -> Target | None:
    """The target as a chain sees it beside these homes (tensor -> level): L3 without theirs in
    L3, every L2 bank without the pieces of theirs in L2 (None: no room is left)."""
    line = target.line_bytes
    l3 = sum(in_lines(home_bytes(graph.tensors[t]), line) for t, level in homes.items() if level == "L3")
    l2 = sum(l2_piece(home_bytes(graph.tensors[t]), target.l2.banks * target.compute_tiles, line)
             for t, level in homes.items() if level == "L2")
    l3_left = target.l3.bank_bytes * target.compute_tiles - l3
    if l3_left <= 0 or l2 >= target.l2.bank_bytes:
        return None
    return dataclasses.replace(target, l3=Level(target.l3.banks, l3_left // target.compute_tiles // line * line),
                               l2=Level(target.l2.banks, target.l2.bank_bytes - l2),
                               in_l3=frozenset(t for t, level in homes.items() if level == "L3"),
                               in_l2=frozenset(t for t, level in homes.items() if level == "L2"))
