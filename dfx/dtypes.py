"""Element types of the DFX contract and their numpy/ml_dtypes counterparts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache

import numpy as np

DTYPES = ("f64", "f32", "f16", "bf16", "f8", "i32", "i16", "i8", "u8")

_NUMPY_OWN = {
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "i32": np.dtype(np.int32),
    "i16": np.dtype(np.int16),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
}
# name -> the ml_dtypes type; `f8` is float8 e4m3 (the domain_flow `.dfg` meaning)
_ML_DTYPES = {"bf16": "bfloat16", "f8": "float8_e4m3fn"}


@cache
def _ml_dtype(name: str) -> np.dtype:
    # imported on first need: most programs have no bf16 or f8 tensor, and it lengthens start-up
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, _ML_DTYPES[name]))


class _NumpyDtypes(Mapping[str, np.dtype]):
    """name -> numpy dtype, in the order of DTYPES; bf16 and f8 load ml_dtypes when first asked for."""

    def __getitem__(self, name: str) -> np.dtype:
        if name in _ML_DTYPES:
            return _ml_dtype(name)
        return _NUMPY_OWN[name]

    def __iter__(self) -> Iterator[str]:
        return iter(DTYPES)

    def __len__(self) -> int:
        return len(DTYPES)


NUMPY_DTYPES = _NumpyDtypes()

# Other spellings the frontends meet (kpu-sim JSON, ONNX-style names).
ALIASES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "float8": "f8", "float8_e4m3": "f8", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
}


def canonical(name: str) -> str:
    """The DFX dtype name for `name`, or KeyError."""
    name = ALIASES.get(name, name)
    if name not in DTYPES:
        raise KeyError(name)
    return name


def itemsize(dtype: str) -> int:
    return NUMPY_DTYPES[dtype].itemsize


def numpy_dtype(dtype: str) -> np.dtype:
    return NUMPY_DTYPES[dtype]


def is_integer(dtype: str) -> bool:
    return dtype[0] in "iu"


def accumulator(dtype: str) -> str:
    """The type partial sums are kept in: i32 for integers, f64 for f64, else f32."""
    if is_integer(dtype):
        return "i32"
    return "f64" if dtype == "f64" else "f32"


def widest(dtypes: list[str]) -> str:
    """The dtype of most bytes among `dtypes` (the first of them on a tie): what a MAC of operands
    of those dtypes multiplies, as an array PE of the wider one does it."""
    return max(dtypes, key=itemsize)


def narrowest_integer(values: np.ndarray) -> str | None:
    """The narrowest signed DFX integer type holding every one of `values` (integers): i8, i16 or
    i32; None when not even i32 does."""
    low, high = int(values.min(initial=0)), int(values.max(initial=0))
    return next((d for d in ("i8", "i16", "i32")
                 if np.iinfo(_NUMPY_OWN[d]).min <= low and high <= np.iinfo(_NUMPY_OWN[d]).max), None)


def tolerance(dtype: str) -> tuple[float, float]:
    """(atol, rtol) for comparing a result of this dtype with its reference."""
    return {
        "f64": (1e-9, 1e-9),
        "f32": (1e-4, 1e-4),
        "f16": (1e-2, 1e-2),
        "bf16": (5e-2, 2e-2),
        "f8": (0.25, 0.125),
    }.get(dtype, (0.0, 0.0))


def dtype_of(array: np.ndarray) -> str:
    """The DFX dtype name of a numpy array."""
    # ml_dtypes' types are numpy's kind V (raw bytes): only such an array needs them loaded
    names = _ML_DTYPES if array.dtype.kind == "V" else _NUMPY_OWN
    for name in names:
        if array.dtype == NUMPY_DTYPES[name]:
            return name
    raise KeyError(str(array.dtype))
