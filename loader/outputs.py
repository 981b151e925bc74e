"""The files a run writes: each output tensor as a `.npy` in `--output-dir`, and the trace.

A tensor name comes from the user's graph and may hold anything (`../x`, `/abs`, NUL, line
breaks, thousands of characters), so the file name is derived from it: a name of plain
characters is used as it is; any other name keeps its plain characters and gains `~` and a hash
of the whole name. `~` never appears in a plain name, so distinct tensors get distinct files,
and every file lands inside the output folder. `--json`'s `outputs` map says which is which.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from dfx import OutputFiles

_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_OTHER = re.compile(r"[^A-Za-z0-9_.-]+")


def output_file_name(tensor: str) -> str:
    if _PLAIN.fullmatch(tensor):
        return f"{tensor}.npy"
    kept = _OTHER.sub("_", tensor).strip("._-")[:60]
    digest = hashlib.sha256(tensor.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{kept}~{digest}.npy"


def claim_outputs(files: OutputFiles, output_dir: str, tensors: list[str]) -> dict[str, Path]:
    """Tensor name -> the path its values go to, each checked before the run starts."""
    return {t: files.claim(Path(output_dir) / output_file_name(t)) for t in tensors}


def stage_array(files: OutputFiles, path: Path, value: np.ndarray) -> None:
    # plain numpy cannot name bf16/f8 in a .npy: widen them to f32, which is exact
    array = value.astype(np.float32) if value.dtype.kind == "V" else value
    files.stage(path, lambda f: np.save(f, array, allow_pickle=False))
