"""CONVOLUTION: sliding-window ops in forms the lowering does not take, expanded into the ones it
does. The array's kernel (`lower_conv`) takes CONV2D in NHWC with one group; the window kernels
take DEPTHWISE_CONV2D, MAXPOOL2D and AVGPOOL2D in NHWC, an AVGPOOL2D only where it divides by the
kernel's size (a band on chip does not say where the input ends in it).

    CONV2D{NCHW}(x, w, b)       TRANSPOSE(CONV2D(TRANSPOSE(x) NHWC, TRANSPOSE(w) OHWI, b)) NCHW
    CONV2D{groups C}(x, w, b)   DEPTHWISE_CONV2D(x, RESHAPE(TRANSPOSE(w) HWOI, [KH, KW, C, M]) HWCM, b),
                                x of C channels, w of C * M output channels
    CONV2D{groups g}(x, w, b)   CONCAT(CONV2D(x[group's input channels], w[group's outputs],
                                b[group's outputs]) for each group), on the channel axis
    AVGPOOL2D(x){padding not counted}
                                AVGPOOL2D(x){padding counted} * (kh * kw / inputs in each window)

Weights in another order of their dims (`weight_layout`) are read in it: a TRANSPOSE takes them
to the order each form wants (the same order gives none). The TRANSPOSEs are written as if each
op stood alone; LAYOUT, the next stage, cancels those between one window op and the next and
folds those of constant weights (a depthwise convolution's HWIO weights, one input channel per
group, are HWOI as they lie: their TRANSPOSE moves a dim of 1 and cancels into a view), and
CONTRACTION makes a TRANSPOSE of weights that are no constant the way the convolution reads them.

Each computes the reference's numbers: layout ops move values exactly, and every CONV2D and
DEPTHWISE_CONV2D rounds its sums once to the root's result dtype as the root did. The pooling's
mean stays at the precision the reference computes in (f32, f64 beside f64) until the MUL rounds
it once; the constant is computed here, so it has a value the loader uses as given.
"""

from __future__ import annotations

import numpy as np

from dfx import Op
from dfx.ops.window import counts_padding, inputs_in_windows, weight_layout, weight_perms

from .rewrite import Match, Pat, Rule

NHWC_OF_NCHW = [0, 2, 3, 1]  # TRANSPOSE perms: NCHW -> NHWC
NCHW_OF_NHWC = [0, 3, 1, 2]
CHANNELS = 3  # the channel axis of NHWC tensors


def _nchw(attrs: dict) -> bool:
    return attrs["layout"] == "NCHW"


def _grouped(attrs: dict) -> bool:
    # NCHW ones become NHWC first, then this
    return attrs["layout"] == "NHWC" and attrs["groups"] > 1


def _padding_not_counted(attrs: dict) -> bool:
    return not counts_padding(attrs)


# ---- CONV2D ----------------------------------------------------------------------------------


def _conv_attrs(m: Match, **changes) -> dict:
    """The matched CONV2D's attributes with `changes`, a weight layout that is the layout's own left out."""
    attrs = {**m.attrs("conv"), **changes}
    return {k: v for k, v in attrs.items() if k != "weight_layout" or v is not None}


def _weights_in(m: Match, step: str, w: str, layout: str) -> str:
    """The matched CONV2D's weights `w` in the dim order `layout`: a TRANSPOSE where theirs differs."""
    perms = weight_perms(m.attrs("conv"), layout)
    return w if perms == sorted(perms) else m.op(step, "TRANSPOSE", w, perms=perms)


def _to_nhwc(m: Match) -> Op:
    x, w, *bias = m.root.inputs
    x_nhwc = m.op("x_nhwc", "TRANSPOSE", x, perms=NHWC_OF_NCHW)
    w_ohwi = _weights_in(m, "w_ohwi", w, "OHWI")
    y = m.op("nhwc", "CONV2D", x_nhwc, w_ohwi, *bias, result_dtype=m.dtype("conv"),
             **_conv_attrs(m, layout="NHWC", weight_layout=None))
    return m.replace("TRANSPOSE", y, perms=NCHW_OF_NHWC)


def _depthwise(m: Match) -> Op | None:
    x, w, *bias = m.root.inputs
    attrs = m.attrs("conv")
    channels = m.graph.tensors[x].shape[CHANNELS]
    if attrs["groups"] != channels:  # a group of several input channels
        return None
    kh, kw, outputs, _ = (m.graph.tensors[w].shape[p] for p in weight_perms(attrs, "HWOI"))
    # output channel o = c * M + k is the k-th of group c, the input channel it reads; DEPTHWISE_CONV2D's
    # channel c * M + k is the k-th of input channel c too: the same order, so the weights
    # [KH, KW, C * M, 1] are [KH, KW, C, M] as they lie
    w_hwoi = _weights_in(m, "w_hwoi", w, "HWOI")
    w_hwcm = m.op("w_hwcm", "RESHAPE", w_hwoi, new_shape=[kh, kw, channels, outputs // channels])
    return m.replace("DEPTHWISE_CONV2D", x, w_hwcm, *bias, stride=attrs["stride"], dilation=attrs["dilation"],
                     padding=attrs["padding"], pad_value=attrs["pad_value"])


def _channels(m: Match, step: str, tensor: str, axis: int, start: int, size: int) -> str:
    """The SLICE of `size` entries of `tensor` from `start` along `axis`, all of the other axes."""
    rank = len(m.graph.tensors[tensor].shape)
    return m.op(step, "SLICE", tensor, start=[start if a == axis else 0 for a in range(rank)],
                size=[size if a == axis else -1 for a in range(rank)])


def _per_group(m: Match) -> Op:
    x, w, *bias = m.root.inputs
    attrs = m.attrs("conv")
    layout = weight_layout(attrs)
    groups, outputs = attrs["groups"], m.graph.tensors[w].shape[layout.index("O")]
    per_group, per_out = m.graph.tensors[w].shape[layout.index("I")], outputs // groups
    # a bias of one number per output channel is sliced with them; a broadcast one serves every group
    per_channel = bool(bias) and m.graph.tensors[bias[0]].shape == (outputs,)
    results = []
    for g in range(groups):
        x_g = _channels(m, f"x_group{g}", x, CHANNELS, g * per_group, per_group)
        w_g = _channels(m, f"w_group{g}", w, layout.index("O"), g * per_out, per_out)
        b_g = [_channels(m, f"bias_group{g}", bias[0], 0, g * per_out, per_out)] if per_channel else bias
        results.append(m.op(f"group{g}", "CONV2D", x_g, w_g, *b_g, result_dtype=m.dtype("conv"),
                            **_conv_attrs(m, groups=1)))
    return m.replace("CONCAT", *results, axis=CHANNELS)


# ---- AVGPOOL2D -------------------------------------------------------------------------------


def _count_padding(m: Match) -> Op:
    x = m.root.inputs[0]
    attrs = m.attrs("pool")
    _, height, width, _ = m.graph.tensors[x].shape
    # each window's sum over the inputs in it (the padding adds zeros), divided by how many they
    # are, never 0: the padding is smaller than the kernel. A division, as the definition and
    # onnxruntime have it: a mean over the kernel scaled back rounds twice, and a quantized
    # average pool's result then falls on the other side of a tie (1 element in 150)
    dtype = "f64" if "f64" in (m.graph.tensors[x].dtype, m.dtype("pool")) else "f32"
    sums = m.op("sums", "SUMPOOL2D", x, result_dtype=dtype,
                **{k: v for k, v in attrs.items() if k != "count_include_pad"})
    return m.replace("DIV", sums, m.constant("counts", inputs_in_windows(attrs, height, width, np.float64), dtype))


CONVOLUTION: list[Rule] = [
    (Pat("CONV2D", name="conv", where=_nchw), _to_nhwc),  # CONV2D{NCHW} -> TRANSPOSE(CONV2D{NHWC})
    (Pat("CONV2D", name="conv", where=_grouped), _depthwise),  # CONV2D{groups = channels} -> DEPTHWISE_CONV2D
    (Pat("CONV2D", name="conv", where=_grouped), _per_group),  # CONV2D{groups g} -> CONCAT of g CONV2Ds
    (Pat("AVGPOOL2D", name="pool", where=_padding_not_counted),
     _count_padding),  # AVGPOOL2D over the inputs -> SUMPOOL2D / the inputs in each window
]
