"""Graph IR: the operator graph every frontend produces and the passes transform."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "intermediate"  # input | constant | output | intermediate

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Op:
    name: str  # unique within the graph
    op_type: str  # an op registry name, or the source's own op name when it has none
    inputs: list[str]  # tensor names, operand order
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # where it came from, for messages: "file.dfg:12 node 3 'matmul'"


@dataclass
class Graph:
    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)  # topological order
    constants: dict[str, bytes] = field(default_factory=dict)  # values the source gave, raw LE bytes

    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role in ("input", "constant")]

    @property
    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role == "output"]

    def producer(self, tensor: str) -> Op | None:
        for op in self.ops:
            if tensor in op.outputs:
                return op
        return None
