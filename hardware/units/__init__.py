"""Timing models of the KPU's units: each turns a task into a duration in cycles.

Every model has `cycles(task) -> int`; `timed_by`, the Task fields those cycles depend on (the
simulator reuses the cycles it timed for the same values of them); and `tail_cycles`: the
trailing part of a task during which it no longer holds its shared resource (DRAM channel or L2
bank port), so the simulator can free that resource early. A compute model also has
`macs(task) -> int`, the multiply-accumulates the reports count against the arrays' peak, and
`trace_args(task) -> dict`, the work it shows in the trace.
"""

from __future__ import annotations

from collections.abc import Callable

from ..machine import Machine
from ..task import Task
from .barrier import BarrierModel
from .block_mover import BlockMoverModel
from .dma import DmaModel
from .streamer import StreamerModel
from .systolic_array import SystolicArrayModel
from .vector_unit import VectorUnitModel

# the engines that move data, by Task.unit
MOVE_MODELS = {"dma": DmaModel, "block_mover": BlockMoverModel, "streamer": StreamerModel}
# the units that compute, by Task.unit: one of each per compute tile
COMPUTE_MODELS = {"array": SystolicArrayModel, "vector": VectorUnitModel}
# the program's synchronisation points, by Task.unit: one per compute tile
SYNC_MODELS = {"barrier": BarrierModel}


def move_timer(machine: Machine) -> Callable[[str, int], int]:
    """(engine kind, bytes) -> cycles one move keeps that engine busy, as the simulator times it."""
    models = {kind: model(machine) for kind, model in MOVE_MODELS.items()}
    return lambda kind, nbytes: models[kind].cycles(Task(0, kind, 0, bytes=nbytes))
