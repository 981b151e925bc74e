"""`--input` arrays of the wrong kind are refused with one line, never reinterpreted or widened
into garbage, and `--check` treats NaN and inf as assert_allclose(equal_nan=True) does."""

from __future__ import annotations

import dataclasses
import tracemalloc
import warnings

import ml_dtypes
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib import format as npy_format

from conftest import assert_one_line_error, examples, gemm_dfg, run_cli
from dfx import numpy_dtype, write
from kernel_compiler import compile_graph, load_graph, load_target
from loader.execution import reference_op
from loader.inputs import InputError, read_input
from loader.run import check_outputs

LARGEST = float(np.finfo(np.float64).max)


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    """dtype -> a compiled 16x16x16 GEMM program (A, B inputs, C output) of that dtype."""
    d = tmp_path_factory.mktemp("gemm")
    target = load_target("standard")
    programs = {}

    def program(dtype: str):
        if dtype not in programs:
            src = d / f"g_{dtype}.dfg"
            src.write_text(gemm_dfg(16, 16, 16, dtype))
            graph, _ = load_graph(str(src))
            programs[dtype] = compile_graph(graph, src.name, target)
        return programs[dtype]

    return program


def refused(path, program, *fragments: str) -> None:
    """read_input refuses `path` for tensor A with one line naming the file and each fragment."""
    with pytest.raises(InputError) as e:
        read_input(f"A={path}", program)
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    for f in fragments:
        assert f in message, (f, message)


def header_only(path, shape):
    """A .npy file that is nothing but a header claiming `shape` of f64."""
    with open(path, "wb") as f:
        npy_format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return path

def npy_with_header(path, header: bytes):
    """A version 1.0 .npy file with this header text and 16x16 f32 zeros of data."""
    header = header.ljust(118) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(1024))
    return path


# ---- the cases from the issue ------------------------------------------------------------


def test_bf16_for_f16_is_refused_not_reinterpreted(gemm, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((16, 16), ml_dtypes.bfloat16))  # read bit for bit: 1.875
    refused(tmp_path / "a.npy", gemm("f16"), "dtype |V2", "bf16", "expects f16")


def test_f8_for_i8_is_refused(gemm, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((16, 16), ml_dtypes.float8_e4m3fn))
    refused(tmp_path / "a.npy", gemm("i8"), "dtype |V1", "f8", "expects i8")


def test_f64_value_that_f32_cannot_hold_is_refused(gemm, tmp_path):
    a = np.ones((16, 16))
    a[3, 4] = 1e300  # becomes inf in f32
    np.save(tmp_path / "a.npy", a)
    refused(tmp_path / "a.npy", gemm("f32"), "float64", "expects f32", "1e+300 at [3, 4]")


def test_empty_file(gemm, tmp_path):
    (tmp_path / "a.npy").write_bytes(b"")
    refused(tmp_path / "a.npy", gemm("f32"), "not a .npy array", "empty")


@pytest.mark.parametrize("keep, reason", [(7, "magic string"), (12, "array header"), (-5, "bytes of data")])
def test_truncated_file(gemm, tmp_path, keep, reason):
    np.save(tmp_path / "whole.npy", np.ones((16, 16), np.float32))
    (tmp_path / "a.npy").write_bytes((tmp_path / "whole.npy").read_bytes()[:keep])
    refused(tmp_path / "a.npy", gemm("f32"), reason)


def test_header_claiming_23_tib_allocates_nothing(gemm, tmp_path):
    shape = (23 * 2**17, 2**20)  # f64: 23 TiB
    program = gemm("f32")
    # a tensor of that shape, so the header passes the shape and dtype checks and only its size fails
    big = dataclasses.replace(program.graph.tensors["A"], shape=shape, dtype="f64")
    program = dataclasses.replace(program, graph=dataclasses.replace(
        program.graph, tensors={**program.graph.tensors, "A": big}))
    header_only(tmp_path / "a.npy", shape)
    tracemalloc.start()
    try:
        refused(tmp_path / "a.npy", program, f"promises {23 * 2**40:,} bytes of data", "holds 0")
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    # the program's own 16x16 tensor: refused on the shape, before any data
    refused(tmp_path / "a.npy", gemm("f32"), f"shape {list(shape)}", "expects [16, 16]")


# ---- what is accepted, what else is refused ----------------------------------------------


@pytest.mark.parametrize("dtype, saved", [
    ("bf16", np.array([1.0, -2.5, np.nan, np.inf], ml_dtypes.bfloat16)),  # |V2, the only 2-byte ml_dtype
    ("f8", np.array([1.0, -0.375, 448.0, np.nan], ml_dtypes.float8_e4m3fn)),  # |V1, taken as e4m3fn
    ("f8", np.array([1.0, -0.375, 448.0, np.nan], np.float32)),  # f8 values widened, as outputs are written
    ("f16", np.array([1.0, 0.5, -np.inf, np.nan], np.float64)),
    ("f32", np.array([1.0, 2.0, 3.0, 4.0], ">f4")),
    ("i8", np.array([-128, 0, 5, 127], np.int64)),
    ("i8", np.array([-3.0, -0.0, 5.0, 127.0], np.float32)),
])
def test_exact_conversions_are_accepted(gemm, tmp_path, dtype, saved):
    program = gemm(dtype)
    values = np.resize(saved, (16, 16))
    np.save(tmp_path / "a.npy", np.asfortranarray(values))
    name, array = read_input(f"A={tmp_path / 'a.npy'}", program)
    assert name == "A" and array.dtype == numpy_dtype(dtype)
    np.testing.assert_array_equal(array.astype(np.float64), values.astype(np.float64))
    assert array.flags.writeable


@pytest.mark.parametrize("dtype, saved, fragment", [
    ("f16", np.full((16, 16), 1.0001, np.float32), "1.000100016593933 at [0, 0]"),
    ("i8", np.full((16, 16), 1.5), "1.5 at [0, 0]"),
    ("i8", np.full((16, 16), 300, np.int16), "300 at [0, 0]"),
    ("i8", np.full((16, 16), np.nan, np.float32), "nan at [0, 0]"),
    ("f8", np.full((16, 16), np.inf, np.float32), "inf at [0, 0]"),  # e4m3fn has no inf
    ("f32", np.ones((16, 16), np.complex64), "dtype complex64"),
    ("f32", np.ones((16, 16), "U1"), "dtype <U1"),
    ("f32", np.ones((16, 16), [("x", "<f4")]), "dtype [('x', '<f4')]"),
    ("f32", np.ones((16, 16), "V4"), "dtype |V4,"),
    ("f32", np.ones((16, 16), object), "dtype object"),  # a pickle: refused before any unpickling
])
def test_inexact_or_unsupported_dtypes_are_refused(gemm, tmp_path, dtype, saved, fragment):
    np.save(tmp_path / "a.npy", saved, allow_pickle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refusal prints nothing but its line
        refused(tmp_path / "a.npy", gemm(dtype), fragment, f"expects {dtype}")


@pytest.mark.parametrize("header", [
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (16, 16), \xe6",  # numpy: TokenError
    b"{'descr': '<f4',b'fortran_order': False, 'shape': (16, 16), }",  # numpy: TypeError
    b"{'descr': '<,4', 'fortran_order': False, 'shape': (16, 16), }",  # numpy: SyntaxError
    b"{'descr': '<a4', 'fortran_order': False, 'shape': (16, 16), }",  # numpy: DeprecationWarning
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (16, 16), 'x': 1}",
])
def test_malformed_headers_are_one_line(gemm, tmp_path, header):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused(npy_with_header(tmp_path / "a.npy", header), gemm("f32"))


def test_python2_header_is_read_without_a_warning(gemm, tmp_path):
    path = npy_with_header(tmp_path / "a.npy", b"{'descr': '<f4', 'fortran_order': False, 'shape': (16L, 16L), }")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, array = read_input(f"A={path}", gemm("f32"))
    assert array.shape == (16, 16) and not array.any()


def test_unknown_format_version(gemm, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((16, 16), np.float32))
    raw = bytearray((tmp_path / "a.npy").read_bytes())
    raw[6] = 3
    (tmp_path / "a.npy").write_bytes(bytes(raw))
    refused(tmp_path / "a.npy", gemm("f32"), "format version 3.0")


@settings(max_examples=examples(200))
@given(data=st.data())
def test_mutated_npy_files_read_or_refuse(gemm, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("m") / "a.npy"
    np.save(path, np.ones((16, 16), np.float32))
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, 140))] = data.draw(st.integers(0, 255))
    path.write_bytes(bytes(raw[:data.draw(st.integers(0, len(raw)))]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            _, array = read_input(f"A={path}", gemm("f32"))
        except InputError as e:
            assert "\n" not in str(e)
        else:
            assert array.shape == (16, 16) and array.dtype == np.float32


def test_loader_cli_refuses_empty_and_bf16_files(gemm, tmp_path):
    obj = tmp_path / "g.kpu"
    write(gemm("f16"), obj)
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "bf16.npy", np.ones((16, 16), ml_dtypes.bfloat16))
    for npy, reason in (("empty.npy", "the file is empty"), ("bf16.npy", "expects f16")):
        proc = run_cli("loader", obj, "--config", "standard", "--check", "--input", f"A={tmp_path / npy}")
        assert_one_line_error(proc, npy, reason)


# ---- --check with NaN and inf ------------------------------------------------------------


@pytest.fixture
def nonfinite(gemm):
    """The reference C of an f32 GEMM whose A has a NaN (row 0 of C is NaN), an inf (row 1 is
    +inf) and a row of zeros (row 4 is 0), and a function running check_outputs on a C."""
    program = gemm("f32")
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (16, 16)).astype(np.float32)
    b = rng.uniform(0.5, 1, (16, 16)).astype(np.float32)  # positive: inf * b stays +inf
    a[0, 3], a[1, 5] = np.nan, np.inf
    a[4] = 0.0  # row 4 of C is exactly 0
    values = {"A": a, "B": b}
    values["C"] = reference_op(program.graph.ops[0], values, program.graph)[0]
    assert np.isnan(values["C"][0]).all() and (values["C"][1] == np.inf).all()

    def check(c):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no RuntimeWarning may reach the user
            return check_outputs(program, {**values, "C": c})["C"]

    return values["C"], check


def test_nan_and_inf_where_the_reference_has_them_agree(nonfinite):
    c, check = nonfinite
    result = check(c.copy())
    assert result.passed and result.max_abs_error == 0.0 and result.max_rel_error == 0.0
    near = c.copy()
    near[5, 5] += 1e-6  # finite elements are still compared
    result = check(near)
    assert result.passed and 0 < result.max_abs_error < 1e-5


@pytest.mark.parametrize("where, value", [((2, 2), np.nan), ((2, 2), np.inf), ((1, 0), -np.inf),
                                          ((1, 0), np.nan), ((0, 0), np.inf)])
def test_non_finite_disagreement_fails_with_the_largest_finite_error(nonfinite, where, value):
    c, check = nonfinite
    c = c.copy()
    c[where] = value
    result = check(c)
    assert not result.passed
    assert result.max_abs_error == result.max_rel_error == LARGEST
    # JSON holds numbers, never null (orjson writes NaN and inf as null)
    assert orjson.loads(orjson.dumps(dataclasses.asdict(result)))["max_abs_error"] == LARGEST


def test_relative_error_overflow_saturates(nonfinite):
    c, check = nonfinite
    c = c.copy()
    c[4, 4] = 100.0  # against a reference of exactly 0: 100 / tiny overflows float64
    result = check(c)
    assert not result.passed and result.max_abs_error == 100.0 and result.max_rel_error == LARGEST
