"""HloModule text as XLA prints it after its passes (`jax.jit(f).lower(...).compile().as_text()`
and the `*after_optimizations.txt` dump): the debug tables before the computations, scheduling,
layout and metadata annotations, every fusion kind inlined, bitcasts and copies between layouts,
and control flow whose path is known at compile time: `while` unrolled, `conditional` inlined,
the custom-calls that change no value. Snippets are as JAX 0.10.2 printed them, trimmed; values
are checked against numpy, compiled and executed in-process."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_compiler.frontends import hlo_ops
from kernel_compiler.frontends.hlo_text import read_module
from test_frontend_hlo import error, parse, rand, run_hlo

# ---- the module's header ---------------------------------------------------------------------

DEBUG_TABLES = """HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[2,3]{1,0})->f32[2,3]{1,0}}

FileNames
1 "model.py"
2 "site-packages/flax/linen/module.py"

FunctionNames
1 "<module>"
2 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=17 end_line=17 column=0 end_column=31}
2 {file_name_id=2 function_name_id=2 line=8 end_line=8 column=9 end_column=32}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}


ENTRY %main.1 (x.1: f32[2,3]) -> f32[2,3] {
  %x.1 = f32[2,3]{1,0} parameter(0), metadata={op_name="x"}
  ROOT %neg.0 = f32[2,3]{1,0} negate(%x.1), metadata={op_name="jit(f)/neg" stack_frame_id=2}
}
"""


def test_debug_tables_before_the_computations_are_read_and_skipped():
    graph, _ = parse(DEBUG_TABLES)
    assert [op.op_type for op in graph.ops] == ["NEGATE"]
    assert graph.ops[0].source == "t.hlo:22 'neg.0'"  # lines still counted through the tables


def test_empty_debug_tables_as_a_partitioned_module_prints_them():
    text = ("HloModule m, num_partitions=2\n\nFileNames\n\nFunctionNames\n\nFileLocations\n\nStackFrames\n\n\n"
            "ENTRY %e (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n  ROOT %a = f32[4]{0} abs(%p)\n}\n")
    assert [op.op_type for op in parse(text)[0].ops] == ["ABS"]


def test_a_computation_may_still_be_called_like_a_table():
    text = "HloModule m\nStackFrames {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] abs(p)\n}\n"
    assert read_module("t.hlo", text).entry.name == "StackFrames"


def test_a_table_row_without_its_value_names_the_line():
    assert error("HloModule m\nFileNames\n1 \"a.py\"\n2").startswith("t.hlo:4: row 2 of table FileNames: missing value")


# ---- annotations, fusions, layouts -----------------------------------------------------------

# one of each: scheduled module with its entry layout (an index comment in it), memory-space and
# tiled layouts, sharding, metadata with stack frames, backend_config JSON, frontend attributes,
# fusions of every kind, a computation of another execution thread, a tuple-shaped parameter
# of a called computation, a bitcast that only reshapes, a copy into another layout
ANNOTATED = """HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[2,3]{1,0}, f32[2,3]{1,0}, s32[6]{0}, f32[2,3]{1,0}, f32[2,3]{1,0}, /*index=5*/f32[2,3]{1,0})->(f32[2,3]{1,0}, s32[6,1]{0,1}, f32[3,2]{0,1})}, allow_spmd_sharding_propagation_to_output={true}

%fused_add (param_0: f32[2,3], param_1: f32[2,3]) -> f32[2,3] {
  %param_0 = f32[2,3]{1,0} parameter(0)
  %param_1 = f32[2,3]{1,0} parameter(1)
  ROOT %add.0 = f32[2,3]{1,0} add(%param_0, %param_1), metadata={op_name="jit(f)/add" stack_frame_id=3}
}

%fused_mul (param_0.1: f32[2,3], param_1.1: f32[2,3]) -> f32[2,3] {
  %param_0.1 = f32[2,3]{1,0} parameter(0)
  %param_1.1 = f32[2,3]{1,0} parameter(1)
  ROOT %mul.0 = f32[2,3]{1,0} multiply(%param_0.1, %param_1.1)
}

%fused_sub (param_0.2: f32[2,3], param_1.2: f32[2,3]) -> f32[2,3] {
  %param_0.2 = f32[2,3]{1,0} parameter(0)
  %param_1.2 = f32[2,3]{1,0} parameter(1)
  ROOT %sub.0 = f32[2,3]{1,0} subtract(%param_0.2, %param_1.2)
}

%fused_max (param_0.3: f32[2,3], param_1.3: f32[2,3], param_2.3: f32[2,3], param_3.3: f32[2,3], param_4.3: f32[2,3], param_5.3: f32[2,3]) -> f32[2,3] {
  %param_0.3 = f32[2,3]{1,0} parameter(0)
  %param_1.3 = f32[2,3]{1,0} parameter(1)
  %param_2.3 = f32[2,3]{1,0} parameter(2)
  %param_3.3 = f32[2,3]{1,0} parameter(3)
  %param_4.3 = f32[2,3]{1,0} parameter(4)
  %param_5.3 = f32[2,3]{1,0} parameter(5)
  ROOT %max.0 = f32[2,3]{1,0} maximum(%param_0.3, %param_5.3)
}

%pair (arg_tuple.1: (f32[2,3], f32[2,3])) -> f32[2,3] {
  %arg_tuple.1 = (f32[2,3]{1,0}, /*index=1*/f32[2,3]{1,0}) parameter(0)
  %get-tuple-element.1 = f32[2,3]{1,0} get-tuple-element(%arg_tuple.1), index=0
  %get-tuple-element.2 = f32[2,3]{1,0} get-tuple-element(%arg_tuple.1), index=1
  ROOT %min.0 = f32[2,3]{1,0} minimum(%get-tuple-element.1, %get-tuple-element.2)
}, execution_thread="main"

ENTRY %main.9 (a.1: f32[2,3], b.1: f32[2,3], i.1: s32[6], c.1: f32[2,3], d.1: f32[2,3], e.1: f32[2,3]) -> (f32[2,3], s32[6,1], f32[3,2]) {
  %a.1 = f32[2,3]{1,0:T(2,128)S(1)} parameter(0), sharding={replicated}, metadata={op_name="a"}
  %b.1 = f32[2,3]{1,0:S(1)} parameter(1), metadata={op_name="b"}
  %i.1 = s32[6]{0} parameter(2)
  %c.1 = f32[2,3]{1,0} parameter(3)
  %d.1 = f32[2,3]{1,0} parameter(4)
  %e.1 = f32[2,3]{1,0} parameter(5)
  %loop = f32[2,3]{1,0} fusion(%a.1, %b.1), kind=kLoop, calls=%fused_add, metadata={op_name="jit(f)/add" stack_frame_id=3}
  %input = f32[2,3]{1,0} fusion(%loop, %c.1), kind=kInput, calls=%fused_mul
  %output = f32[2,3]{1,0} fusion(%input, %d.1), kind=kOutput, calls=%fused_sub
  %custom = f32[2,3]{1,0} fusion(%output, %a.1, %b.1, %c.1, %d.1, /*index=5*/%e.1), kind=kCustom, calls=%fused_max, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
  %tuple.1 = (f32[2,3]{1,0}, f32[2,3]{1,0}) tuple(%custom, %a.1)
  %call = f32[2,3]{1,0} call(%tuple.1), to_apply=%pair, frontend_attributes={xla_cpu_small_call="true"}
  %bitcast.1 = s32[6,1]{0,1} bitcast(%i.1)
  %copy.1 = f32[2,3]{0,1} copy(%call)
  %transpose.1 = f32[3,2]{0,1} transpose(%copy.1), dimensions={1,0}
  ROOT %tuple.2 = (f32[2,3]{1,0}, s32[6,1]{0,1}, f32[3,2]{0,1}) tuple(%call, %bitcast.1, %transpose.1)
}
"""


def test_annotations_every_fusion_kind_and_views_between_layouts():
    graph, warnings = parse(ANNOTATED)
    assert warnings == []
    # every fusion inlined; the bitcast a RESHAPE, the copy nothing
    assert [op.op_type for op in graph.ops] == ["ADD", "MUL", "SUB", "MAXIMUM", "MINIMUM", "RESHAPE", "TRANSPOSE"]
    a, b, c, d, e = (rand(2, 3) for _ in range(5))
    i = np.arange(6, dtype=np.int32)
    out = run_hlo(ANNOTATED, {"a.1": a, "b.1": b, "i.1": i, "c.1": c, "d.1": d, "e.1": e})
    want = np.minimum(np.maximum((a + b) * c - d, e), a)
    np.testing.assert_allclose(out["tuple.2.0"], want, rtol=1e-6)
    np.testing.assert_array_equal(out["tuple.2.1"], i.reshape(6, 1))
    np.testing.assert_allclose(out["tuple.2.2"], want.T, rtol=1e-6)  # a copy keeps the values


def test_layouts_are_read_minor_to_major_with_their_tiles():
    text = ("HloModule m\nENTRY e {\n  a = f32[2,3]{0,1} parameter(0)\n  b = f32[2,3]{1,0:T(8,128)} parameter(1)\n"
            "  c = f32[2,3]{1,0:S(1)} parameter(2)\n  ROOT s = f32[] constant(0)\n}\n")
    shapes = {n: i.type for n, i in read_module("t.hlo", text).entry.instrs.items()}
    assert (shapes["a"].layout, shapes["a"].major_to_minor, shapes["a"].tiled) == ((0, 1), [1, 0], False)
    assert (shapes["b"].layout, shapes["b"].tiled) == ((1, 0), True)
    assert (shapes["c"].layout, shapes["c"].tiled) == ((1, 0), False)  # a memory space places no element
    assert (shapes["s"].layout, shapes["s"].major_to_minor) == (None, [])


def test_a_layout_that_is_no_order_of_the_dims_is_refused():
    message = error("HloModule m\nENTRY e {\n  ROOT a = f32[2,3]{1,1} parameter(0)\n}\n")
    assert message == "t.hlo:3: layout {1,1} is not an order of the shape's 2 dimensions"


def test_a_bitcast_of_a_tiled_layout_is_refused():
    """A bitcast between orders of the dims is a transpose (test_frontend_hlo); one of elements in
    tiles is not read."""
    text = "HloModule m\nENTRY e {\n  a = f32[2,3]{1,0:T(2,128)} parameter(0)\n  ROOT b = f32[6]{0} bitcast(a)\n}\n"
    assert "a bitcast of a tiled layout places elements in tiles" in error(text)


# ---- while -----------------------------------------------------------------------------------

# jax.lax.fori_loop(0, 4, lambda i, c: c * 2 + i, x) after XLA's passes: the loop in a call, its
# increment and comparison each a fusion
FORI_LOOP = """HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[2,3]{1,0})->f32[2,3]{1,0}}

%fused_computation (param_0.1: s32[], param_1.3: f32[2,3]) -> f32[2,3] {
  %param_1.3 = f32[2,3]{1,0} parameter(1)
  %constant.17 = f32[] constant(2)
  %broadcast.5 = f32[2,3]{1,0} broadcast(%constant.17), dimensions={}
  %mul.5 = f32[2,3]{1,0} multiply(%param_1.3, %broadcast.5)
  %param_0.1 = s32[] parameter(0)
  %convert_element_type.5 = f32[] convert(%param_0.1)
  %add.23 = f32[2,3]{1,0} broadcast(%convert_element_type.5), dimensions={}
  ROOT %add.22 = f32[2,3]{1,0} add(%mul.5, %add.23)
}

%wrapped_add_computation (param_0.2: s32[], param_1.4: s32[]) -> s32[] {
  %param_0.2 = s32[] parameter(0)
  %param_1.4 = s32[] parameter(1)
  ROOT %add.24 = s32[] add(%param_0.2, %param_1.4)
}

%region_0.2.clone.clone.clone (arg_tuple.6: (s32[], f32[2,3])) -> (s32[], f32[2,3]) {
  %arg_tuple.6 = (s32[], f32[2,3]{1,0}) parameter(0)
  %constant.15 = s32[] constant(1)
  %get-tuple-element.42 = f32[2,3]{1,0} get-tuple-element(%arg_tuple.6), index=1
  %get-tuple-element.41 = s32[] get-tuple-element(%arg_tuple.6), index=0
  %copy.2 = s32[] copy(%get-tuple-element.41)
  %broadcast_add_fusion = f32[2,3]{1,0} fusion(%copy.2, %get-tuple-element.42), kind=kLoop, calls=%fused_computation
  %wrapped_add = s32[] fusion(%copy.2, %constant.15), kind=kLoop, calls=%wrapped_add_computation
  ROOT %tuple.14 = (s32[], f32[2,3]{1,0}) tuple(%wrapped_add, %broadcast_add_fusion)
}

%wrapped_compare_computation (param_0.3: s32[], param_1.5: s32[]) -> pred[] {
  %param_0.3 = s32[] parameter(0)
  %param_1.5 = s32[] parameter(1)
  ROOT %lt.3 = pred[] compare(%param_0.3, %param_1.5), direction=LT
}

%region_1.3.clone.clone (arg_tuple.5: (s32[], f32[2,3])) -> pred[] {
  %arg_tuple.5 = (s32[], f32[2,3]{1,0}) parameter(0)
  %constant.14 = s32[] constant(4)
  %get-tuple-element.32 = s32[] get-tuple-element(%arg_tuple.5), index=0
  ROOT %wrapped_compare = pred[] fusion(%get-tuple-element.32, %constant.14), kind=kLoop, calls=%wrapped_compare_computation
}

%while.1_computation (tuple.15: (s32[], f32[2,3])) -> (s32[], f32[2,3]) {
  %tuple.15 = (s32[], f32[2,3]{1,0}) parameter(0)
  ROOT %while.2 = (s32[], f32[2,3]{1,0}) while(%tuple.15), condition=%region_1.3.clone.clone, body=%region_0.2.clone.clone.clone, backend_config={"dynamic_variables":[],"known_induction_variable":{"tuple_index":"0"},"known_init_step":{"init":"0","step":"1"},"known_trip_count":{"n":"4"}}
}

ENTRY %main.4 (x.1: f32[2,3]) -> f32[2,3] {
  %x.1 = f32[2,3]{1,0} parameter(0)
  %constant.9 = s32[] constant(0)
  %copy.6 = f32[2,3]{1,0} copy(%x.1)
  %copy.7 = s32[] copy(%constant.9)
  %tuple.12 = (s32[], f32[2,3]{1,0}) tuple(%copy.7, %copy.6)
  %call = (s32[], f32[2,3]{1,0}) call(%tuple.12), to_apply=%while.1_computation, frontend_attributes={xla_cpu_small_call="true"}
  ROOT %while.9 = f32[2,3]{1,0} get-tuple-element(%call), index=1
}
"""


def test_a_while_loop_with_a_constant_trip_count_is_unrolled():
    graph, _ = parse(FORI_LOOP)
    assert [op.op_type for op in graph.ops].count("MUL") == 4  # one body per trip
    x = rand(2, 3)
    want = x.copy()
    for i in range(4):
        want = want * 2 + i
    np.testing.assert_allclose(run_hlo(FORI_LOOP, {"x.1": x})["while.9"], want, rtol=1e-6)


def _loop(start: int, step: int, direction: str, bound: str) -> str:
    """A loop as JAX lowers it before XLA's passes: (i, x, n), x negated while i <direction> n."""
    return f"""HloModule m
body {{
  t = (s32[], f32[4], s32[]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  step = s32[] constant({step})
  next = s32[] add(i, step)
  x = f32[4] get-tuple-element(t), index=1
  y = f32[4] negate(x)
  n = s32[] get-tuple-element(t), index=2
  ROOT r = (s32[], f32[4], s32[]) tuple(next, y, n)
}}
cond {{
  t = (s32[], f32[4], s32[]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  n = s32[] get-tuple-element(t), index=2
  ROOT go = pred[] compare(i, n), direction={direction}
}}
ENTRY e {{
  x = f32[4] parameter(0)
  {bound}
  start = s32[] constant({start})
  init = (s32[], f32[4], s32[]) tuple(start, x, n)
  loop = (s32[], f32[4], s32[]) while(init), condition=cond, body=body
  ROOT y = f32[4] get-tuple-element(loop), index=1
}}
"""


@pytest.mark.parametrize("start, step, direction, bound, trips", [
    (0, 1, "LT", 3, 3),
    (1, 2, "LE", 7, 4),  # 1, 3, 5, 7
    (10, -3, "GT", 0, 4),  # 10, 7, 4, 1
    (5, 1, "LT", 5, 0),  # no trip: the loop's value is its init
])
def test_the_trip_count_follows_the_start_step_and_bound(start, step, direction, bound, trips):
    graph, _ = parse(_loop(start, step, direction, f"n = s32[] constant({bound})"))
    assert [op.op_type for op in graph.ops if op.op_type != "RESHAPE"] == ["NEGATE"] * trips


def test_a_while_loop_whose_trip_count_is_known_at_run_time_is_refused():
    text = _loop(0, 1, "LT", "n = s32[] parameter(1)")
    assert error(text) == ("t.hlo:23: while 'loop': its condition 'cond' is known only at run time: only a loop "
                           "whose trip count is known at compile time is unrolled")


def test_a_while_loop_past_the_trip_bound_is_refused(monkeypatch):
    monkeypatch.setattr(hlo_ops, "MAX_TRIP_COUNT", 3)
    text = _loop(0, 1, "LT", "n = s32[] constant(4)")
    assert error(text) == "t.hlo:23: while 'loop': more than 3 trips, the most a loop is unrolled to"


# ---- conditional -----------------------------------------------------------------------------

CONDITIONAL = """HloModule m
plus_one {
  a = f32[2,3] parameter(0)
  one = f32[] constant(1)
  ones = f32[2,3] broadcast(one), dimensions={}
  ROOT r = f32[2,3] add(a, ones)
}
twice {
  a = f32[2,3] parameter(0)
  two = f32[] constant(2)
  twos = f32[2,3] broadcast(two), dimensions={}
  ROOT r = f32[2,3] multiply(a, twos)
}
negated {
  t = (f32[2,3]) parameter(0)
  a = f32[2,3] get-tuple-element(t), index=0
  n = f32[2,3] negate(a)
  ROOT r = (f32[2,3]) tuple(n)
}
ENTRY e {
  x = f32[2,3] parameter(0)
  y = f32[2,3] parameter(1)
  zero = f32[] constant(0)
  three = f32[] constant(3)
  p = pred[] compare(three, zero), direction=GT
  by_pred = f32[2,3] conditional(p, x, y), true_computation=plus_one, false_computation=twice
  five = s32[] constant(5)
  wrapped = (f32[2,3]) tuple(y)
  by_index = (f32[2,3]) conditional(five, x, y, wrapped), branch_computations={plus_one, twice, negated}
  z = f32[2,3] get-tuple-element(by_index), index=0
  ROOT r = (f32[2,3], f32[2,3]) tuple(by_pred, z)
}
"""


def test_a_conditional_on_a_constant_inlines_the_branch_it_takes():
    graph, _ = parse(CONDITIONAL)
    assert sorted(op.op_type for op in graph.ops) == ["ADD", "NEGATE"]
    x, y = rand(2, 3), rand(2, 3)
    out = run_hlo(CONDITIONAL, {"x": x, "y": y})
    np.testing.assert_allclose(out["r.0"], x + 1, rtol=1e-6)  # 3 > 0: the true branch, on x
    np.testing.assert_array_equal(out["r.1"], -y)  # index 5 of 3 branches: the last, as XLA's


def test_a_conditional_chosen_at_run_time_is_refused():
    text = CONDITIONAL.replace("three = f32[] constant(3)", "three = f32[] parameter(2)")
    assert error(text) == ("t.hlo:26: conditional 'by_pred': the branch is chosen at run time: only a conditional "
                           "on a constant predicate or branch index is inlined")


def test_a_conditional_on_a_float_is_refused():
    text = CONDITIONAL.replace("conditional(p, x, y)", "conditional(three, x, y)")
    assert error(text) == "t.hlo:26: conditional 'by_pred': its predicate or branch index is not a pred or integer scalar"


# ---- custom-call and wrappers ----------------------------------------------------------------


def test_sharding_custom_calls_and_optimization_barriers_are_their_operand():
    # jax.lax.with_sharding_constraint and jax.lax.optimization_barrier as JAX lowers them
    text = """HloModule jit__lambda, entry_computation_layout={(f32[4,8]{1,0})->f32[4,8]{1,0}}
ENTRY main.1 {
  x.1 = f32[4,8]{1,0} parameter(0)
  sharding_constraint.1 = f32[4,8]{1,0} custom-call(x.1), custom_call_target="Sharding", sharding={replicated}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"d\\"}, {}]>]>"}
  optimization_barrier.1 = f32[4,8]{1,0} opt-barrier(sharding_constraint.1)
  ROOT abs.1 = f32[4,8]{1,0} abs(optimization_barrier.1)
}
"""
    graph, _ = parse(text)
    assert [(op.op_type, op.inputs) for op in graph.ops] == [("ABS", ["x.1"])]


def test_an_unknown_custom_call_is_refused_naming_its_target():
    # a LAPACK factorization, as jnp.linalg.cholesky prints on XLA's CPU backend
    text = """HloModule jit__lambda, is_scheduled=true
ENTRY %main.1 (x.1: f32[4,4]) -> f32[4,4] {
  %x.1 = f32[4,4]{1,0} parameter(0)
  %custom-call = (f32[4,4]{1,0}, s32[]) custom-call(%x.1), custom_call_target="lapack_spotrf_ffi"
  ROOT %get-tuple-element = f32[4,4]{1,0} get-tuple-element(%custom-call), index=0
}
"""
    assert error(text) == ("t.hlo:4: custom-call 'custom-call': custom_call_target \"lapack_spotrf_ffi\" is not "
                           "supported (supported: Sharding, TopK)")


# ---- whole programs after XLA's passes -------------------------------------------------------

# jax.jit(lambda x, w1, b1, w2: jax.nn.gelu(x @ w1 + b1) @ w2).lower(...).compile().as_text()
MLP = """HloModule jit_mlp, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0}, f32[8,16]{1,0}, f32[16]{0}, f32[16,4]{1,0})->f32[4,4]{1,0}}, allow_spmd_sharding_propagation_to_parameters={true,true,true,true}, allow_spmd_sharding_propagation_to_output={true}

FileNames
1 "mlp.py"

FunctionNames
1 "<module>"
2 "save"
3 "mlp"

FileLocations
1 {file_name_id=1 function_name_id=1 line=17 end_line=17 column=0 end_column=31}
2 {file_name_id=1 function_name_id=2 line=8 end_line=8 column=9 end_column=32}
3 {file_name_id=1 function_name_id=3 line=16 end_line=16 column=31 end_column=55}
4 {file_name_id=1 function_name_id=3 line=16 end_line=16 column=43 end_column=49}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}
4 {file_location_id=4 parent_frame_id=3}


%fused_computation (param_0: f32[4,16], param_1: f32[16,4]) -> f32[4,4] {
  %param_0 = f32[4,16]{1,0} parameter(0)
  %param_1 = f32[16,4]{1,0} parameter(1)
  ROOT %dot_general.0 = f32[4,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(mlp)/dot_general" stack_frame_id=3}
}

%fused_computation.1 (param_0.1: f32[4,8], param_1.1: f32[8,16]) -> f32[4,16] {
  %param_0.1 = f32[4,8]{1,0} parameter(0)
  %param_1.1 = f32[8,16]{1,0} parameter(1)
  ROOT %dot_general.1 = f32[4,16]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(mlp)/dot_general" stack_frame_id=4}
}

%fused_computation.2 (param_0.3: f32[4,16], param_1.11: f32[16]) -> f32[4,16] {
  %param_0.3 = f32[4,16]{1,0} parameter(0)
  %param_1.11 = f32[16]{0} parameter(1)
  %add.4 = f32[4,16]{1,0} broadcast(%param_1.11), dimensions={1}, metadata={op_name="jit(mlp)/add" stack_frame_id=4}
  %add.3 = f32[4,16]{1,0} add(%param_0.3, %add.4), metadata={op_name="jit(mlp)/add" stack_frame_id=4}
  %integer_pow.1 = f32[4,16]{1,0} multiply(%add.3, %add.3), metadata={op_name="jit(mlp)/integer_pow" stack_frame_id=3}
  %integer_pow.0 = f32[4,16]{1,0} multiply(%integer_pow.1, %add.3), metadata={op_name="jit(mlp)/integer_pow" stack_frame_id=3}
  %constant.3 = f32[] constant(0.044715)
  %mul.6 = f32[4,16]{1,0} broadcast(%constant.3), dimensions={}, metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  %mul.5 = f32[4,16]{1,0} multiply(%integer_pow.0, %mul.6), metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  %add.2 = f32[4,16]{1,0} add(%add.3, %mul.5), metadata={op_name="jit(mlp)/add" stack_frame_id=3}
  %constant.2 = f32[] constant(0.797884583)
  %mul.4 = f32[4,16]{1,0} broadcast(%constant.2), dimensions={}, metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  %mul.3 = f32[4,16]{1,0} multiply(%add.2, %mul.4), metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  %tanh.0 = f32[4,16]{1,0} tanh(%mul.3), metadata={op_name="jit(mlp)/tanh" stack_frame_id=3}
  %constant.1 = f32[] constant(1)
  %add.1 = f32[4,16]{1,0} broadcast(%constant.1), dimensions={}, metadata={op_name="jit(mlp)/add" stack_frame_id=3}
  %add.0 = f32[4,16]{1,0} add(%tanh.0, %add.1), metadata={op_name="jit(mlp)/add" stack_frame_id=3}
  %constant.0 = f32[] constant(0.5)
  %mul.2 = f32[4,16]{1,0} broadcast(%constant.0), dimensions={}, metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  %mul.1 = f32[4,16]{1,0} multiply(%add.0, %mul.2), metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  ROOT %mul.0 = f32[4,16]{1,0} multiply(%add.3, %mul.1), metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
}

ENTRY %main.1 (x.1: f32[4,8], w1.1: f32[8,16], b1.1: f32[16], w2.1: f32[16,4]) -> f32[4,4] {
  %x.1 = f32[4,8]{1,0} parameter(0), metadata={op_name="x"}
  %w1.1 = f32[8,16]{1,0} parameter(1), metadata={op_name="w1"}
  %b1.1 = f32[16]{0} parameter(2), metadata={op_name="b1"}
  %w2.1 = f32[16,4]{1,0} parameter(3), metadata={op_name="w2"}
  %ynn_fusion.1 = f32[4,16]{1,0} fusion(%x.1, %w1.1), kind=kCustom, calls=%fused_computation.1, metadata={op_name="jit(mlp)/dot_general" stack_frame_id=4}, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
  %multiply_multiply_fusion = f32[4,16]{1,0} fusion(%ynn_fusion.1, %b1.1), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(mlp)/mul" stack_frame_id=3}
  ROOT %ynn_fusion = f32[4,4]{1,0} fusion(%multiply_multiply_fusion, %w2.1), kind=kCustom, calls=%fused_computation, metadata={op_name="jit(mlp)/dot_general" stack_frame_id=3}, backend_config={"fusion_config":{"kind":"__ynn_fusion"},"outer_dimension_partitions":[]}
}
"""


def test_a_post_optimization_mlp_from_jax_matches_numpy():
    x, w1, b1, w2 = rand(4, 8), rand(8, 16), rand(16), rand(16, 4)
    out = run_hlo(MLP, {"x.1": x, "w1.1": w1, "b1.1": b1, "w2.1": w2})
    h = x.astype(np.float64) @ w1 + b1
    gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
    want = gelu @ w2
    np.testing.assert_allclose(out["ynn_fusion"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# the same programs' post-optimization modules (metadata and debug tables trimmed)
SOFTMAX = """HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0})->f32[4,8]{1,0}}, allow_spmd_sharding_propagation_to_parameters={true}, allow_spmd_sharding_propagation_to_output={true}

%fused_computation (param_0: f32[4,8], param_1.1: f32[4]) -> f32[4,8] {
  %param_0 = f32[4,8]{1,0} parameter(0)
  %param_1.1 = f32[4]{0} parameter(1)
  %broadcast.4 = f32[4,8]{1,0} broadcast(%param_1.1), dimensions={0}
  ROOT %multiply.1 = f32[4,8]{1,0} multiply(%param_0, %broadcast.4)
}

%region_1.2 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {
  %reduce_sum.3 = f32[] parameter(0)
  %reduce_sum.4 = f32[] parameter(1)
  ROOT %reduce_sum.5 = f32[] add(%reduce_sum.3, %reduce_sum.4)
}

%fused_computation.1 (param_0.2: f32[4,8]) -> f32[4] {
  %constant.2 = f32[] constant(1)
  %broadcast.5 = f32[4]{0} broadcast(%constant.2), dimensions={}
  %param_0.2 = f32[4,8]{1,0} parameter(0)
  %constant.1 = f32[] constant(0)
  %reduce_sum.0 = f32[4]{0} reduce(%param_0.2, %constant.1), dimensions={1}, to_apply=%region_1.2
  ROOT %divide.1 = f32[4]{0} divide(%broadcast.5, %reduce_sum.0)
}

%fused_computation.2 (param_0.4: f32[4,8], param_1.6: f32[4]) -> f32[4,8] {
  %param_0.4 = f32[4,8]{1,0} parameter(0)
  %param_1.6 = f32[4]{0} parameter(1)
  %sub.1 = f32[4,8]{1,0} broadcast(%param_1.6), dimensions={0}
  %sub.0 = f32[4,8]{1,0} subtract(%param_0.4, %sub.1)
  ROOT %exp.0 = f32[4,8]{1,0} exponential(%sub.0)
}

%region_0.1 (reduce_max.3: f32[], reduce_max.4: f32[]) -> f32[] {
  %reduce_max.3 = f32[] parameter(0)
  %reduce_max.4 = f32[] parameter(1)
  ROOT %reduce_max.5 = f32[] maximum(%reduce_max.3, %reduce_max.4)
}

%wrapped_reduce_computation (param_0.5: f32[4,8], param_1.7: f32[]) -> f32[4] {
  %param_0.5 = f32[4,8]{1,0} parameter(0)
  %param_1.7 = f32[] parameter(1)
  ROOT %reduce_max.0 = f32[4]{0} reduce(%param_0.5, %param_1.7), dimensions={1}, to_apply=%region_0.1
}

ENTRY %main.3 (x.1: f32[4,8]) -> f32[4,8] {
  %x.1 = f32[4,8]{1,0} parameter(0)
  %constant.5 = f32[] constant(-inf)
  %wrapped_reduce = f32[4]{0} fusion(%x.1, %constant.5), kind=kLoop, calls=%wrapped_reduce_computation
  %subtract_exponential_fusion = f32[4,8]{1,0} fusion(%x.1, %wrapped_reduce), kind=kLoop, calls=%fused_computation.2
  %reduce_divide_fusion = f32[4]{0} fusion(%subtract_exponential_fusion), kind=kLoop, calls=%fused_computation.1
  ROOT %broadcast_multiply_fusion = f32[4,8]{1,0} fusion(%subtract_exponential_fusion, %reduce_divide_fusion), kind=kLoop, calls=%fused_computation
}
"""

# (x - mean) * rsqrt(var + 1e-5) * g + b over the last dim
LAYER_NORM = """HloModule jit_ln, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0}, f32[8]{0}, f32[8]{0})->f32[4,8]{1,0}}, allow_spmd_sharding_propagation_to_parameters={true,true,true}, allow_spmd_sharding_propagation_to_output={true}

%fused_computation (param_0.1: f32[8], param_1.3: f32[8], param_2.3: f32[4], param_3.2: f32[4,8], param_4.2: f32[4]) -> f32[4,8] {
  %param_3.2 = f32[4,8]{1,0} parameter(3)
  %param_4.2 = f32[4]{0} parameter(4)
  %constant.2 = f32[] constant(0.125)
  %broadcast.15 = f32[4]{0} broadcast(%constant.2), dimensions={}
  %multiply.4 = f32[4]{0} multiply(%param_4.2, %broadcast.15)
  %sub.1 = f32[4,8]{1,0} broadcast(%multiply.4), dimensions={0}
  %sub.0 = f32[4,8]{1,0} subtract(%param_3.2, %sub.1)
  %param_2.3 = f32[4]{0} parameter(2)
  %mul.3 = f32[4,8]{1,0} broadcast(%param_2.3), dimensions={0}
  %mul.2 = f32[4,8]{1,0} multiply(%sub.0, %mul.3)
  %param_1.3 = f32[8]{0} parameter(1)
  %mul.1 = f32[4,8]{1,0} broadcast(%param_1.3), dimensions={1}
  %mul.0 = f32[4,8]{1,0} multiply(%mul.2, %mul.1)
  %param_0.1 = f32[8]{0} parameter(0)
  %add.2 = f32[4,8]{1,0} broadcast(%param_0.1), dimensions={1}
  ROOT %add.1 = f32[4,8]{1,0} add(%mul.0, %add.2)
}

%region_1.2 (reduce_sum.10: f32[], reduce_sum.11: f32[]) -> f32[] {
  %reduce_sum.10 = f32[] parameter(0)
  %reduce_sum.11 = f32[] parameter(1)
  ROOT %reduce_sum.12 = f32[] add(%reduce_sum.10, %reduce_sum.11)
}

%fused_computation.1 (param_0.7: f32[4,8], param_1.10: f32[4]) -> f32[4] {
  %param_0.7 = f32[4,8]{1,0} parameter(0)
  %param_1.10 = f32[4]{0} parameter(1)
  %constant.7 = f32[] constant(0.125)
  %broadcast.17 = f32[4]{0} broadcast(%constant.7), dimensions={}
  %multiply.6 = f32[4]{0} multiply(%param_1.10, %broadcast.17)
  %sub.3 = f32[4,8]{1,0} broadcast(%multiply.6), dimensions={0}
  %sub.2 = f32[4,8]{1,0} subtract(%param_0.7, %sub.3)
  %integer_pow.0 = f32[4,8]{1,0} multiply(%sub.2, %sub.2)
  %constant.8 = f32[] constant(0)
  %reduce_sum.0 = f32[4]{0} reduce(%integer_pow.0, %constant.8), dimensions={1}, to_apply=%region_1.2
  %multiply.5 = f32[4]{0} multiply(%reduce_sum.0, %broadcast.17)
  %constant.6 = f32[] constant(1e-05)
  %broadcast.16 = f32[4]{0} broadcast(%constant.6), dimensions={}
  %add.3 = f32[4]{0} add(%multiply.5, %broadcast.16)
  ROOT %rsqrt.2 = f32[4]{0} rsqrt(%add.3)
}

%region_0.1 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {
  %reduce_sum.3 = f32[] parameter(0)
  %reduce_sum.4 = f32[] parameter(1)
  ROOT %reduce_sum.5 = f32[] add(%reduce_sum.3, %reduce_sum.4)
}

%wrapped_reduce_computation (param_0.8: f32[4,8], param_1.11: f32[]) -> f32[4] {
  %param_0.8 = f32[4,8]{1,0} parameter(0)
  %param_1.11 = f32[] parameter(1)
  ROOT %reduce_sum.1 = f32[4]{0} reduce(%param_0.8, %param_1.11), dimensions={1}, to_apply=%region_0.1
}

ENTRY %main.3 (x.1: f32[4,8], g.1: f32[8], b.1: f32[8]) -> f32[4,8] {
  %x.1 = f32[4,8]{1,0} parameter(0)
  %g.1 = f32[8]{0} parameter(1)
  %b.1 = f32[8]{0} parameter(2)
  %constant.5 = f32[] constant(0)
  %wrapped_reduce = f32[4]{0} fusion(%x.1, %constant.5), kind=kLoop, calls=%wrapped_reduce_computation
  %add_rsqrt_fusion = f32[4]{0} fusion(%x.1, %wrapped_reduce), kind=kLoop, calls=%fused_computation.1
  ROOT %broadcast_add_fusion = f32[4,8]{1,0} fusion(%b.1, %g.1, %add_rsqrt_fusion, %x.1, %wrapped_reduce), kind=kLoop, calls=%fused_computation
}
"""

# x.sum(0) + x.max(1).sum()
REDUCE = """HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0})->f32[8]{0}}, allow_spmd_sharding_propagation_to_parameters={true}, allow_spmd_sharding_propagation_to_output={true}

%region_0.1 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {
  %reduce_sum.3 = f32[] parameter(0)
  %reduce_sum.4 = f32[] parameter(1)
  ROOT %reduce_sum.5 = f32[] add(%reduce_sum.3, %reduce_sum.4)
}

%fused_computation (param_0.1: f32[], param_1.2: f32[4,8]) -> f32[8] {
  %param_1.2 = f32[4,8]{1,0} parameter(1)
  %constant.0 = f32[] constant(0)
  %reduce_sum.0 = f32[8]{0} reduce(%param_1.2, %constant.0), dimensions={0}, to_apply=%region_0.1
  %param_0.1 = f32[] parameter(0)
  %add.1 = f32[8]{0} broadcast(%param_0.1), dimensions={}
  ROOT %add.0 = f32[8]{0} add(%reduce_sum.0, %add.1)
}

%region_2.3 (reduce_sum.10: f32[], reduce_sum.11: f32[]) -> f32[] {
  %reduce_sum.10 = f32[] parameter(0)
  %reduce_sum.11 = f32[] parameter(1)
  ROOT %reduce_sum.12 = f32[] add(%reduce_sum.10, %reduce_sum.11)
}

%region_1.2 (reduce_max.3: f32[], reduce_max.4: f32[]) -> f32[] {
  %reduce_max.3 = f32[] parameter(0)
  %reduce_max.4 = f32[] parameter(1)
  ROOT %reduce_max.5 = f32[] maximum(%reduce_max.3, %reduce_max.4)
}

%fused_computation.1 (param_0.4: f32[4,8]) -> f32[] {
  %param_0.4 = f32[4,8]{1,0} parameter(0)
  %constant.1 = f32[] constant(-inf)
  %reduce_max.0 = f32[4]{0} reduce(%param_0.4, %constant.1), dimensions={1}, to_apply=%region_1.2
  %constant.4 = f32[] constant(0)
  ROOT %reduce_sum.1 = f32[] reduce(%reduce_max.0, %constant.4), dimensions={0}, to_apply=%region_2.3
}

ENTRY %main.4 (x.1: f32[4,8]) -> f32[8] {
  %x.1 = f32[4,8]{1,0} parameter(0)
  %reduce_reduce_fusion = f32[] fusion(%x.1), kind=kLoop, calls=%fused_computation.1
  ROOT %broadcast_add_fusion = f32[8]{0} fusion(%reduce_reduce_fusion, %x.1), kind=kLoop, calls=%fused_computation
}
"""

# lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
CONV = """HloModule jit__lambda, is_scheduled=true, entry_computation_layout={(f32[1,8,8,3]{3,2,1,0}, f32[3,3,3,4]{3,2,1,0})->f32[1,8,8,4]{3,2,1,0}}, allow_spmd_sharding_propagation_to_parameters={true,true}, allow_spmd_sharding_propagation_to_output={true}

ENTRY %main.1 (x.1: f32[1,8,8,3], w.1: f32[3,3,3,4]) -> f32[1,8,8,4] {
  %x.1 = f32[1,8,8,3]{3,2,1,0} parameter(0)
  %w.1 = f32[3,3,3,4]{3,2,1,0} parameter(1)
  ROOT %conv_general_dilated.1 = f32[1,8,8,4]{3,2,1,0} convolution(%x.1, %w.1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, g, b):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b


def _conv_same(x, w):
    padded = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    return sum(padded[:, i:i + x.shape[1], j:j + x.shape[2], :] @ w[i, j] for i in range(3) for j in range(3))


@pytest.mark.parametrize("text, shapes, reference", [
    (SOFTMAX, {"x.1": (4, 8)}, _softmax),
    (LAYER_NORM, {"x.1": (4, 8), "g.1": (8,), "b.1": (8,)}, _layer_norm),
    (REDUCE, {"x.1": (4, 8)}, lambda x: x.sum(0) + x.max(1).sum()),
    (CONV, {"x.1": (1, 8, 8, 3), "w.1": (3, 3, 3, 4)}, _conv_same),
], ids=["softmax", "layer_norm", "reduce", "conv"])
def test_post_optimization_modules_of_small_programs_match_numpy(text, shapes, reference):
    feeds = {name: rand(*shape) for name, shape in shapes.items()}
    [got] = run_hlo(text, feeds).values()
    want = reference(*(v.astype(np.float64) for v in feeds.values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
