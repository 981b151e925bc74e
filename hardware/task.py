"""The simulator's input: one plain task per unit operation.

`hardware/` knows nothing of DFX programs; the loader expands a program into a stream of these.
"""

from __future__ import annotations

from dataclasses import dataclass

# Unit kinds a task can run on, and the short prefix of their engines' names in reports/traces.
UNIT_PREFIX = {"dma": "dma", "block_mover": "bm", "streamer": "str", "array": "array", "vector": "vec",
               "barrier": "barrier"}


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and the loader
# makes one task per unit operation. Nothing changes a task once made but its `priority`, which
# the loader sets as it hands the task out.
@dataclass(slots=True)
class Task:
    # What every task has comes first, then a move's fields: the loader makes its moves, most
    # tasks, passing these in order (keywords would cost more than the task itself).
    id: int  # unique, increasing in program order
    unit: str  # "dma" | "block_mover" | "streamer" | "array" | "vector" | "barrier"
    engine: int  # which engine of that kind (for "array", "vector" and "barrier": which compute tile)
    deps: tuple[int, ...] = ()  # ids of earlier tasks that must have finished
    # The engine's queue this task joins: tasks of one stream run in program order; an engine
    # serves, among its streams' head tasks whose deps are done, those of the lowest `priority`
    # first, of those the one ready first (ties by task id).
    stream: int = 0
    phase: int = 0  # a part of the program (the loader's kernel number); results give each one's span
    label: str = ""  # e.g. "A EXT->L3"
    args: dict | None = None  # shown in the trace (tile indices)
    bytes: int = 0  # bytes moved (moves)
    src_level: str = ""  # "EXTERNAL" | "L3" | "L2" | "L1" | "REGISTER" (moves)
    dst_level: str = ""
    l2_bank: int | None = None  # BlockMover/Streamer tasks: the L2 bank whose port they use
    transpose: bool = False
    dram_channel: int | None = None  # DMA tasks: the external memory channel they use
    m: int = 0  # "array" tasks: the tile matmul shape, C[m, n] += A[m, k] B[k, n]
    n: int = 0
    k: int = 0
    dataflow: str = "output_stationary"
    drain: bool = True  # "array", output-stationary: the last K chunk of its output block
    dtype: str = "f32"  # "array": its operands' (A's), which sets the MACs a PE does per cycle
    # "vector" tasks: (op class, elements) pairs, op classes from VECTOR_OP_CLASSES in hardware.machine
    vector_work: tuple[tuple[str, int], ...] = ()
    # which of an engine's candidates goes first: the lowest, then the one ready first (the loader
    # gives each task its kernel's place in the program, a chain's first kernel's for its members)
    priority: int = 0
