"""A convolution's input dilated by zeros and padded, as the frontends' transposed convolutions
need it (ONNX ConvTranspose, HLO's `lhs_dilate`): registry layout ops only, so CONV2D after it
runs at stride 1 with non-negative padding; and HLO's interior padding, by its padding value.
Each frontend passes its own way of adding an op.
"""

from __future__ import annotations

import math
from typing import Any, Callable

# (op type, operand tensor, attributes) -> the result tensor
Emit = Callable[[str, str, dict[str, Any]], str]


def dilated_input(emit: Emit, x: str, shape: tuple[int, ...], axes: list[int], dilation: list[int],
                  padding: list[list[int]], value: float = 0) -> tuple[str, list[list[int]]]:
    """x with dilation - 1 zeros (or `value`s) between its elements along each of `axes`, padded by `padding`
    ([before, after] per axis of `axes`; negative crops): the tensor a convolution reads, less
    the padding it still applies (returned, none of it negative). Each element is followed by
    its zeros (a RESHAPE giving the axis a dim of 1 after it, a PAD of that dim, a RESHAPE
    back), so the last element's zeros count against `after`; a SLICE crops where that, or the
    padding asked, is negative."""
    padding = [list(p) for p in padding]
    spread = {axis: s for axis, s in zip(axes, dilation) if s > 1}
    if spread:
        split, pads = [], []
        for k, d in enumerate(shape):
            split.append(d)
            pads.append([0, 0])
            if k in spread:
                split.append(1)
                pads.append([0, spread[k] - 1])
        x = emit("RESHAPE", x, {"new_shape": split})
        x = emit("PAD", x, {"padding": pads, **({"pad_value": value} if math.copysign(1, value) < 0 or value else {})})
        shape = tuple(d * spread.get(k, 1) for k, d in enumerate(shape))
        x = emit("RESHAPE", x, {"new_shape": list(shape)})
        padding = [[before, after - (s - 1)] for (before, after), s in zip(padding, dilation)]
    crop = {axis: (max(-before, 0), max(-after, 0)) for axis, (before, after) in zip(axes, padding)}
    if any(a or b for a, b in crop.values()):
        start = [crop[k][0] if k in crop else 0 for k in range(len(shape))]
        size = [d - sum(crop[k]) if k in crop else d for k, d in enumerate(shape)]
        x = emit("SLICE", x, {"start": start, "size": size})
    return x, [[max(before, 0), max(after, 0)] for before, after in padding]
