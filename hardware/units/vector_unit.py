"""Vector unit of one compute tile: elementwise ops, transcendentals and reductions, beside the
array (a separate unit, so the two run at once; the loader orders them with deps).

cycles = sum over the task's (op class, elements) pairs of
         ceil(elements / lanes) * cycles_per_element[op class].
Each pair passes through the lanes on its own (a pass applies one op to every lane), so the last
pass of a pair may be partly empty. Work of no elements takes 0 cycles, as a move of 0 bytes
does; any element takes at least one cycle, as every class costs at least one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..machine import Machine
from ..task import Task
from .ceil import ceil_div


def vector_cycles(work: Iterable[tuple[str, int]], lanes: int,
                  cycles_per_element: Mapping[str, int]) -> int:
    """Cycles a vector unit of `lanes` lanes takes for `work`, (op class, elements) pairs, as the
    simulator times a vector task; ValueError names an op class `cycles_per_element` lacks."""
    cycles = 0
    for op_class, elements in work:
        per_element = cycles_per_element.get(op_class)
        if per_element is None:
            raise ValueError(f"unknown vector op class {op_class!r} "
                             f"(expected one of {', '.join(cycles_per_element)})")
        if elements < 0:  # would end the task before it starts
            raise ValueError(f"negative element count {elements} for vector op class {op_class!r}")
        cycles += ceil_div(elements, lanes) * per_element
    return cycles


class VectorUnitModel:
    __slots__ = ("tail_cycles", "_lanes", "_cycles_per_element")
    timed_by = ("vector_work",)

    def __init__(self, machine: Machine):
        self.tail_cycles = 0
        self._lanes = machine.vector.lanes
        self._cycles_per_element = dict(machine.vector.cycles_per_element)

    def cycles(self, task: Task) -> int:
        try:
            return vector_cycles(task.vector_work, self._lanes, self._cycles_per_element)
        except ValueError as e:
            raise ValueError(f"task {task.id}: {e}") from None

    @staticmethod
    def macs(task: Task) -> int:
        return 0  # MACs measure the array's work: utilization is against the arrays' peak

    @staticmethod
    def operand_elements(task: Task) -> int:
        return 0  # a vector element's figure includes its operands (hardware.energy)

    @staticmethod
    def trace_args(task: Task) -> dict:
        return {"vector_work": task.vector_work}
