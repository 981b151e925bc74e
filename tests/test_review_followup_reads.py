"""The shared file reader, reading a slice and refusing links: an ONNX initializer whose external
data names the model's folder (or another folder) is refused in one line, not a traceback; the
binding cache reads an entry without following a link and checks its names on the file it read."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import CONFIGS, assert_one_line_error, gemm_dfg, run_cli
from dfx import read, write
from dfx.input_files import InputFileError, read_input_file, read_input_slice
from hardware import load_machine
from kernel_compiler import compile_graph, load_graph, load_target
from kernel_compiler.errors import CompileError
from loader import bind_greedy, bind_program
from loader.cache import EntryError, bind_cached, cache_key, load

MINIMAL = CONFIGS / "minimal.json"


# ---- the reader: a slice, and links refused where asked ----------------------------------------


def test_a_slice_is_exactly_its_bytes_and_a_short_file_is_refused(tmp_path):
    f = tmp_path / "d.bin"
    f.write_bytes(bytes(range(16)))
    assert read_input_slice(f, "data", 4, 8) == bytes(range(4, 12))
    with pytest.raises(InputFileError) as info:
        read_input_slice(f, "data", 12, 8)
    assert str(info.value) == f"{f}: its 16 bytes end before the 8 its data takes from offset 12"


@pytest.mark.parametrize("read_it", [lambda p: read_input_file(p, "file", 1024),
                                     lambda p: read_input_slice(p, "data", 0, 1)])
def test_a_folder_is_refused_by_both_reads_before_it_is_opened_as_a_file(tmp_path, read_it):
    with pytest.raises(InputFileError) as info:
        read_it(tmp_path)
    assert info.value.kind == "folder" and str(info.value) == f"{tmp_path}: cannot read: a folder, not a regular file"


def test_without_following_links_a_symlink_is_refused_but_its_target_read(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"entry")
    (tmp_path / "link").symlink_to(target)
    assert read_input_file(tmp_path / "link", "file", 1024) == b"entry"  # followed by default
    with pytest.raises(InputFileError) as info:
        read_input_file(tmp_path / "link", "file", 1024, follow_links=False)
    assert info.value.kind == "link" and str(info.value) == f"{tmp_path / 'link'}: cannot read: a link, not followed"
    assert read_input_file(target, "file", 1024, follow_links=False) == b"entry"


def test_without_following_links_a_hard_linked_file_is_refused(tmp_path):
    first = tmp_path / "first"
    first.write_bytes(b"entry")
    os.link(first, tmp_path / "second")
    for path in (first, tmp_path / "second"):
        with pytest.raises(InputFileError) as info:
            read_input_slice(path, "data", 0, 1, follow_links=False)
        assert info.value.kind == "hard link"
        assert str(info.value) == f"{path}: cannot read: the file has other names (hard links)"
    (tmp_path / "second").unlink()
    assert read_input_file(first, "file", 1024, follow_links=False) == b"entry"


# ---- ONNX: external data naming a folder -------------------------------------------------------


def _model_with_external(folder: Path, location: str) -> str:
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    w.external_data.add(key="location", value=location)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [onnx.ValueInfoProto(name="y")], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return str(path)


@pytest.mark.parametrize("location", ["", ".", "sub"])
def test_external_data_naming_a_folder_is_refused_in_one_line(tmp_path, location):
    (tmp_path / "sub").mkdir()
    path = _model_with_external(tmp_path, location)
    with pytest.raises(CompileError) as info:
        load_graph(path)
    assert str(info.value) == f"{path}: tensor 'w': external data file '{location}' not found in {tmp_path}"


def test_cli_refuses_external_data_naming_the_models_folder_in_one_line(tmp_path):
    path = _model_with_external(tmp_path, ".")
    proc = run_cli("compiler", path, "-o", tmp_path / "m.kpu")
    assert_one_line_error(proc, path, "tensor 'w'", "not found in")
    assert not (tmp_path / "m.kpu").exists()


# ---- the binding cache: an entry swapped for a link is a miss ----------------------------------


@pytest.fixture
def gemm(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KPU_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "g.dfg").write_text(gemm_dfg(16, 24, 8))
    graph, _ = load_graph(str(tmp_path / "g.dfg"))
    write(compile_graph(graph, "g.dfg", load_target("minimal")), tmp_path / "g.kpu")
    return tmp_path / "g.kpu"


def test_an_entry_swapped_for_a_link_to_a_valid_entry_in_the_cache_is_a_miss(gemm):
    program, machine = read(gemm), load_machine(MINIMAL)

    def cached():
        return bind_cached(program, machine, str(gemm), None, "greedy",
                           lambda: bind_program(program, machine, str(gemm), bind_greedy))

    _, first = cached()
    valid = first.path.with_name("valid.json")
    first.path.rename(valid)  # a valid entry under another name in the cache, which a followed link would hit
    first.path.symlink_to(valid.name)
    key = cache_key(str(gemm), machine, None, "greedy")
    with pytest.raises(EntryError, match="^the entry is a link, not followed$"):
        load(first.path, key, program, machine)
    assert load(valid, key, program, machine)  # what the link names is itself a hit
    _, use = cached()
    assert (use.state, use.reason) == ("miss", "the entry is a link, not followed")
    assert not first.path.is_symlink() and cached()[1].state == "hit"
