"""Systolic array of R x C PEs computing C[m, n] += A[m, k] B[k, n], counted as SCALE-Sim v3 does.

SCALE-Sim reports one cycle less than these formulas for a whole GEMM (it counts from cycle 0).
- output_stationary: ceil(m/R) * ceil(n/C) output blocks; each streams k cycles of operands. The
  fill + drain skew R + C - 2 is paid once per block, on its last K chunk (`drain=True`): the K
  chunks of a block stream back to back while the partial sums stay in the PEs.
- weight_stationary: ceil(k/R) * ceil(n/C) weight folds; each loads its weights (R cycles), then
  streams m rows through with the R + C - 2 skew.
- input_stationary: ceil(k/R) * ceil(m/C) input folds; each loads (R), streams n with the skew.
Weight and input folds drain their partial sums every fold, so `drain` does not apply to them.
A PE that does p MACs a cycle on its operands' dtype (`ComputeFabric.macs_per_pe_cycle`) takes
p elements of K a cycle: the formulas with ceil(k / p) for k.
"""

from __future__ import annotations

from ..machine import Machine
from ..task import Task
from .ceil import ceil_div


def matmul_cycles(m: int, n: int, k: int, rows: int, cols: int, dataflow: str,
                  drain: bool = True) -> int:
    skew = rows + cols - 2
    if dataflow == "output_stationary":
        blocks = ceil_div(m, rows) * ceil_div(n, cols)
        return blocks * k + (blocks * skew if drain else 0)
    if dataflow == "weight_stationary":
        return ceil_div(k, rows) * ceil_div(n, cols) * (rows + m + skew)
    if dataflow == "input_stationary":
        return ceil_div(k, rows) * ceil_div(m, cols) * (rows + n + skew)
    raise ValueError(f"unknown dataflow {dataflow!r}")


class SystolicArrayModel:
    __slots__ = ("tail_cycles", "_rows", "_cols", "_dataflows", "_macs_per_pe_cycle")
    timed_by = ("m", "n", "k", "dataflow", "drain", "dtype")

    def __init__(self, machine: Machine):
        self.tail_cycles = 0
        self._rows = machine.compute.rows
        self._cols = machine.compute.cols
        self._dataflows = frozenset(machine.compute.dataflows)
        self._macs_per_pe_cycle = dict(machine.compute.macs_per_pe_cycle)

    def cycles(self, task: Task) -> int:
        if task.dataflow not in self._dataflows:
            raise ValueError(f"task {task.id}: dataflow {task.dataflow!r} is not supported by "
                             f"this array (supports {', '.join(sorted(self._dataflows))})")
        k = ceil_div(task.k, self._macs_per_pe_cycle.get(task.dtype, 1))
        return matmul_cycles(task.m, task.n, k, self._rows, self._cols, task.dataflow, task.drain)

    @staticmethod
    def macs(task: Task) -> int:
        return task.m * task.n * task.k

    @staticmethod
    def operand_elements(task: Task) -> int:
        """A and B enter the array once each, whatever the dataflow holds stationary."""
        return task.k * (task.m + task.n)

    @staticmethod
    def trace_args(task: Task) -> dict:
        return {"m": task.m, "n": task.n, "k": task.k, "dataflow": task.dataflow}
