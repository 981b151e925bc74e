"""SPLIT LONG ROWS: row ops whose rows do not fit a tile of the target, taken apart into ops whose
kernels lower, so a long row costs more passes over it instead of failing to compile.

Unlike the rule tables this pass needs the target: an op is split only when the kernel of its
fusion group (the op and the epilogue fusion gives it) would cut its rows in a way the lowering
cannot take, by the rule the lowering tiles with (`lower_vector.split_axes`). It runs in
`compile_graph` and in `--dump`, after `canonicalise`, so RECOGNISE never folds the chains it
writes back into the row op, and before fusion, which then fuses each chain as its rules allow.
Every new op keeps the row op's `source`; the last one takes its name and computes its result.
Intermediates are kept at the precision the row op computes in (f32, f64 beside f64), and the
numbers a chain needs (n, epsilon) are scalar graph constants with values. An integer REDUCE_*
(operand and result integers) keeps them where its one rounding, the reference's int64 result
wrapped to the output dtype, comes out the same: a SUM's or PROD's partial results wrap to the
output dtype (a sum or product of values wrapped modulo 2^b wraps to the same b bits), a MAX's or
MIN's stay in the operand's dtype, which holds every value exactly (one wrapped to a narrower
output would no longer order as before).

    REDUCE_SUM/MAX/MIN/PROD   cut along one reduced axis: a reduction loop, not split; along several:
                              REDUCE(REDUCE(x, the reduced axes from the last cut one on), axes)
    REDUCE_MEAN(x)            REDUCE_SUM(x) / n
    SOFTMAX(x)                e / REDUCE_SUM(e), e = EXP(x - REDUCE_MAX(x))
    LOG_SOFTMAX(x)            (x - m) - LOG(REDUCE_SUM(EXP(x - m))), m = REDUCE_MAX(x)
    LAYERNORM(x, s?, b?)      (x - mean) * RSQRT(REDUCE_SUM((x - mean)^2) / n + epsilon) * s + b,
                              mean = REDUCE_SUM(x) / n
    RMSNORM(x, s?)            x * RSQRT(REDUCE_SUM(x * x) / n + epsilon) * s

A difference needed twice (LOG_SOFTMAX's x - m, LAYERNORM's x - mean) is computed twice: each
time it fuses into the kernel that reads it, where keeping it would write a tensor of x's size
and read it twice.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from dfx import Graph, Op, Tensor, is_integer, lookup
from dfx.ops.reduction import ACCUMULATING

from ..fuse import fusion_groups
from ..lower_vector import split_axes
from ..target import Target


class Chain:
    """The ops that replace one row op `root`, in order, with intermediates of `dtype`."""

    def __init__(self, graph: Graph, root: Op, dtype: str, op_names: set[str]):
        self.graph, self.root, self.dtype, self.op_names = graph, root, dtype, op_names
        self.ops: list[Op] = []

    def _name(self, step: str) -> str:
        """A new tensor (and op) name: the root's, then the step."""
        name, n = f"{self.root.name}.{step}", 1
        while name in self.graph.tensors or name in self.op_names:
            name, n = f"{self.root.name}.{step}{n}", n + 1
        return name

    def op(self, step: str, op_type: str, *inputs: str, **attrs) -> str:
        """Append an op computing an intermediate from `inputs`; its result."""
        name = self._name(step)
        opdef = lookup(op_type)
        operands = [self.graph.tensors[t] for t in inputs]
        (shape,) = opdef.infer_shapes([t.shape for t in operands], [t.dtype for t in operands],
                                      opdef.normalize_attrs(attrs))
        self.graph.tensors[name] = Tensor(name, tuple(shape), self.dtype)
        self.ops.append(Op(name, op_type, list(inputs), [name], attrs, self.root.source))
        self.op_names.add(name)
        return name

    def constant(self, step: str, value: float) -> str:
        """A scalar graph constant holding `value`."""
        name = self._name(step)
        self.graph.tensors[name] = Tensor(name, (), self.dtype, "constant")
        self.graph.set_constant(name, value)
        return name

    def count(self, axes: list[int]) -> str:
        """A constant holding n, the elements of the root's operand each row reduces."""
        shape = self.graph.tensors[self.root.inputs[0]].shape
        return self.constant("n", math.prod(shape[a] for a in axes))

    def finish(self) -> list[Op]:
        """The chain, its last op computing the root's result under the root's name."""
        last = self.ops[-1]
        del self.graph.tensors[last.outputs[0]]
        self.op_names.discard(last.name)
        self.ops[-1] = replace(last, name=self.root.name, outputs=list(self.root.outputs))
        return self.ops


def _reduce(c: Chain, attrs: dict, axes: list[int], cut: tuple[int, ...]) -> None:
    # the first reduces the last cut axis and the reduced axes after it, whole in the tile, so its
    # kernel cuts one; the second reduces `axes` again, those now of size 1 (a next sweep splits
    # either again if its own tiles still cut several)
    x, op_type = c.root.inputs[0], c.root.op_type
    part = c.op("part", op_type, x, axes=[a for a in axes if a >= max(cut)], keepdims=True)
    c.op("rest", op_type, part, **c.root.attrs)


def _mean(c: Chain, attrs: dict, axes: list[int], cut: tuple[int, ...]) -> None:
    c.op("mean", "DIV", c.op("sum", "REDUCE_SUM", c.root.inputs[0], axes=axes, keepdims=attrs["keepdims"]),
         c.count(axes))


def _softmax(c: Chain, attrs: dict, axes: list[int], cut: tuple[int, ...]) -> None:
    x = c.root.inputs[0]
    m = c.op("max", "REDUCE_MAX", x, axes=axes, keepdims=True)
    e = c.op("exp", "EXP", c.op("shift", "SUB", x, m))
    c.op("softmax", "DIV", e, c.op("sum", "REDUCE_SUM", e, axes=axes, keepdims=True))


def _log_softmax(c: Chain, attrs: dict, axes: list[int], cut: tuple[int, ...]) -> None:
    x = c.root.inputs[0]
    m = c.op("max", "REDUCE_MAX", x, axes=axes, keepdims=True)
    s = c.op("sum", "REDUCE_SUM", c.op("exp", "EXP", c.op("shift", "SUB", x, m)), axes=axes, keepdims=True)
    log_s = c.op("log", "LOG", s)
    c.op("log_softmax", "SUB", c.op("shift_again", "SUB", x, m), log_s)


def _layernorm(c: Chain, attrs: dict, axes: list[int], cut: tuple[int, ...]) -> None:
    x, *affine = c.root.inputs
    n = c.count(axes)
    mean = c.op("mean", "DIV", c.op("sum", "REDUCE_SUM", x, axes=axes, keepdims=True), n)
    centred = c.op("centred", "SUB", x, mean)
    sum_sq = c.op("sum_sq", "REDUCE_SUM", c.op("square", "MUL", centred, centred), axes=axes, keepdims=True)
    variance = c.op("var", "DIV", sum_sq, n)
    rstd = c.op("rstd", "RSQRT", c.op("var_eps", "ADD", variance, c.constant("epsilon", attrs["epsilon"])))
    y = c.op("normed", "MUL", c.op("centred_again", "SUB", x, mean), rstd)
    for step, op_type, operand in zip(("scaled", "biased"), ("MUL", "ADD"), affine):
        y = c.op(step, op_type, y, operand)


def _rmsnorm(c: Chain, attrs: dict, axes: list[int], cut: tuple[int, ...]) -> None:
    x, *scale = c.root.inputs
    sum_sq = c.op("sum_sq", "REDUCE_SUM", c.op("square", "MUL", x, x), axes=axes, keepdims=True)
    mean_sq = c.op("mean_sq", "DIV", sum_sq, c.count(axes))
    rms = c.op("rrms", "RSQRT", c.op("mean_sq_eps", "ADD", mean_sq, c.constant("epsilon", attrs["epsilon"])))
    y = c.op("normed", "MUL", x, rms)
    if scale:
        c.op("scaled", "MUL", y, scale[0])


# row op -> fn(chain, its normalized attrs, the axes it reduces, the axes its kernel would cut),
# appending the ops that compute it to the chain
SPLITS: dict[str, Callable[[Chain, dict, list[int], tuple[int, ...]], None]] = {
    **dict.fromkeys(sorted(ACCUMULATING), _reduce),  # REDUCE(x) -> REDUCE(REDUCE(x, the last axes))
    "REDUCE_MEAN": _mean,  # REDUCE_MEAN(x) -> REDUCE_SUM(x) / n
    "SOFTMAX": _softmax,  # SOFTMAX(x) -> e / REDUCE_SUM(e), e = EXP(x - REDUCE_MAX(x))
    "LOG_SOFTMAX": _log_softmax,  # LOG_SOFTMAX(x) -> (x - m) - LOG(REDUCE_SUM(EXP(x - m)))
    "LAYERNORM": _layernorm,  # LAYERNORM(x, s, b) -> (x - mean) * RSQRT(var + epsilon) * s + b
    "RMSNORM": _rmsnorm,  # RMSNORM(x, s) -> x * RSQRT(REDUCE_SUM(x * x) / n + epsilon) * s
}


def _split(graph: Graph, root: Op, cut: tuple[int, ...], op_names: set[str]) -> list[Op]:
    """The ops that compute `root` in kernels that lower, its kernel cutting axes `cut`."""
    opdef = lookup(root.op_type)
    attrs = opdef.normalize_attrs(root.attrs)
    axes = list(opdef.whole_axes(graph.tensors[root.inputs[0]].shape, attrs))
    dtypes = [graph.tensors[t].dtype for t in root.inputs + root.outputs]
    if root.op_type in ACCUMULATING and all(is_integer(d) for d in dtypes):
        # sums and products wrap alike at every step; max and min must see the values unwrapped
        dtype = dtypes[-1] if root.op_type in ("REDUCE_SUM", "REDUCE_PROD") else dtypes[0]
    else:
        dtype = "f64" if "f64" in dtypes else "f32"  # as the op computes, before it rounds once
    chain = Chain(graph, root, dtype, op_names)
    SPLITS[root.op_type](chain, attrs, axes, cut)
    return chain.finish()


def split_long_rows(graph: Graph, target: Target, fuse: bool = True) -> Graph:
    """`graph` with every row op whose kernel (fused as `fuse` says) would cut its rows in a way
    the lowering cannot take split into ops whose kernels lower, as a new graph. Sweeps to a fixed
    point: a split's reductions may need splitting in turn (a LAYERNORM's over several axes)."""
    graph = replace(graph, tensors=dict(graph.tensors), ops=list(graph.ops), constants=dict(graph.constants))
    changed = True
    while changed:
        changed, ops = False, []
        op_names = {op.name for op in graph.ops}  # and those the splits add, as they add them
        for group in fusion_groups(graph, fuse):
            root = group[0]
            cut = split_axes(graph, group, target) if root.op_type in SPLITS else ()
            takes = 1 if root.op_type in ACCUMULATING else 0  # a reduction loop takes one cut axis
            if len(cut) > takes:
                ops += _split(graph, root, cut, op_names)
                changed = True
            else:
                ops.append(root)
            ops += group[1:]
        graph.ops = ops
    return graph
