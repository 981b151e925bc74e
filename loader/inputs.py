"""Input tensors: from `--input NAME=FILE.npy`, from constants the object carries, or from a
seeded generator (each tensor seeded by its own name, so adding one changes no other)."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from dfx import Program, Tensor, is_integer, numpy_dtype


class InputError(ValueError):
    """A bad `--input`; str(e) is one line naming the file and the reason."""


def generated(t: Tensor, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    if is_integer(t.dtype):
        return rng.integers(-8, 8, size=t.shape).astype(numpy_dtype(t.dtype))
    return rng.uniform(-1.0, 1.0, size=t.shape).astype(numpy_dtype(t.dtype))


def read_input(spec: str, program: Program) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise InputError(f"--input {spec}: expected NAME=FILE.npy")
    t = program.graph.tensors.get(name)
    if t is None or t.role not in ("input", "constant"):
        known = ", ".join(x.name for x in program.graph.inputs)
        raise InputError(f"{path}: '{name}' is not an input of the program (inputs: {known})")
    try:
        array = np.load(Path(path), allow_pickle=False)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"{path}: not a .npy array: {str(e).splitlines()[0]}") from None
    if tuple(array.shape) != t.shape:
        raise InputError(f"{path}: input '{name}' has shape {list(array.shape)}, the program expects {list(t.shape)}")
    want = numpy_dtype(t.dtype)
    if array.dtype.kind == "V" and array.dtype.itemsize == want.itemsize:
        # .npy stores ml_dtypes types (bf16, f8) as raw void bytes: reinterpret them
        array = array.view(want)
    if array.dtype.kind not in "fiub" and array.dtype != want:
        raise InputError(f"{path}: input '{name}' has dtype {array.dtype}, the program expects {t.dtype}")
    return name, array.astype(want)


def program_inputs(program: Program, given: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    g = program.graph
    values: dict[str, np.ndarray] = {}
    for t in g.inputs:
        if t.name in given:
            values[t.name] = given[t.name]
        elif t.name in g.constants:
            values[t.name] = np.frombuffer(g.constants[t.name], numpy_dtype(t.dtype)).reshape(t.shape)
        else:
            values[t.name] = generated(t, seed)
    return values
