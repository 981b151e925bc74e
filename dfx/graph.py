"""Graph IR: the operator graph every frontend produces and the passes transform."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# Bounds every shape meets wherever it enters (frontends, shape inference, the object reader).
# 2^40 elements is 4 TiB of f32, beyond any machine model's external memory, and keeps the byte
# and tile counts the toolchain derives from shapes inside a signed 64-bit integer. Rank 32 is
# numpy's oldest ndarray limit.
MAX_ELEMENTS = 2**40
MAX_RANK = 32
INT64_MAX = 2**63 - 1  # the largest integer a `.kpu` file holds (orjson writes no wider signed int)


def shape_problem(shape: tuple[int, ...] | list[int]) -> str | None:
    """Why `shape` cannot be a tensor's, or None. An empty dimension counts as 1, so it cannot
    hide huge other dimensions (their tile loops would still run)."""
    if len(shape) > MAX_RANK:
        return f"rank {len(shape)} exceeds the {MAX_RANK} a tensor may have"
    if math.prod(max(d, 1) for d in shape) > MAX_ELEMENTS:
        return f"shape {list(shape)} has more than the 2^40 elements a tensor may have"
    return None


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "intermediate"  # input | constant | output | intermediate
    # where it lives between kernels: None, external memory; "L3", a region of L3 the loader
    # reserves for it from the kernel that writes it to the last that reads it (an intermediate
    # the compiler found room for on its target), so it never crosses the external memory link
    home: str | None = None
    # with a home in L3, how many slices along dim `ring_dim` it holds: slice r in slot r mod ring,
    # written while the kernels of a chain read the slices before (Program.chains); None, all of
    # them. Rows (dim 1, H of an NHWC activation) for a link by rows, channels (the last dim) for
    # a link by channels
    ring: int | None = None
    ring_dim: int = field(default=1, metadata={"omit_default": True})

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ring_holds(self) -> str:
        """What its ring holds: "rows" or "channels"."""
        return slices_along(self.ring_dim)


def slices_along(dim: int) -> str:
    """What a ring or a chain's bands along `dim` of an NHWC tensor are: rows (dim 1), or channels
    (the last)."""
    return "rows" if dim == 1 else "channels"


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

    def set_constant(self, name: str, values: Any) -> None:
        """Give constant `name` its values, held as the little-endian bytes of its dtype."""
        import numpy as np

        from .dtypes import numpy_dtype

        t = self.tensors[name]
        self.constants[name] = np.ascontiguousarray(values, numpy_dtype(t.dtype).newbyteorder("<")).tobytes()

    def constant_values(self, name: str) -> Any:
        """The values of constant `name` in its shape and dtype, or None where the source gave none."""
        import numpy as np

        from .dtypes import numpy_dtype

        raw = self.constants.get(name)
        if raw is None:
            return None
        t = self.tensors[name]
        return np.frombuffer(raw, numpy_dtype(t.dtype).newbyteorder("<")).astype(numpy_dtype(t.dtype)).reshape(t.shape)

    def producer(self, tensor: str) -> Op | None:
        for op in self.ops:
            if tensor in op.outputs:
                return op
        return None
