"""Sliding-window ops over the spatial dims of an image tensor: CONV2D (a contraction on the
array), and DEPTHWISE_CONV2D, MAXPOOL2D, AVGPOOL2D, SUMPOOL2D (the window family, on the vector
unit).

The lowered kernels hold NHWC tiles. Along H and W, an output tile of `r` positions needs the
input band `Window.band(r)`: `(r - 1) * stride + span` elements, one tile `r * stride` after the
last (bands overlap by their halo), starting `before` ahead of the tensor. An on-chip band holds
the padding too, written by the fill of the move that brings it (kernel.py's `padding`), so a
tile COMPUTE sees a band with no border to take care of: its output extent follows from the
band's (`Window.outputs`), a band cut by the padded tensor's end giving the shorter last tile.

CONV2D as TOSA writes it takes NHWC input with OHWI weights; as ONNX writes it, NCHW with OIHW
(`layout`); weights in any other order of their dims say so (`weight_layout`: HWIO as JAX gives
them). The tile COMPUTE is the NHWC, ungrouped one: a compiler pass turns the others into it.
It takes its weight tile OHWI whatever their layout: the move that brings the tile L3 -> L2
permutes it (`operand_order`). Its array work is the implicit GEMM: m = output positions,
n = output channels, k = kh * kw * input channels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import dtype_of, numpy_dtype
from .base import (
    REQUIRED, OpDef, Shape, ShapeError, accumulation_dtype, broadcasts_to, compute_dtype, convert, elements,
    on_magnitudes, on_sizes, register, tile_compute_dtype,
)
from .reduction import lowest

SPATIAL = (1, 2)  # H and W of an NHWC tensor


@dataclass(frozen=True)
class Window:
    """A sliding window along one spatial dim: `kernel` taps `dilation` apart, moved by `stride`,
    over the input padded by `before` and `after`."""

    kernel: int
    stride: int
    dilation: int
    before: int
    after: int

    @property
    def span(self) -> int:
        """Input elements one window covers."""
        return (self.kernel - 1) * self.dilation + 1

    def outputs(self, extent: int) -> int:
        """Window positions in `extent` input elements (padding included)."""
        return (extent - self.span) // self.stride + 1

    def band(self, out_extent: int) -> tuple[int, int, int]:
        """(extent, step, offset) of the input tiles that output tiles of `out_extent` need."""
        return (out_extent - 1) * self.stride + self.span, out_extent * self.stride, -self.before

    def taps(self, band: np.ndarray, axis: int, tap: int, count: int) -> np.ndarray:
        """The band's elements that tap `tap` of `count` consecutive windows reads along `axis`."""
        start = tap * self.dilation
        index = [slice(None)] * band.ndim
        index[axis] = slice(start, start + (count - 1) * self.stride + 1, self.stride)
        return band[tuple(index)]


def windows(attrs: dict[str, Any], kernel: tuple[int, int]) -> tuple[Window, Window]:
    """The H and W windows of an op whose taps are `kernel`."""
    return tuple(Window(k, s, d, before, after) for k, s, d, (before, after)
                 in zip(kernel, attrs["stride"], attrs["dilation"], attrs["padding"]))


def _pairs(attrs: dict[str, Any]) -> None:
    if len(attrs["padding"]) != 2 or len(attrs["stride"]) != 2 or len(attrs["dilation"]) != 2:
        raise ShapeError(f"stride, dilation and padding must give the 2 spatial dims, got stride {attrs['stride']}, "
                         f"dilation {attrs['dilation']}, padding {attrs['padding']}")


def _spatial_out(x: Shape, hw: tuple[Window, Window], dims: tuple[int, int]) -> tuple[int, int]:
    out = []
    for window, d in zip(hw, dims):
        padded = x[d] + window.before + window.after
        if padded < window.span:
            raise ShapeError(f"the window spans {window.span} elements, more than the {padded} of input {list(x)} "
                             f"padded by [{window.before}, {window.after}]")
        out.append(window.outputs(padded))
    return out[0], out[1]


def _padded(x: np.ndarray, hw: tuple[Window, Window], fill: float | int) -> np.ndarray:
    pad = [(0, 0)] * x.ndim
    for window, d in zip(hw, SPATIAL):
        pad[d] = (window.before, window.after)
    return np.pad(x, pad, constant_values=fill)


# ---- CONV2D ----------------------------------------------------------------------------------


def weight_layout(attrs: dict[str, Any]) -> str:
    """The order of a CONV2D's weight dims (O, H, W, I): its `weight_layout`, else its layout's."""
    return attrs["weight_layout"] or ("OHWI" if attrs["layout"] == "NHWC" else "OIHW")


def weight_perms(attrs: dict[str, Any], to: str) -> list[int]:
    """TRANSPOSE perms taking a CONV2D's weights to the dim order `to`."""
    layout = weight_layout(attrs)
    return [layout.index(c) for c in to]


def _weight_dims(w: Shape, attrs: dict[str, Any]) -> tuple[int, int, int, int]:
    """The weights' (output channels, kh, kw, input channels per group)."""
    o, kh, kw, i = (w[p] for p in weight_perms(attrs, "OHWI"))
    return o, kh, kw, i


def _conv_kernel(w: Shape, attrs: dict[str, Any]) -> tuple[int, int]:
    return _weight_dims(w, attrs)[1:3]


def _conv_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"CONV2D takes a rank-4 input and rank-4 weights, got {list(x)} and {list(w)}")
    _pairs(attrs)
    nhwc = attrs["layout"] == "NHWC"
    cout, _, _, per_group = _weight_dims(w, attrs)
    cin, groups = x[3] if nhwc else x[1], attrs["groups"]
    if cin != per_group * groups:
        raise ShapeError(f"input {list(x)} has {cin} channels, weights {list(w)} take {per_group} per group "
                         f"x {groups} group(s) = {per_group * groups}")
    if cout % groups:
        raise ShapeError(f"{cout} output channels do not split into {groups} groups")
    oh, ow = _spatial_out(x, windows(attrs, _conv_kernel(w, attrs)), (1, 2) if nhwc else (2, 3))
    out = (x[0], oh, ow, cout) if nhwc else (x[0], cout, oh, ow)
    if len(shapes) == 3:
        broadcasts_to(shapes[2], (cout,), "bias", "the output channels")
    return [out]


def _conv_nhwc(x: np.ndarray, w: np.ndarray, hw: tuple[Window, Window], acc: np.dtype) -> np.ndarray:
    """x [N, H', W', C] already padded, w [O, KH, KW, C] -> [N, OH, OW, O], ungrouped."""
    oh, ow = hw[0].outputs(x.shape[1]), hw[1].outputs(x.shape[2])
    out = np.zeros((x.shape[0], oh, ow, w.shape[0]), acc)
    for i in range(w.shape[1]):
        rows = hw[0].taps(x, 1, i, oh)
        for j in range(w.shape[2]):
            out += hw[1].taps(rows, 2, j, ow).astype(acc, copy=False) @ w[:, i, j, :].T.astype(acc, copy=False)
    return out


def _conv_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    acc = numpy_dtype(accumulation_dtype([dtype_of(a) for a in arrays] + out_dtypes))
    x, w = arrays[0], np.transpose(arrays[1], weight_perms(attrs, "OHWI"))
    if attrs["layout"] == "NCHW":  # the same sums over NHWC
        x = np.transpose(x, (0, 2, 3, 1))
    hw = windows(attrs, (w.shape[1], w.shape[2]))
    x = _padded(x, hw, attrs["pad_value"])
    groups, per_group, per_out = attrs["groups"], w.shape[3], w.shape[0] // attrs["groups"]
    y = np.concatenate([_conv_nhwc(x[..., g * per_group:(g + 1) * per_group], w[g * per_out:(g + 1) * per_out],
                                   hw, acc) for g in range(groups)], axis=-1)
    if len(arrays) == 3:
        y = y + arrays[2].astype(acc, copy=False)
    if attrs["layout"] == "NCHW":
        y = np.transpose(y, (0, 3, 1, 2))
    return [convert(y, out_dtypes[0])]


def _conv_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
    """A band [n, rows, cols, c] holding its padding, weights [o, kh, kw, c] (OHWI as the moves
    hold them, whatever their layout; and a bias [o] on a block's first step) -> [n, out rows,
    out cols, o], added to `partial` over the c chunks."""
    w = tiles[1]
    y = _conv_nhwc(tiles[0], w, windows(attrs, (w.shape[1], w.shape[2])), acc)
    if partial is not None:
        return partial + y
    return y + tiles[2].astype(acc, copy=False) if len(tiles) == 3 else y


def _conv_mnk(shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> tuple[int, int, int]:
    band, (o, kh, kw, c) = shapes[0], _weight_dims(shapes[1], attrs)
    hw = windows(attrs, (kh, kw))
    return band[0] * hw[0].outputs(band[1]) * hw[1].outputs(band[2]), o, kh * kw * c


def _conv_work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
    """One multiply-add per product: kh * kw * (C / groups) of them for each output element."""
    o, kh, kw, c = _weight_dims(in_shapes[1], attrs)
    return {"simple": elements(out_shape) * kh * kw * c}


def _bias_dims(shapes: list[Shape]) -> list[list[int | None]]:
    """A bias [O] runs along the result's channels; one of a single value, along none."""
    if len(shapes) < 3:
        return []
    return [[3] if shapes[2] and shapes[2][-1] > 1 else [None] * len(shapes[2])]


def _conv_operand_dims(shapes: list[Shape], attrs: dict[str, Any]) -> list[list[int | None]]:
    # x [N, H, W, C] along the result's N, OH, OW (C is contracted with w's); w's O along its C
    return [[0, 1, 2, None], [3 if c == "O" else None for c in weight_layout(attrs)], *_bias_dims(shapes)]


def _conv_operand_order(shapes: list[Shape], attrs: dict[str, Any]) -> list[list[int] | None]:
    # the tile computes on OHWI weights
    order = weight_perms(attrs, "OHWI")
    return [None, None if order == sorted(order) else order, *([None] * (len(shapes) - 2))]


CONV2D = register(OpDef(
    name="CONV2D",
    min_inputs=2,
    max_inputs=3,
    infer_shapes=_conv_shapes,
    reference=_conv_reference,
    compute_type="CONV2D_TILE",
    doc="y = conv(x, w) (+ bias): NHWC x with OHWI w (TOSA) or NCHW x with OIHW w (ONNX, layout 'NCHW'), "
        "w's dims in another order where weight_layout says (HWIO: JAX's); stride, dilation, padding "
        "[[top, bottom], [left, right]] holding pad_value (zero; a quantized input's zero point), groups; "
        "accumulates as MATMUL",
    family="contraction",
    attrs={"stride": [1, 1], "dilation": [1, 1], "padding": [[0, 0], [0, 0]], "pad_value": 0, "groups": 1,
           "layout": "NHWC", "weight_layout": None},
    tile=_conv_tile,
    magnitude=on_sizes(_conv_reference),
    tile_mnk=_conv_mnk,
    vector_work=_conv_work,
    operand_dims=_conv_operand_dims,
    operand_order=_conv_operand_order,
    windows=lambda attrs, shapes: windows(attrs, _conv_kernel(shapes[1], attrs)),
    window_fill=lambda attrs, dtype: attrs["pad_value"],
))


# ---- the window family: DEPTHWISE_CONV2D, MAXPOOL2D, AVGPOOL2D, SUMPOOL2D -----------------------


def _depthwise_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x, w = shapes[0], shapes[1]
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"DEPTHWISE_CONV2D takes NHWC input and HWCM weights, got {list(x)} and {list(w)}")
    _pairs(attrs)
    if x[3] != w[2]:
        raise ShapeError(f"input {list(x)} has {x[3]} channels, weights {list(w)} (HWCM) take {w[2]}")
    oh, ow = _spatial_out(x, windows(attrs, (w[0], w[1])), SPATIAL)
    out = (x[0], oh, ow, w[2] * w[3])
    if len(shapes) == 3:
        broadcasts_to(shapes[2], (out[3],), "bias", "the output channels")
    return [out]


def _depthwise(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: dict[str, Any],
               ct: np.dtype) -> np.ndarray:
    """x [N, H', W', C] already padded, w [KH, KW, C, M] -> [N, OH, OW, C * M], channel c's
    M results side by side."""
    hw = windows(attrs, (w.shape[0], w.shape[1]))
    oh, ow = hw[0].outputs(x.shape[1]), hw[1].outputs(x.shape[2])
    out = np.zeros((x.shape[0], oh, ow, w.shape[2], w.shape[3]), ct)
    for i in range(w.shape[0]):
        rows = hw[0].taps(x, 1, i, oh)
        for j in range(w.shape[1]):
            out += hw[1].taps(rows, 2, j, ow).astype(ct, copy=False)[..., None] * w[i, j].astype(ct, copy=False)
    out = out.reshape(*out.shape[:3], -1)
    return out if bias is None else out + bias.astype(ct, copy=False)


def _depthwise_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    ct = numpy_dtype(accumulation_dtype([dtype_of(a) for a in arrays] + out_dtypes))
    w = arrays[1]
    x = _padded(arrays[0], windows(attrs, (w.shape[0], w.shape[1])), attrs["pad_value"])
    return [convert(_depthwise(x, w, arrays[2] if len(arrays) == 3 else None, attrs, ct), out_dtypes[0])]


def _depthwise_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype,
                    attrs: dict[str, Any]) -> np.ndarray:
    return _depthwise(tiles[0], tiles[1], tiles[2] if len(tiles) == 3 else None, attrs, acc)


def _window_work(in_shapes: list[Shape], out_shape: Shape, attrs: dict[str, Any]) -> dict[str, int]:
    """One multiply-add (or max, or add) per tap of each output element: the lane's one simple op."""
    kh, kw = attrs["kernel"] if "kernel" in attrs else in_shapes[1][:2]
    return {"simple": elements(out_shape) * kh * kw}


DEPTHWISE_CONV2D = register(OpDef(
    name="DEPTHWISE_CONV2D",
    min_inputs=2,
    max_inputs=3,
    infer_shapes=_depthwise_shapes,
    reference=_depthwise_reference,
    compute_type="DEPTHWISE_CONV2D_TILE",
    doc="y[n, h, w, c*M + m] = sum over the window of x[n, ., ., c] * w[., ., c, m] (+ bias): NHWC x, HWCM "
        "w (TOSA), channel multiplier M; stride, dilation, padding [[top, bottom], [left, right]] holding "
        "pad_value (zero; a quantized input's zero point)",
    family="window",
    exact=True,  # an integer tile sums (or takes the max) in the i32 accumulators
    attrs={"stride": [1, 1], "dilation": [1, 1], "padding": [[0, 0], [0, 0]], "pad_value": 0},
    tile=_depthwise_tile,
    magnitude=on_magnitudes(_depthwise_reference),
    vector_work=_window_work,
    # x and the bias run along the result's dims, a channel c of x along its channels c*M..c*M+M-1
    operand_dims=lambda shapes, attrs: [[0, 1, 2, 3], [None, None, 3, None], *_bias_dims(shapes)],
    windows=lambda attrs, shapes: windows(attrs, (shapes[1][0], shapes[1][1])),
    window_fill=lambda attrs, dtype: attrs["pad_value"],
))


def _pool_shapes(shapes: list[Shape], dtypes: list[str], attrs: dict[str, Any]) -> list[Shape]:
    x = shapes[0]
    if len(x) != 4:
        raise ShapeError(f"pooling takes an NHWC input, got {list(x)}")
    if len(attrs["kernel"]) != 2:
        raise ShapeError(f"kernel must give the 2 spatial dims, got {attrs['kernel']}")
    _pairs(attrs)
    hw = windows(attrs, tuple(attrs["kernel"]))
    if any(w.before >= w.span or w.after >= w.span for w in hw):
        spans = [w.span for w in hw]
        dilated = "" if attrs["dilation"] == [1, 1] else f" dilated by {attrs['dilation']} (spans {spans})"
        raise ShapeError(f"padding {attrs['padding']} is not smaller than the kernel {attrs['kernel']}{dilated}: "
                         f"a window would hold no element")
    oh, ow = _spatial_out(x, hw, SPATIAL)
    return [(x[0], oh, ow, x[3])]


def _pool(x: np.ndarray, attrs: dict[str, Any], reduce, fill) -> np.ndarray:
    """x [N, H', W', C] already padded with `fill` -> the window reduced by `reduce`."""
    hw = windows(attrs, tuple(attrs["kernel"]))
    oh, ow = hw[0].outputs(x.shape[1]), hw[1].outputs(x.shape[2])
    out = np.full((x.shape[0], oh, ow, x.shape[3]), fill, x.dtype)
    for i in range(hw[0].kernel):
        rows = hw[0].taps(x, 1, i, oh)
        for j in range(hw[1].kernel):
            out = reduce(out, hw[1].taps(rows, 2, j, ow))
    return out


def _max_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    x = arrays[0]
    fill = lowest(x.dtype)
    x = _padded(x, windows(attrs, tuple(attrs["kernel"])), fill)
    return [convert(_pool(x, attrs, np.maximum, fill), out_dtypes[0])]


def _max_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
    return _pool(tiles[0], attrs, np.maximum, lowest(tiles[0].dtype))


MAXPOOL2D = register(OpDef(
    name="MAXPOOL2D",
    min_inputs=1,
    max_inputs=1,
    infer_shapes=_pool_shapes,
    reference=_max_reference,
    compute_type="MAXPOOL2D_TILE",
    doc="y = the largest x in each window: NHWC, kernel, stride, dilation, padding (never chosen: the lowest "
        "value)",
    family="window",
    exact=True,  # an integer tile sums (or takes the max) in the i32 accumulators
    attrs={"kernel": REQUIRED, "stride": [1, 1], "dilation": [1, 1], "padding": [[0, 0], [0, 0]]},
    tile=_max_tile,
    magnitude=on_magnitudes(_max_reference),
    vector_work=_window_work,
    operand_dims=lambda shapes, attrs: [[0, 1, 2, 3]],
    windows=lambda attrs, shapes: windows(attrs, tuple(attrs["kernel"])),
    window_fill=lambda attrs, dtype: lowest(numpy_dtype(dtype)),
))


def _window_sums(x: np.ndarray, attrs: dict[str, Any], ct: np.dtype) -> np.ndarray:
    """x [N, H', W', C] already padded with zeros -> each window's sum over its taps."""
    return _pool(x.astype(ct, copy=False), attrs, np.add, 0)


def counts_padding(attrs: dict[str, Any]) -> bool:
    """Whether an AVGPOOL2D's means count the padding its windows cover (with none, either way)."""
    return attrs["count_include_pad"] or not any(before or after for before, after in attrs["padding"])


def inputs_in_windows(attrs: dict[str, Any], height: int, width: int, dtype: np.dtype) -> np.ndarray:
    """How many input elements (not padding) each window of an AVGPOOL2D over `height` x `width`
    covers, [1, OH, OW, 1] in `dtype`."""
    hw = windows(attrs, tuple(attrs["kernel"]))
    return _window_sums(_padded(np.ones((1, height, width, 1), dtype), hw, 0), attrs, dtype)


def _avg_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    x = arrays[0]
    ct = compute_dtype([x.dtype, numpy_dtype(out_dtypes[0])], exact=False)
    hw = windows(attrs, tuple(attrs["kernel"]))
    sums = _window_sums(_padded(x, hw, 0), attrs, ct)
    kh, kw = attrs["kernel"]
    counts = kh * kw if counts_padding(attrs) else inputs_in_windows(attrs, *x.shape[1:3], ct)
    return [convert(sums / counts, out_dtypes[0])]


def _avg_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
    if not counts_padding(attrs):
        # a band does not say where the input ends in it; a compiler pass scales by the counts first
        raise ValueError("AVGPOOL2D tiles count the padding; one that does not is rewritten by the compiler first")
    return _window_sums(tiles[0], attrs, tile_compute_dtype(acc, exact=False)) / (attrs["kernel"][0] * attrs["kernel"][1])


AVGPOOL2D = register(OpDef(
    name="AVGPOOL2D",
    min_inputs=1,
    max_inputs=1,
    infer_shapes=_pool_shapes,
    reference=_avg_reference,
    compute_type="AVGPOOL2D_TILE",
    doc="y = the mean of x over each window: NHWC, kernel, stride, dilation, padding; count_include_pad divides "
        "by the kernel's size, else (TOSA's, ONNX's default) by the elements inside the input",
    family="window",
    attrs={"kernel": REQUIRED, "stride": [1, 1], "dilation": [1, 1], "padding": [[0, 0], [0, 0]],
           "count_include_pad": False},
    tile=_avg_tile,
    magnitude=on_magnitudes(_avg_reference),
    vector_work=_window_work,
    operand_dims=lambda shapes, attrs: [[0, 1, 2, 3]],
    windows=lambda attrs, shapes: windows(attrs, tuple(attrs["kernel"])),
))


def _sum_reference(arrays: list[np.ndarray], attrs: dict[str, Any], out_dtypes: list[str]) -> list[np.ndarray]:
    x = arrays[0]
    ct = compute_dtype([x.dtype, numpy_dtype(out_dtypes[0])], exact=True)  # integers sum exactly
    return [convert(_window_sums(_padded(x, windows(attrs, tuple(attrs["kernel"])), 0), attrs, ct), out_dtypes[0])]


def _sum_tile(tiles: list[np.ndarray], partial: np.ndarray | None, acc: np.dtype, attrs: dict[str, Any]) -> np.ndarray:
    return _window_sums(tiles[0], attrs, tile_compute_dtype(acc, exact=True))


SUMPOOL2D = register(OpDef(
    name="SUMPOOL2D",
    min_inputs=1,
    max_inputs=1,
    infer_shapes=_pool_shapes,
    reference=_sum_reference,
    compute_type="SUMPOOL2D_TILE",
    doc="y = the sum of x over each window (XLA's reduce-window of add): NHWC, kernel, stride, dilation, padding "
        "(zeros)",
    family="window",
    exact=True,  # an integer tile sums (or takes the max) in the i32 accumulators
    attrs={"kernel": REQUIRED, "stride": [1, 1], "dilation": [1, 1], "padding": [[0, 0], [0, 0]]},
    tile=_sum_tile,
    magnitude=on_magnitudes(_sum_reference),
    vector_work=_window_work,
    operand_dims=lambda shapes, attrs: [[0, 1, 2, 3]],
    windows=lambda attrs, shapes: windows(attrs, tuple(attrs["kernel"])),
))
