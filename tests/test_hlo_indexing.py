"""The HLO frontend's indexing ops and convolution forms, as JAX and Flax print them: iota,
dynamic-slice and dynamic-update-slice (constant and runtime starts), gather (embedding lookups
with runtime ids, constant indices, batching dims, windows), reverse, and convolution with
feature groups, lhs dilation (transposed convolutions), negative padding, rhs reversal, NCHW
labels and one spatial dim. Each compiled, bound and executed in-process and compared with
numpy computed here; XLA clamps start indices so the slice fits, and so must the KPU."""

from __future__ import annotations

import numpy as np
import pytest

from test_frontend_hlo import error, parse, run_hlo

RNG = np.random.default_rng(21)


def rand(*shape: int) -> np.ndarray:
    return RNG.uniform(-2, 2, shape).astype(np.float32)


def op_types(text: str) -> list[str]:
    graph, _ = parse(text)
    return [op.op_type for op in graph.ops]


def runtime_gathers(text: str) -> int:
    """GATHERs whose indices are a tensor read at run time (a second operand)."""
    graph, _ = parse(text)
    return sum(op.op_type == "GATHER" and len(op.inputs) == 2 for op in graph.ops)


# ---- iota ------------------------------------------------------------------------------------

def test_iota_along_any_dimension_in_s32_and_f32():
    text = """HloModule jit_f
ENTRY main {
  a = s32[5]{0} iota(), iota_dimension=0
  b = s32[3,4]{1,0} iota(), iota_dimension=0
  c = f32[2,3,4]{2,1,0} iota(), iota_dimension=1
  d = f32[2,3,4]{2,1,0} iota(), iota_dimension=2
  ROOT t = (s32[5]{0}, s32[3,4]{1,0}, f32[2,3,4]{2,1,0}, f32[2,3,4]{2,1,0}) tuple(a, b, c, d)
}"""
    out = run_hlo(text, {})
    np.testing.assert_array_equal(out["t.0"], np.arange(5))
    np.testing.assert_array_equal(out["t.1"], np.broadcast_to(np.arange(3)[:, None], (3, 4)))
    assert out["t.2"].dtype == np.float32
    np.testing.assert_array_equal(out["t.2"], np.broadcast_to(np.arange(3)[None, :, None], (2, 3, 4)))
    np.testing.assert_array_equal(out["t.3"], np.broadcast_to(np.arange(4), (2, 3, 4)))


# ---- gather: embedding lookups with runtime ids ----------------------------------------------

# params[ids] (form a): JAX wraps negative ids, XLA's gather clamps the rest
TAKE = """HloModule jit_f, entry_computation_layout={(f32[10,4]{1,0}, s32[2,3]{1,0})->f32[2,3,4]{2,1,0}}

ENTRY main.1 {
  p.1 = f32[10,4]{1,0} parameter(0)
  i.1 = s32[2,3]{1,0} parameter(1)
  constant.3 = s32[] constant(0)
  broadcast.3 = s32[2,3]{1,0} broadcast(constant.3), dimensions={}
  lt.1 = pred[2,3]{1,0} compare(i.1, broadcast.3), direction=LT
  constant.2 = s32[] constant(10)
  broadcast.2 = s32[2,3]{1,0} broadcast(constant.2), dimensions={}
  add.1 = s32[2,3]{1,0} add(i.1, broadcast.2)
  select_n.1 = s32[2,3]{1,0} select(lt.1, add.1, i.1)
  broadcast_in_dim.1 = s32[2,3,1]{2,1,0} reshape(select_n.1)
  ROOT gather.1 = f32[2,3,4]{2,1,0} gather(p.1, broadcast_in_dim.1), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,4}
}"""

# flax nn.Embed (jnp.take, mode fill), form (a): ids outside the table read NaN
EMBED = """HloModule jit_apply, entry_computation_layout={(f32[10,4]{1,0}, s32[2,3]{1,0})->f32[2,3,4]{2,1,0}}

_where.1 {
  Arg_0.2 = pred[2,3]{1,0} parameter(0)
  Arg_1.2 = s32[2,3]{1,0} parameter(1)
  Arg_2.1 = s32[2,3]{1,0} parameter(2)
  ROOT select_n.1 = s32[2,3]{1,0} select(Arg_0.2, Arg_1.2, Arg_2.1)
}

region_0.2 {
  reduce_and.3 = pred[] parameter(0)
  reduce_and.4 = pred[] parameter(1)
  ROOT reduce_and.5 = pred[] and(reduce_and.3, reduce_and.4)
}

_take.3 {
  Arg_1.3 = s32[2,3]{1,0} parameter(1)
  constant.11 = s32[] constant(0)
  broadcast.9 = s32[2,3]{1,0} broadcast(constant.11), dimensions={}
  lt.1 = pred[2,3]{1,0} compare(Arg_1.3, broadcast.9), direction=LT
  constant.9 = s32[] constant(10)
  broadcast.8 = s32[2,3]{1,0} broadcast(constant.9), dimensions={}
  add.1 = s32[2,3]{1,0} add(Arg_1.3, broadcast.8)
  jit__where_.1 = s32[2,3]{1,0} call(lt.1, add.1, Arg_1.3), to_apply=_where.1
  broadcast_in_dim.2 = s32[2,3,1]{2,1,0} reshape(jit__where_.1)
  constant.8 = s32[] constant(0)
  broadcast.7 = s32[2,3,1]{2,1,0} broadcast(constant.8), dimensions={}
  ge.1 = pred[2,3,1]{2,1,0} compare(broadcast_in_dim.2, broadcast.7), direction=GE
  constant.7 = s32[] constant(9)
  broadcast.6 = s32[2,3,1]{2,1,0} broadcast(constant.7), dimensions={}
  le.1 = pred[2,3,1]{2,1,0} compare(broadcast_in_dim.2, broadcast.6), direction=LE
  and.1 = pred[2,3,1]{2,1,0} and(ge.1, le.1)
  constant.10 = pred[] constant(true)
  reduce_and.7 = pred[2,3]{1,0} reduce(and.1, constant.10), dimensions={2}, to_apply=region_0.2
  broadcast_in_dim.3 = pred[2,3,4]{2,1,0} broadcast(reduce_and.7), dimensions={0,1}
  Arg_0.3 = f32[10,4]{1,0} parameter(0)
  gather.1 = f32[2,3,4]{2,1,0} gather(Arg_0.3, broadcast_in_dim.2), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,4}
  constant.6 = f32[] constant(nan)
  broadcast.5 = f32[2,3,4]{2,1,0} broadcast(constant.6), dimensions={}
  ROOT select_n.3 = f32[2,3,4]{2,1,0} select(broadcast_in_dim.3, gather.1, broadcast.5)
}

ENTRY main.4 {
  v__params____embedding__.1 = f32[10,4]{1,0} parameter(0)
  i.1 = s32[2,3]{1,0} parameter(1)
  ROOT jit__take_.1 = f32[2,3,4]{2,1,0} call(v__params____embedding__.1, i.1), to_apply=_take.3
}"""

# the same after XLA's optimizations (form b): the slices' dim of 1 kept, then bitcast away
EMBED_OPTIMIZED = """HloModule jit_apply, is_scheduled=true, entry_computation_layout={(f32[10,4]{1,0}, s32[2,3]{1,0})->f32[2,3,4]{2,1,0}}

%fused_computation (param_0.1: f32[10,4], param_1.5: s32[2,3]) -> f32[2,3,4] {
  %param_1.5 = s32[2,3]{1,0} parameter(1)
  %constant.15 = s32[] constant(0)
  %broadcast.18 = s32[2,3]{1,0} broadcast(%constant.15), dimensions={}
  %lt.2 = pred[2,3]{1,0} compare(%param_1.5, %broadcast.18), direction=LT
  %constant.14 = s32[] constant(10)
  %broadcast.17 = s32[2,3]{1,0} broadcast(%constant.14), dimensions={}
  %add.2 = s32[2,3]{1,0} add(%param_1.5, %broadcast.17)
  %select_n.6 = s32[2,3]{1,0} select(%lt.2, %add.2, %param_1.5)
  %ge.3 = pred[2,3]{1,0} compare(%select_n.6, %broadcast.18), direction=GE
  %constant.13 = s32[] constant(9)
  %broadcast.16 = s32[2,3]{1,0} broadcast(%constant.13), dimensions={}
  %le.3 = pred[2,3]{1,0} compare(%select_n.6, %broadcast.16), direction=LE
  %and.3 = pred[2,3]{1,0} and(%ge.3, %le.3)
  %broadcast_in_dim.4 = pred[2,3,4]{2,1,0} broadcast(%and.3), dimensions={0,1}
  %param_0.1 = f32[10,4]{1,0} parameter(0)
  %bitcast.3 = s32[6,1]{0,1} bitcast(%select_n.6)
  %copy.1 = s32[6,1]{1,0} copy(%bitcast.3)
  %gather.3 = f32[6,1,4]{2,1,0} gather(%param_0.1, %copy.1), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}
  %bitcast.2 = f32[2,3,4]{2,1,0} bitcast(%gather.3)
  %constant.12 = f32[] constant(nan)
  %broadcast.15 = f32[2,3,4]{2,1,0} broadcast(%constant.12), dimensions={}
  ROOT %select_n.5 = f32[2,3,4]{2,1,0} select(%broadcast_in_dim.4, %bitcast.2, %broadcast.15)
}

ENTRY %main.4 (v__params____embedding__.1: f32[10,4], i.1: s32[2,3]) -> f32[2,3,4] {
  %v__params____embedding__.1 = f32[10,4]{1,0} parameter(0)
  %i.1 = s32[2,3]{1,0} parameter(1)
  ROOT %broadcast_select_fusion = f32[2,3,4]{2,1,0} fusion(%v__params____embedding__.1, %i.1), kind=kLoop, calls=%fused_computation
}"""


@pytest.mark.parametrize("text, name, fill", [(TAKE, "p.1", False), (EMBED, "v__params____embedding__.1", True),
                                             (EMBED_OPTIMIZED, "v__params____embedding__.1", True)],
                         ids=["params[ids]", "nn.Embed", "nn.Embed-optimized"])
def test_embedding_lookup_with_runtime_ids_clamped_as_xla_does(text, name, fill):
    table = rand(10, 4)
    ids = np.array([[1, 9, 12], [-1, 0, -20]], np.int32)  # 12 and -20 lie outside the table
    [out] = run_hlo(text, {name: table, "i.1": ids}).values()
    wrapped = np.where(ids < 0, ids + 10, ids)
    want = table[np.clip(wrapped, 0, 9)]
    if fill:
        want = np.where(((wrapped >= 0) & (wrapped <= 9))[..., None], want, np.nan)
    np.testing.assert_array_equal(out, want)
    assert runtime_gathers(text) == 1  # the ids read at run time, no table of them


# ---- gather: constant indices, batching dims, several indices, windows -----------------------

COLUMNS = """HloModule jit_f
ENTRY main.1 {
  p.1 = f32[6,8]{1,0} parameter(0)
  constant.1 = s32[3,1]{1,0} constant({ {0}, {2}, {9} })
  ROOT gather.1 = f32[6,3]{1,0} gather(p.1, constant.1), offset_dims={0}, collapsed_slice_dims={1}, start_index_map={1}, index_vector_dim=1, slice_sizes={6,1}
}"""

COLUMNS_OPTIMIZED = """HloModule jit_f, is_scheduled=true

%fused_computation (param_0.3: f32[6,8], param_1: s32[3,1]) -> f32[6,3] {
  %param_0.3 = f32[6,8]{1,0} parameter(0)
  %param_1 = s32[3,1]{1,0} parameter(1)
  %gather.2 = f32[3,6,1]{2,1,0} gather(%param_0.3, %param_1), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={1}, index_vector_dim=1, slice_sizes={6,1}
  %bitcast.1 = f32[3,6]{1,0} bitcast(%gather.2)
  %transpose.1 = f32[6,3]{0,1} transpose(%bitcast.1), dimensions={1,0}
  ROOT %copy.1 = f32[6,3]{1,0} copy(%transpose.1)
}

ENTRY %main.1 (p.1: f32[6,8]) -> f32[6,3] {
  %p.1 = f32[6,8]{1,0} parameter(0)
  %constant.1 = s32[3,1]{1,0} constant({ {0}, {2}, {9} })
  ROOT %transpose_copy_fusion = f32[6,3]{1,0} fusion(%p.1, %constant.1), kind=kLoop, calls=%fused_computation
}"""


@pytest.mark.parametrize("text", [COLUMNS, COLUMNS_OPTIMIZED], ids=["a", "optimized"])
def test_gather_of_constant_indices_takes_them_as_its_attribute(text):
    x = rand(6, 8)
    graph, _ = parse(text)
    [gather] = [op for op in graph.ops if op.op_type == "GATHER"]
    assert gather.attrs == {"indices": [0, 2, 7], "axis": 1}  # 9 clamped to the last column
    [out] = run_hlo(text, {"p.1": x}).values()
    np.testing.assert_array_equal(out, x[:, [0, 2, 7]])


def test_gathers_with_batching_dims_several_indices_and_windows():
    text = """HloModule jit_f
ENTRY main {
  x = f32[3,5]{1,0} parameter(0)
  i = s32[3,2]{1,0} parameter(1)
  k = s32[4,2]{1,0} parameter(2)
  p = f32[6,8]{1,0} parameter(3)
  s = s32[2]{0} parameter(4)
  i3 = s32[3,2,1]{2,1,0} reshape(i)
  along = f32[3,2]{1,0} gather(x, i3), offset_dims={}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1}
  pairs = f32[4,1,1]{2,1,0} gather(x, k), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
  rows = f32[2,2,8]{2,1,0} gather(p, s), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={2,8}
  boxes = f32[4,2,3]{2,1,0} gather(p, s), offset_dims={0,2}, collapsed_slice_dims={}, start_index_map={1}, index_vector_dim=1, slice_sizes={4,3}
  ROOT t = (f32[3,2]{1,0}, f32[4,1,1]{2,1,0}, f32[2,2,8]{2,1,0}, f32[4,2,3]{2,1,0}) tuple(along, pairs, rows, boxes)
}"""
    x, p = rand(3, 5), rand(6, 8)
    i = np.array([[0, 4], [2, 2], [1, 7]], np.int32)  # take_along_axis(x, i, axis=1); 7 clamps to 4
    k = np.array([[0, 0], [2, 4], [5, 1], [-1, 3]], np.int32)  # x[k[:, 0], k[:, 1]]; 5 and -1 clamp
    s = np.array([5, -2], np.int32)
    out = run_hlo(text, {"x": x, "i": i, "k": k, "p": p, "s": s})
    np.testing.assert_array_equal(out["t.0"], np.take_along_axis(x, np.clip(i, 0, 4), axis=1))
    np.testing.assert_array_equal(out["t.1"], x[np.clip(k[:, 0], 0, 2), np.clip(k[:, 1], 0, 4)][:, None, None])
    rows = np.clip(s, 0, 4)  # windows of 2 rows start at most at row 4
    np.testing.assert_array_equal(out["t.2"], np.stack([p[r:r + 2] for r in rows]))
    cols = np.clip(s, 0, 5)  # of 3 columns (of the first 4 rows) at most at column 5
    np.testing.assert_array_equal(out["t.3"], np.stack([p[:4, c:c + 3] for c in cols], axis=1))


# ---- dynamic-slice and dynamic-update-slice --------------------------------------------------

def test_dynamic_slice_with_runtime_and_constant_starts_clamped():
    text = """HloModule jit_f
ENTRY main {
  p = f32[6,8]{1,0} parameter(0)
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  c1 = s32[] constant(1)
  c7 = s32[] constant(7)
  runtime = f32[2,3]{1,0} dynamic-slice(p, i, j), dynamic_slice_sizes={2,3}
  known = f32[2,3]{1,0} dynamic-slice(p, c1, c7), dynamic_slice_sizes={2,3}
  columns = f32[6,3]{1,0} dynamic-slice(p, i, j), dynamic_slice_sizes={6,3}
  ROOT t = (f32[2,3]{1,0}, f32[2,3]{1,0}, f32[6,3]{1,0}) tuple(runtime, known, columns)
}"""
    p = rand(6, 8)
    assert runtime_gathers(text) == 3  # i and j for the first; j alone where the slice is all rows
    out = run_hlo(text, {"p": p, "i": np.array(5, np.int32), "j": np.array(-3, np.int32)})
    np.testing.assert_array_equal(out["t.0"], p[4:6, 0:3])  # 5 clamps to 4, -3 to 0
    np.testing.assert_array_equal(out["t.1"], p[1:3, 5:8])  # 7 clamps to 5
    np.testing.assert_array_equal(out["t.2"], p[:, 0:3])


def test_dynamic_update_slice_with_constant_and_runtime_starts_clamped():
    text = """HloModule jit_f
ENTRY main {
  p = f32[6,8]{1,0} parameter(0)
  u = f32[2,3]{1,0} parameter(1)
  i = s32[] parameter(2)
  c1 = s32[] constant(1)
  c2 = s32[] constant(2)
  c9 = s32[] constant(9)
  known = f32[6,8]{1,0} dynamic-update-slice(p, u, c1, c9)
  runtime = f32[6,8]{1,0} dynamic-update-slice(p, u, i, c2)
  ROOT t = (f32[6,8]{1,0}, f32[6,8]{1,0}) tuple(known, runtime)
}"""
    p, u = rand(6, 8), rand(2, 3)
    assert runtime_gathers(text) == 1  # the runtime row's; the known box is a PAD and a mask
    out = run_hlo(text, {"p": p, "u": u, "i": np.array(7, np.int32)})
    known, runtime = p.copy(), p.copy()
    known[1:3, 5:8] = u  # 9 clamps to 5
    runtime[4:6, 2:5] = u  # 7 clamps to 4
    np.testing.assert_array_equal(out["t.0"], known)
    np.testing.assert_array_equal(out["t.1"], runtime)


def test_dynamic_update_slice_at_constant_starts_is_a_pad_and_a_select():
    text = """HloModule jit_f
ENTRY main.1 {
  p.1 = f32[4,8]{1,0} parameter(0)
  u.1 = f32[2,3]{1,0} parameter(1)
  constant.2 = s32[] constant(1)
  constant.3 = s32[] constant(2)
  ROOT dynamic_update_slice.1 = f32[4,8]{1,0} dynamic-update-slice(p.1, u.1, constant.2, constant.3)
}"""
    assert op_types(text) == ["PAD", "SELECT"]


# ---- convolution -----------------------------------------------------------------------------

def conv_reference(x, w, stride=(1, 1), pad=((0, 0), (0, 0)), lhs_dilate=(1, 1), rhs_dilate=(1, 1), groups=1):
    """HLO's convolution of NHWC x by HWIO w, by its definition: x with lhs_dilate - 1 zeros
    between its elements, padded (a negative padding crops), then each output the sum of its
    window's products, group by group."""
    n, h, wd, c = x.shape
    z = np.zeros((n, (h - 1) * lhs_dilate[0] + 1, (wd - 1) * lhs_dilate[1] + 1, c))
    z[:, ::lhs_dilate[0], ::lhs_dilate[1]] = x
    for axis, (lo, hi) in zip((1, 2), pad):
        z = np.pad(z, [(max(lo, 0), max(hi, 0)) if k == axis else (0, 0) for k in range(4)])
        z = np.take(z, np.arange(max(-lo, 0), z.shape[axis] - max(-hi, 0)), axis=axis)
    kh, kw, per_group, o = w.shape
    oh = (z.shape[1] - (kh - 1) * rhs_dilate[0] - 1) // stride[0] + 1
    ow = (z.shape[2] - (kw - 1) * rhs_dilate[1] - 1) // stride[1] + 1
    out, per_out = np.zeros((n, oh, ow, o)), o // groups
    for i in range(kh):
        for j in range(kw):
            r, s = i * rhs_dilate[0], j * rhs_dilate[1]
            patch = z[:, r:r + (oh - 1) * stride[0] + 1:stride[0], s:s + (ow - 1) * stride[1] + 1:stride[1]]
            for g in range(groups):
                out[..., g * per_out:(g + 1) * per_out] += (patch[..., g * per_group:(g + 1) * per_group]
                                                           @ w[i, j, :, g * per_out:(g + 1) * per_out])
    return out


def nhwc_conv(x_shape, w_shape, out_shape, window, extra=""):
    return f"""HloModule jit_apply
ENTRY main.1 {{
  x.1 = f32[{','.join(map(str, x_shape))}]{{3,2,1,0}} parameter(0)
  w.1 = f32[{','.join(map(str, w_shape))}]{{3,2,1,0}} parameter(1)
  ROOT conv_general_dilated.1 = f32[{','.join(map(str, out_shape))}]{{3,2,1,0}} convolution(x.1, w.1), window={{{window}}}, dim_labels=b01f_01io->b01f{extra}
}}"""


# (window as Flax's ConvTranspose and Conv print them, the weights HWIO, the output, the
# reference's arguments); the input is [1, 4, 4, I x groups]
CONVS = [
    ("size=2x2 pad=1_1x1_1 lhs_dilate=2x2", (2, 2, 3, 5), (1, 8, 8, 5),
     {"pad": ((1, 1), (1, 1)), "lhs_dilate": (2, 2)}),
    ("size=3x3 pad=2_1x2_1 lhs_dilate=2x2", (3, 3, 3, 5), (1, 8, 8, 5),
     {"pad": ((2, 1), (2, 1)), "lhs_dilate": (2, 2)}),
    ("size=3x3 pad=-1_2x0_-1 lhs_dilate=2x2", (3, 3, 3, 5), (1, 6, 4, 5),
     {"pad": ((-1, 2), (0, -1)), "lhs_dilate": (2, 2)}),
    ("size=3x3 stride=2x1 pad=1_1x-1_0", (3, 3, 3, 5), (1, 2, 1, 5), {"stride": (2, 1), "pad": ((1, 1), (-1, 0))}),
    ("size=3x3 pad=1_1x1_1", (3, 3, 2, 6), (1, 4, 4, 6), {"pad": ((1, 1), (1, 1)), "groups": 2}),
    ("size=3x3 pad=1_1x1_1", (3, 3, 1, 6), (1, 4, 4, 6), {"pad": ((1, 1), (1, 1)), "groups": 3}),
    ("size=3x3 pad=1_1x1_1", (3, 3, 1, 3), (1, 4, 4, 3), {"pad": ((1, 1), (1, 1)), "groups": 3}),
]


@pytest.mark.parametrize("window, w_shape, out_shape, ref", CONVS,
                         ids=["transpose-2x2-s2", "transpose-3x3-s2-same", "transpose-negative-pad", "negative-pad",
                              "grouped", "depthwise-x2", "depthwise"])
def test_convolution_lhs_dilation_negative_padding_and_feature_groups(window, w_shape, out_shape, ref):
    groups = ref.get("groups", 1)
    x, w = rand(1, 4, 4, w_shape[2] * groups), rand(*w_shape)
    text = nhwc_conv(x.shape, w.shape, out_shape, window, f", feature_group_count={groups}" if groups > 1 else "")
    [out] = run_hlo(text, {"x.1": x, "w.1": w}).values()
    np.testing.assert_allclose(out, conv_reference(x, w, **ref), rtol=1e-5, atol=1e-5)


def test_convolution_rhs_reversal_reverses_the_kernel():
    x, w = rand(1, 5, 5, 2), rand(3, 2, 2, 4)
    text = nhwc_conv(x.shape, w.shape, (1, 5, 4, 4), "size=3x2 pad=1_1x0_0 rhs_reversal=1x0")
    [out] = run_hlo(text, {"x.1": x, "w.1": w}).values()
    np.testing.assert_allclose(out, conv_reference(x, w[::-1], pad=((1, 1), (0, 0))), rtol=1e-5, atol=1e-5)


def test_nchw_transposed_convolution_with_its_kernel_reversed():
    """jax.lax.conv_transpose(transpose_kernel=True) on NCHW / OIHW: reverse, transpose, then a
    convolution with lhs_dilate and bf01 labels."""
    text = """HloModule jit_f
ENTRY main.1 {
  x.1 = f32[1,3,4,4]{3,2,1,0} parameter(0)
  w.1 = f32[3,5,3,3]{3,2,1,0} parameter(1)
  rev.2 = f32[3,5,3,3]{3,2,1,0} reverse(w.1), dimensions={2}
  rev.3 = f32[3,5,3,3]{3,2,1,0} reverse(rev.2), dimensions={3}
  transpose.1 = f32[5,3,3,3]{3,2,0,1} transpose(rev.3), dimensions={1,0,2,3}
  ROOT conv_general_dilated.1 = f32[1,5,8,8]{3,2,1,0} convolution(x.1, transpose.1), window={size=3x3 pad=2_1x2_1 lhs_dilate=2x2}, dim_labels=bf01_oi01->bf01
}"""
    x, w = rand(1, 3, 4, 4), rand(3, 5, 3, 3)
    [out] = run_hlo(text, {"x.1": x, "w.1": w}).values()
    hwio = w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)
    want = conv_reference(x.transpose(0, 2, 3, 1), hwio, pad=((2, 1), (2, 1)), lhs_dilate=(2, 2))
    np.testing.assert_allclose(out, want.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window, length, ref", [
    ("size=3 stride=2 pad=0_1", 5, {"stride": (1, 2), "pad": ((0, 0), (0, 1))}),
    ("size=3 pad=2_1 lhs_dilate=2", 20, {"pad": ((0, 0), (2, 1)), "lhs_dilate": (1, 2)}),
], ids=["conv1d", "transpose1d"])
def test_one_spatial_dim_is_a_height_of_one(window, length, ref):
    text = f"""HloModule jit_apply
ENTRY main.1 {{
  x.1 = f32[2,10,4]{{2,1,0}} parameter(0)
  w.1 = f32[3,4,6]{{2,1,0}} parameter(1)
  ROOT conv_general_dilated.1 = f32[2,{length},6]{{2,1,0}} convolution(x.1, w.1), window={{{window}}}, dim_labels=b0f_0io->b0f
}}"""
    x, w = rand(2, 10, 4), rand(3, 4, 6)
    [out] = run_hlo(text, {"x.1": x, "w.1": w}).values()
    np.testing.assert_allclose(out, conv_reference(x[:, None], w[None], **ref)[:, 0], rtol=1e-5, atol=1e-5)


# ---- refusals --------------------------------------------------------------------------------

REFUSED = [
    ("x = f32[1,2,2,2,1] parameter(0)\n w = f32[1,1,1,1,1] parameter(1)\n"
     " ROOT y = f32[1,2,2,2,1] convolution(x, w), window={size=1x1x1}, dim_labels=b012f_012io->b012f",
     "only convolutions with one or two spatial dimensions"),
    ("x = f32[1,2,2,1] parameter(0)\n w = f32[1,1,1,1] parameter(1)\n"
     " ROOT y = f32[1,2,2,1] convolution(x, w), window={size=1x1 hole=1x1}, dim_labels=b01f_01io->b01f",
     "window field 'hole' is not supported"),
    ("x = f32[1,4,4,1] parameter(0)\n w = f32[1,1,1,1] parameter(1)\n"
     " ROOT y = f32[1,1,1,1] convolution(x, w), window={size=1x1 pad=-4_-4x0_-3 lhs_dilate=2x1}, "
     "dim_labels=b01f_01io->b01f", "window pad -4_-4 crops more than the 7 positions of the input"),
    ("x = f32[6,8] parameter(0)\n i = s32[3] parameter(1)\n"
     " ROOT g = f32[3,2,9] gather(x, i), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0}, "
     "index_vector_dim=1, slice_sizes={2,9}", "slice_sizes={2,9} is not a size per operand dim"),
    ("x = f32[6,8] parameter(0)\n i = s32[3,2] parameter(1)\n"
     " ROOT g = f32[3,8] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, "
     "index_vector_dim=1, slice_sizes={1,8}", "index vectors of 2 entries for start_index_map={0}"),
    ("x = f32[6,8] parameter(0)\n i = f32[3] parameter(1)\n"
     " ROOT g = f32[3,8] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, "
     "index_vector_dim=1, slice_sizes={1,8}", "indices of f32: an integer type is needed"),
    ("x = f32[6,8] parameter(0)\n i = s32[2] parameter(1)\n"
     " ROOT d = f32[2,3] dynamic-slice(x, i), dynamic_slice_sizes={2,3}", "1 start indices and 2 sizes"),
    ("x = f32[6,8] parameter(0)\n i = s32[] parameter(1)\n"
     " ROOT d = f32[2,9] dynamic-slice(x, i, i), dynamic_slice_sizes={2,9}", "a slice of 9 does not fit dimension 1"),
    ("x = f32[6,8] parameter(0)\n u = f32[2] parameter(1)\n i = s32[] parameter(2)\n"
     " ROOT d = f32[6,8] dynamic-update-slice(x, u, i, i)", "the update [2] is not of the operand's rank 2"),
    ("x = f32[6] parameter(0)\n i = s32[1,1] parameter(1)\n u = f32[1] parameter(2)\n"
     " ROOT s = f32[6] scatter(x, i, u), update_window_dims={}, inserted_window_dims={0}, "
     "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=r", "HLO op 'scatter' is not supported"),
]


@pytest.mark.parametrize("body, reason", REFUSED, ids=[r for _, r in REFUSED])
def test_refusals_are_one_line_naming_the_instruction(body, reason):
    message = error(f"HloModule m\nENTRY e {{\n {body}\n}}")
    last = body.count("\n") + 3
    assert message.startswith(f"t.hlo:{last}:") and reason in message, message
