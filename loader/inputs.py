"""Input tensors: from `--input NAME=FILE.npy`, from constants the object carries, or from a
seeded generator (each tensor seeded by its own name, so adding one changes no other).

An `--input` array must have its tensor's shape and dtype, except for two conversions that
cannot change a value:

- Another numeric dtype (bool, signed or unsigned integer, float, either byte order) is
  converted when every value survives the round trip to the tensor's dtype and back unchanged,
  NaN staying NaN. f32 ones feed an f16 tensor and f32 holding f8 values (as the loader writes
  f8 outputs) feed an f8 tensor; 1e300 in f64 is refused for f32 (it would become inf), as are
  1.5 for i8, 300 for u8 and inf for f8 (which has no inf).
- Raw void bytes, which is how np.save stores ml_dtypes arrays (bf16 as `|V2`, f8 as `|V1`),
  are taken as the tensor's own type only when that type is the ml_dtypes type of that size:
  `|V2` for a bf16 tensor, `|V1` for an f8 tensor. The file does not say which type wrote the
  bytes. bf16 is ml_dtypes' only 2-byte type, so `|V2` is unambiguous; `|V1` is read as f8
  (float8_e4m3fn), and bytes of another 1-byte ml_dtypes type (float8_e4m3fnuz, int4, ...)
  cannot be told apart: save those widened to f32, where the rule above applies. Raw bytes for
  any other tensor (a bf16 file for an f16 tensor, f8 for i8) are refused, since reading them
  bit for bit turns bf16 1.0 into f16 1.875.

Everything else is refused: object arrays and pickles, structured, string, complex and date
types. The file must be a regular file no larger than its tensor's elements at the widest
dtype accepted plus a header, checked before it is read (a FIFO or a link to /dev/zero would
never end); its header is checked against the tensor before its data is used, and it must hold
exactly the bytes its header promises, so a damaged header cannot make the loader allocate more
than the file holds. A tensor given twice is refused: which one was meant?
"""

from __future__ import annotations

import io
import math
import warnings
import zlib

import numpy as np
from numpy.lib import format as npy_format

from dfx import InputFileError, Program, Tensor, is_integer, numpy_dtype, read_input_file
from dfx.dtypes import NUMPY_DTYPES

from .schedule import index_sizes

# magic string, version, header length field and numpy's largest accepted header (max_header_size)
_HEAD_BYTES = 6 + 2 + 4 + 10_000
# the widest numeric dtype a file may hold for conversion (long double)
_WIDEST_ITEM = max(np.dtype(np.longdouble).itemsize, 8)


class InputError(ValueError):
    """A bad `--input`; str(e) is one line naming the file and the reason."""


def generated(t: Tensor, seed: int, picks: int | None = None) -> np.ndarray:
    """Seeded values for `t`: integers from -8 to 7, within -picks to picks - 1 for an index
    tensor whose entries pick along a dim of `picks`, so a run without its --input reads rows."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    if is_integer(t.dtype):
        bound = 8 if picks is None else min(8, picks)
        return rng.integers(-bound, bound, size=t.shape).astype(numpy_dtype(t.dtype))
    return rng.uniform(-1.0, 1.0, size=t.shape).astype(numpy_dtype(t.dtype))


def read_input(spec: str, program: Program) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise InputError(f"--input {spec}: expected NAME=FILE.npy")
    t = program.graph.tensors.get(name)
    if t is None or t.role not in ("input", "constant"):
        known = ", ".join(x.name for x in program.graph.inputs)
        raise InputError(f"{path}: '{name}' is not an input of the program (inputs: {known})")
    where = f"{path}: input '{name}'"
    try:
        data = read_input_file(path, f".npy file for '{name}'", _HEAD_BYTES + math.prod(t.shape) * _WIDEST_ITEM)
    except InputFileError as e:
        raise InputError(str(e)) from None
    return name, _converted(_read_npy(data, path, t, where), t, where)


def read_inputs(specs: list[str], program: Program) -> dict[str, np.ndarray]:
    """Tensor name -> its array, for every `--input NAME=FILE.npy`; a name given twice is refused
    before any file is read."""
    files: dict[str, str] = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        if name in files:
            raise InputError(f"--input {name}: given twice ({files[name]} and {path}); give each input once")
        files[name] = path
    return dict(read_input(spec, program) for spec in specs)


def _read_npy(data: bytes, path: str, t: Tensor, where: str) -> np.ndarray:
    """The array in `data`, its header checked against `t` before the data is used."""
    size = len(data)
    if size == 0:
        raise InputError(f"{path}: not a .npy array: the file is empty")
    head = io.BytesIO(data[:_HEAD_BYTES])  # however long the header says it is
    shape, fortran_order, dtype = _header(head, path)
    if shape != tuple(t.shape):
        raise InputError(f"{where} has shape {list(shape)}, the program expects {list(t.shape)}")
    want = numpy_dtype(t.dtype)
    if dtype != want and dtype.kind not in "biuf" and not _raw_ml_dtype(dtype, want):
        raise InputError(f"{where} has dtype {_describe(dtype)}, the program expects {t.dtype}")
    nbytes = math.prod(shape) * dtype.itemsize
    if size - head.tell() != nbytes:
        raise InputError(f"{path}: the header promises {nbytes:,} bytes of data, the file holds "
                         f"{size - head.tell():,}")
    return np.frombuffer(data, dtype, offset=head.tell()).reshape(shape, order="F" if fortran_order else "C")


def _header(head: io.BytesIO, path: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        with warnings.catch_warnings():
            # numpy warns about Python 2 headers and deprecated dtype aliases; the checks decide
            warnings.simplefilter("ignore")
            version = npy_format.read_magic(head)
            if version == (1, 0):
                return npy_format.read_array_header_1_0(head)
            if version == (2, 0):
                return npy_format.read_array_header_2_0(head)
    except Exception as e:  # a malformed header raises TokenError, SyntaxError or TypeError, not only ValueError
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]  # numpy quotes the whole header
        raise InputError(f"{path}: not a .npy array: {reason}") from None
    # 3.0 exists only for structured dtypes with non-latin-1 field names, which are refused anyway
    raise InputError(f"{path}: .npy format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")


def _raw_ml_dtype(dtype: np.dtype, want: np.dtype) -> bool:
    """Whether `dtype` is how np.save stores arrays of `want`, an ml_dtypes type (plain void of its
    size); each size has one ml_dtypes type in the DFX contract."""
    plain_void = dtype.kind == "V" and dtype.names is None and dtype.subdtype is None
    return plain_void and want.kind == "V" and dtype.itemsize == want.itemsize


def _describe(dtype: np.dtype) -> str:
    """A file's dtype, raw bytes named after the DFX types np.save writes that way."""
    writers = [name for name, d in NUMPY_DTYPES.items() if _raw_ml_dtype(dtype, d)]
    if writers:
        return f"{dtype.str} (raw {dtype.itemsize}-byte values, as np.save writes {writers[0]})"
    return str(dtype)


def _converted(array: np.ndarray, t: Tensor, where: str) -> np.ndarray:
    """`array` (read-only, from the file) as a new array of `t`'s dtype, or InputError when a
    value would change."""
    want = numpy_dtype(t.dtype)
    if array.dtype == want or array.dtype.kind == "V":  # raw bytes were checked against `want` in the header
        return array.view(want).copy()
    # NaN, inf and out-of-range values are caught by the round trip below, not warned about
    with np.errstate(all="ignore"):
        converted = array.astype(want)
        back = converted.astype(array.dtype)
        same = back == array
        if array.dtype.kind == "f":
            same |= np.isnan(back) & np.isnan(array)
    if not same.all():
        index = [int(i) for i in np.argwhere(~same)[0]]
        raise InputError(f"{where} has dtype {array.dtype}, the program expects {t.dtype}, which cannot "
                         f"hold {array[tuple(index)].item()!r} at {index} exactly")
    return converted


def program_inputs(program: Program, given: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    g = program.graph
    picks = index_sizes(program)
    values: dict[str, np.ndarray] = {}
    for t in g.inputs:
        if t.name in given:
            values[t.name] = given[t.name]
        elif t.name in g.constants:
            values[t.name] = g.constant_values(t.name)
        else:
            values[t.name] = generated(t, seed, picks.get(t.name))
    return values
