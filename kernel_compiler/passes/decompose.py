"""DECOMPOSE: ops the registry declares but the lowering does not take, rewritten into the
primitives it does (STYLE.md item 2). RELU6-style clamps are already CLAMP in every frontend."""

from __future__ import annotations

from dfx import Op

from .rewrite import Match, Pat, Rule


def _linear(m: Match) -> Op:
    # the weight [out, in] is MATMUL's B transposed; the bias [out] its Cin, broadcast over rows
    return m.replace("MATMUL", *m.root.inputs, transpose_b=True)


DECOMPOSE: list[Rule] = [
    (Pat("LINEAR"), _linear),  # LINEAR(x, W, b?) -> MATMUL(x, W, b?){transpose_b}
]
