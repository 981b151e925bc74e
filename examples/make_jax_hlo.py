"""Lower small JAX and Flax workloads to HLO text as their users print it, and write each with
its inputs and JAX's outputs (nothing is downloaded: random weights from a fixed PRNG seed):

    pip install -e '.[zoo]'
    python examples/make_jax_hlo.py -o examples/jax               # the test set (in the repo)
    python examples/make_jax_hlo.py mlp_gelu argmax -o examples/jax   # some of them

Flax linen models are called as their users call them, `jax.jit(model.apply)(variables, x)`, so
the weights are ENTRY parameters. Every workload is written in three forms, as
`<workload>.<form>.hlo`:

- `lowered`: `jax.jit(f).lower(*args).compiler_ir('hlo').as_hlo_text()`, the module before
  XLA's passes;
- `compiled`: `jax.jit(f).lower(*args).compile().as_text()`, the module after XLA's CPU
  pipeline (fusions, debug tables, layouts, `metadata={... stack_frame_id=N}`);
- `dumped`: the `*after_optimizations.txt` file that `XLA_FLAGS="--xla_dump_to=DIR
  --xla_dump_hlo_as_text"` writes for the jitted function. XLA reads XLA_FLAGS when it starts,
  so this script runs itself once more as a child process with the flags set, rebuilds the same
  workloads from the same seeds and compiles each; the module a compile adds to the dump folder
  is that workload's (the jits that make its weights and inputs were dumped before it).

Weights closed over by the jitted function (`nnx_closure`, a flax.nnx model) are constants of
the module. `as_hlo_text(print_large_constants=True)` prints them in the lowered form; the other
two print a constant of more than a few elements as `{...}` by default. `compile().as_text()`
takes no option, but the same module printed by `compile().runtime_executable().hlo_modules()[0]
.to_string(options)` with `options.print_large_constants` set has them (it differs from
as_text() only there and in the key order of `backend_config` JSON), so the compiled form is
printed that way wherever as_text() elides a constant; the dump gets them from
`--xla_dump_large_constants`, which every dump here sets. So nnx_closure has all three forms.

Beside them, `<workload>.npz` holds the inputs as `input:<k>`, k the position of the array among
the flattened jit arguments (`jax.tree_util.tree_leaves(args)`, which are the ENTRY's parameters
0..n-1 in every form: the script checks each parameter's type and shape against its input), and
JAX's outputs as `output:<k>` (flattened, in order). bf16 arrays are stored as float32, which
holds them exactly. `manifest.json` lists every file with its workload, form, the ENTRY's
parameter names in parameter-number order (read from its text, never assumed: jax 0.10 names
them alike in the three forms, after the argument's path, as `args_0_.1`; older versions wrote
`Arg_0.1`), the dtypes of inputs and outputs, and each output's tolerance relative to its peak:

- f32: 1e-4, the zoo's bound;
- integers: 0. argmax must pick JAX's index, so the script refuses inputs where a row's two best
  scores are closer than 1e-2 of the peak score;
- bf16: 2^-6. bf16 keeps 8 significant bits, so each rounding is within 2^-8 of the value;
  attention in bf16 rounds up to twice (the probabilities before the product with v, which XLA's
  CPU pipeline keeps in f32 instead, and the output), and a compiler may round as often at other
  points: four roundings in all. The script measures JAX's bf16 outputs against the same
  function on the inputs widened to f32 and refuses a workload where they differ by more than
  half that (the manifest records it as `bf16_vs_f32`).

Source paths in the debug tables are written relative to the repository or to site-packages
(`jax_hlo_source_file_canonicalization_regex`), so the files do not depend on where they were made.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax._src.lib import hlo as xla_hlo  # HloPrintOptions: jax has no public name for it

ROOT = Path(__file__).resolve().parent.parent
FORMS = ("lowered", "compiled", "dumped")
SEED = 0
F32_AGREEMENT = 1e-4  # relative to the output's peak
BF16_AGREEMENT = 2.0**-6  # four bf16 roundings of 2^-8 (see above)
ARGMAX_MARGIN = 1e-2  # the two best scores at least this far apart, relative to the peak

# the debug tables name source files relative to the repository or to site-packages
jax.config.update("jax_hlo_source_file_canonicalization_regex",
                  rf"^{re.escape(str(ROOT))}/|^.*/site-packages/")


@dataclass
class Workload:
    """A function to jit, its arguments (any pytree; its leaves are the ENTRY parameters) and sizes."""

    fn: Callable
    args: tuple
    sizes: str


def _key(purpose: str) -> jax.Array:
    """A key of its own for each purpose ("init", "stats", "x", "q", ...), the same in every run."""
    return jax.random.fold_in(jax.random.PRNGKey(SEED), zlib.crc32(purpose.encode()))


def _normal(purpose: str, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    return jax.random.normal(_key(purpose), shape, jnp.float32).astype(dtype)


def _randomized(variables: Any, key: jax.Array) -> Any:
    """The initialised variables with random statistics, scales and biases (Flax starts them at
    0 and 1, which would hide a frontend that drops or swaps them): positive for variances and
    scales, around 0 for means and biases; kernels and embeddings keep their random init."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(variables)
    keys = jax.random.split(key, len(leaves))
    out = []
    for (path, leaf), k in zip(leaves, keys):
        name = getattr(path[-1], "key", "")
        if name in ("var", "scale"):
            leaf = jax.random.uniform(k, leaf.shape, leaf.dtype, 0.5, 1.5)
        elif name in ("mean", "bias"):
            leaf = 0.2 * jax.random.normal(k, leaf.shape, leaf.dtype)
        out.append(leaf)
    return jax.tree_util.tree_unflatten(tree, out)


def _linen(module: nn.Module, *inputs: jax.Array, sizes: str) -> Workload:
    """A linen module called as its users call it: `jax.jit(model.apply)(variables, *inputs)`."""
    variables = _randomized(module.init(_key("init"), *inputs), _key("stats"))
    return Workload(module.apply, (variables, *inputs), sizes)


# ---- linen modules ---------------------------------------------------------------------------


class MlpGelu(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(16)(nn.gelu(nn.Dense(64)(x)))


class CnnBnPool(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(8, (3, 3))(x)))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(16, (3, 3))(x)))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


class ResnetBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        channels = x.shape[-1]
        y = nn.Conv(channels, (3, 3), use_bias=False)(x)
        y = nn.relu(nn.BatchNorm(use_running_average=True)(y))
        y = nn.Conv(channels, (3, 3), use_bias=False)(y)
        y = nn.BatchNorm(use_running_average=True)(y)
        return nn.relu(x + y)


class DwSeparable(nn.Module):
    @nn.compact
    def __call__(self, x):
        channels = x.shape[-1]
        x = nn.Conv(channels, (3, 3), feature_group_count=channels, use_bias=False)(x)
        x = nn.relu6(nn.BatchNorm(use_running_average=True)(x))
        x = nn.Conv(32, (1, 1), use_bias=False)(x)
        return nn.relu6(nn.BatchNorm(use_running_average=True)(x))


class Mlp(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.hidden)(x)))


class EncoderBlock(nn.Module):
    """Post-norm, as the original transformer encoder."""

    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm()(x + nn.MultiHeadDotProductAttention(num_heads=4)(x))
        return nn.LayerNorm()(x + Mlp(64)(x))


class GptBlock(nn.Module):
    """Pre-norm with a causal mask, as GPT-2."""

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x), mask=mask)
        return x + Mlp(64)(nn.LayerNorm()(x))


class RmsDense(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(32)(nn.RMSNorm()(x))


class EmbedDense(nn.Module):
    @nn.compact
    def __call__(self, ids):
        return nn.Dense(16)(nn.Embed(64, 32)(ids))


class DenseArgmax(nn.Module):
    def setup(self):
        self.dense = nn.Dense(16)

    def scores(self, x):
        return self.dense(x)

    def __call__(self, x):
        return jnp.argmax(self.scores(x), axis=-1)


class DenseTanh(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return jnp.tanh(nn.Dense(x.shape[-1])(x)), None


class ScanLayers(nn.Module):
    """Three identical layers as one scanned layer with stacked weights: a `while` loop."""

    @nn.compact
    def __call__(self, x):
        layers = nn.scan(DenseTanh, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        return layers()(x, None)[0]


class NnxMlp(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.first, self.second = nnx.Linear(32, 64, rngs=rngs), nnx.Linear(64, 16, rngs=rngs)

    def __call__(self, x):
        return self.second(nnx.relu(self.first(x)))


# ---- workloads -------------------------------------------------------------------------------


def mlp_gelu() -> Workload:
    return _linen(MlpGelu(), _normal("x", (2, 32)), sizes="batch 2, 32 -> 64 -> 16")


def cnn_bn_pool() -> Workload:
    return _linen(CnnBnPool(), _normal("x", (1, 16, 16, 3)),
                  sizes="16x16x3 NHWC, channels 8 and 16, 10 classes")


def resnet_block() -> Workload:
    return _linen(ResnetBlock(), _normal("x", (1, 8, 8, 16)), sizes="8x8x16 NHWC")


def dw_separable() -> Workload:
    return _linen(DwSeparable(), _normal("x", (1, 8, 8, 16)), sizes="8x8x16 NHWC -> 32 channels")


def encoder_block() -> Workload:
    return _linen(EncoderBlock(), _normal("x", (1, 16, 32)), sizes="seq 16, hidden 32, 4 heads, MLP 64")


def gpt_block() -> Workload:
    return _linen(GptBlock(), _normal("x", (1, 16, 32)), sizes="seq 16, hidden 32, 4 heads, MLP 64")


def rmsnorm() -> Workload:
    return _linen(RmsDense(), _normal("x", (2, 16, 32)), sizes="2x16x32 -> 32")


def bf16_attention() -> Workload:
    q, k, v = (_normal(name, (1, 16, 4, 16), jnp.bfloat16) for name in "qkv")
    return Workload(jax.nn.dot_product_attention, (q, k, v), "q, k, v [1, 16, 4, 16] BTNH bf16")


def _einsums(a, b, q, k):
    return jnp.einsum("bij,bjk->bik", a, b), jnp.einsum("bhqd,bhkd->bhqk", q, k)


def batched_einsum() -> Workload:
    args = (_normal("a", (2, 8, 16)), _normal("b", (2, 16, 8)),
            _normal("q", (1, 2, 8, 16)), _normal("k", (1, 2, 8, 16)))
    return Workload(_einsums, args, "[2,8,16] @ [2,16,8]; q, k [1,2,8,16]")


def _logsumexp(x):
    return jax.nn.logsumexp(x, axis=-1)


def logsumexp() -> Workload:
    return Workload(_logsumexp, (3.0 * _normal("x", (2, 16, 32)),), "[2,16,32] over the last axis")


def _variance(x):
    return jnp.var(x, axis=(1, 2)), jnp.mean(x, axis=-1)


def variance() -> Workload:
    return Workload(_variance, (1.0 + _normal("x", (2, 8, 8, 16)),), "[2,8,8,16]: var over 1, 2; mean over 3")


def embedding() -> Workload:
    ids = jax.random.randint(_key("ids"), (2, 8), 0, 64, jnp.int32)
    return _linen(EmbedDense(), ids, sizes="ids [2, 8] int32, vocab 64, features 32 -> 16")


def argmax() -> Workload:
    workload = _linen(DenseArgmax(), _normal("x", (2, 32)), sizes="batch 2, 32 -> 16 scores")
    scores = np.sort(np.asarray(DenseArgmax().apply(*workload.args, method="scores")), axis=-1)
    if np.min(scores[:, -1] - scores[:, -2]) < ARGMAX_MARGIN * np.abs(scores).max():
        sys.exit("argmax: the two best scores of a row are too close for the index to be stable")
    return workload


def conv_transpose() -> Workload:
    return _linen(nn.ConvTranspose(8, (2, 2), strides=(2, 2)), _normal("x", (1, 8, 8, 16)),
                  sizes="8x8x16 NHWC -> 16x16x8")


def scan_layers() -> Workload:
    return _linen(ScanLayers(), _normal("x", (2, 32)), sizes="batch 2, 3 layers of 32 -> 32")


def nnx_closure() -> Workload:
    model = NnxMlp(nnx.Rngs(SEED))
    return Workload(lambda x: model(x), (_normal("x", (2, 32)),), "batch 2, 32 -> 64 -> 16, weights closed over")


def _nchw(x, w):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y, jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def nchw_conv() -> Workload:
    """PyTorch's layout in JAX: XLA's CPU pipeline lays the convolution out NHWC and hands the
    NCHW result back as a bitcast to a permuted layout."""
    return Workload(_nchw, (_normal("x", (2, 4, 8, 8)), _normal("w", (8, 4, 3, 3))), "x [2,4,8,8] NCHW, w [8,4,3,3] OIHW")


def _permuted(c, d, y):
    return jnp.einsum("bij,bjk->ibk", c, d), y.T


def permuted_outputs() -> Workload:
    """Results whose dims come out permuted: after XLA's passes, bitcasts to permuted layouts."""
    return Workload(_permuted, (_normal("c", (2, 4, 5)), _normal("d", (2, 5, 3)), _normal("y", (6, 5))),
                    "einsum bij,bjk->ibk of [2,4,5] and [2,5,3]; y [6,5] returned transposed")


def _bf16_reductions(x):
    return jnp.max(x, axis=-1), jnp.argmax(x, axis=-1), nn.avg_pool(x, (2, 2), strides=(2, 2)), jnp.min(x, axis=(1, 2))


def bf16_reductions() -> Workload:
    """After XLA's CPU passes each step of a bf16 reduction is an f32 op rounded to bf16 and back.
    The values are distinct multiples of 1/16 below 8 in magnitude, exact in bf16: argmax has one answer."""
    x = (jax.random.permutation(_key("x"), 256).reshape(2, 4, 4, 8) / 16 - 8).astype(jnp.bfloat16)
    return Workload(_bf16_reductions, (x,), "x [2,4,4,8] bf16: max and argmax over channels, 2x2 avg pool, min over 4x4")


def _first_token(ids):
    eos = ids == 3
    return jnp.argmax(eos, axis=-1), jnp.argmin(eos, axis=-1)


def first_token() -> Workload:
    """Where the first end-of-sequence token is (argmax of a bool mask), and the first other one."""
    return Workload(_first_token, (jax.random.randint(_key("ids"), (4, 8), 0, 5, jnp.int32),), "ids [4, 8] int32")


def _linear_recurrence(a, x):
    """h_t = a_t h_(t-1) + x_t for every t at once, as state-space models scan: pairs combined
    by (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2); its HLO pads with interior padding."""
    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]
    return jax.lax.associative_scan(combine, (a, x), axis=1)[1]


def linear_recurrence() -> Workload:
    a = jax.random.uniform(_key("a"), (2, 6, 8), jnp.float32, 0.5, 1.0)
    return Workload(_linear_recurrence, (a, _normal("x", (2, 6, 8))), "a, x [2, 6, 8], scanned over 6 steps")


def _sort_top_k(x):
    scores = jnp.sort(x, axis=-1)
    carried = jax.lax.sort_key_val(x, jnp.cos(x), dimension=0)[1]
    return scores, jnp.argsort(x, axis=0, descending=True), jax.lax.top_k(x, 3), carried


def sort_top_k() -> Workload:
    """jnp.sort, a descending jnp.argsort (of the operand reversed, and its positions),
    jax.lax.top_k (a router's pick of experts) and jax.lax.sort_key_val (values carried in their
    keys' order). Values on a grid of thirds, so rows hold ties."""
    x = jnp.round(_normal("x", (6, 16)) * 3) / 3
    return Workload(_sort_top_k, (x,), "x [6, 16] with ties: sort over 1, argsort descending over 0, top 3 over 1, "
                                       "sort_key_val over 0")


def _top_p(logits):
    ordered = jnp.sort(logits, axis=-1)[:, ::-1]
    p = jax.nn.softmax(ordered, axis=-1)
    kept = jnp.cumsum(p, axis=-1) - p < 0.9
    return jnp.where(kept, p, 0.0), jnp.sum(kept, axis=-1)


def top_p() -> Workload:
    """A nucleus sampler's filter: the probabilities largest first, those with less than 0.9
    before them kept, and how many. XLA's passes write the cumsum over 1,000 in blocks."""
    return Workload(_top_p, (3.0 * _normal("logits", (2, 1000)),), "logits [2, 1000]: sorted, softmax, cumsum, mask")


def _order_statistics(x):
    gates = jax.nn.softmax(jax.lax.top_k(x, 2)[0], axis=-1)  # a mixture of experts' gate: only the values
    return jnp.median(x, axis=-1), jnp.quantile(x, 0.9, axis=-1), gates, jnp.argsort(jnp.argsort(x, axis=-1), axis=-1)


def order_statistics() -> Workload:
    """jnp.median and jnp.quantile (a sort, after XLA's passes a jnp.any of NaN in blocks), a top-2
    gate whose positions go unused (XLA's TopK then compares the values alone) and ranks."""
    return Workload(_order_statistics, (_normal("x", (4, 33)),), "x [4, 33]: median, 0.9 quantile, top-2 gate, ranks")


WORKLOADS: dict[str, Callable[[], Workload]] = {f.__name__: f for f in (
    mlp_gelu, cnn_bn_pool, resnet_block, dw_separable, encoder_block, gpt_block, rmsnorm, bf16_attention,
    batched_einsum, logsumexp, variance, embedding, argmax, conv_transpose, scan_layers, nnx_closure, nchw_conv,
    permuted_outputs, bf16_reductions, first_token, linear_recurrence, sort_top_k, top_p, order_statistics)}


# ---- printing --------------------------------------------------------------------------------


def lowered_text(w: Workload) -> str:
    return jax.jit(w.fn).lower(*w.args).compiler_ir("hlo").as_hlo_text(print_large_constants=True)


def compiled_text(w: Workload) -> str:
    """compile().as_text(), or the same module with its large constants where that elides one."""
    compiled = jax.jit(w.fn).lower(*w.args).compile()
    text = compiled.as_text()
    if "{...}" not in text:
        return text
    options = xla_hlo.HloPrintOptions()
    options.print_large_constants = True
    return compiled.runtime_executable().hlo_modules()[0].to_string(options)


def write_dumped(names: list[str], out: Path) -> None:
    """Run this script again as a child process with XLA_FLAGS asking for dumps; it writes the
    dumped form of each workload in `names` (XLA reads XLA_FLAGS only when it starts)."""
    with tempfile.TemporaryDirectory() as dump:
        flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_large_constants"
        env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
        subprocess.run([sys.executable, __file__, "--dump-into", dump, "-o", str(out), *names], env=env, check=True)


def copy_dumps(names: list[str], dump: Path, out: Path) -> None:
    """In the child: compile each workload; the module its compile adds to the dump is its own."""
    for name in names:
        workload = WORKLOADS[name]()
        before = set(dump.glob("*after_optimizations.txt"))
        jax.jit(workload.fn).lower(*workload.args).compile()
        added = sorted(set(dump.glob("*after_optimizations.txt")) - before)
        if len(added) != 1:
            sys.exit(f"{name}: its compile dumped {len(added)} optimized modules, expected one")
        (out / f"{name}.dumped.hlo").write_text(added[0].read_text())


# ---- the ENTRY's parameters ------------------------------------------------------------------

# an ENTRY parameter: `[%]name = type[dims]{layout} parameter(n)`
_PARAMETER = re.compile(r"^\s*%?(?P<name>[^\s=]+) = (?P<type>\w+)\[(?P<dims>[0-9,]*)\]\S* parameter\((?P<n>\d+)\)",
                        re.M)
HLO_TYPES = {"float32": "f32", "bfloat16": "bf16", "int32": "s32"}


def entry_parameters(text: str, inputs: list[np.ndarray], dtypes: list[str], path: Path) -> list[str]:
    """The ENTRY's parameter names in parameter-number order, checked against the inputs: parameter
    k has input k's type and shape, so every form numbers the flattened arguments alike."""
    start = re.search(r"^ENTRY\b", text, re.M)
    entry = text[start.start():text.index("\n}", start.start())]
    found = {int(m["n"]): m for m in _PARAMETER.finditer(entry)}
    if sorted(found) != list(range(len(inputs))):
        sys.exit(f"{path}: ENTRY parameters {sorted(found)}, expected 0..{len(inputs) - 1}")
    for k, (array, dtype) in enumerate(zip(inputs, dtypes)):
        m = found[k]
        dims = tuple(int(d) for d in m["dims"].split(",") if d)
        if (m["type"], dims) != (HLO_TYPES[dtype], array.shape):
            sys.exit(f"{path}: parameter {k} '{m['name']}' is {m['type']}{list(dims)}, "
                     f"the input {dtype}{list(array.shape)}")
    return [found[k]["name"] for k in range(len(inputs))]


# ---- writing ---------------------------------------------------------------------------------


def _arrays(tree: Any) -> tuple[list[np.ndarray], list[str]]:
    """The leaves of `tree` as numpy arrays (bf16 widened to f32, exactly) and their dtype names."""
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
    dtypes = [str(leaf.dtype) for leaf in leaves]
    return [leaf.astype(np.float32) if d == "bfloat16" else leaf for leaf, d in zip(leaves, dtypes)], dtypes


def _difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest difference of any output, relative to that output's peak."""
    return max(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(got, want))


def _widened(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda a: a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a, tree)


def write_workload(name: str, out: Path) -> dict:
    """Write the lowered and compiled forms and the data; return what the manifest records."""
    workload = WORKLOADS[name]()
    inputs, input_dtypes = _arrays(workload.args)
    outputs, output_dtypes = _arrays(jax.jit(workload.fn)(*workload.args))
    record: dict = {"workload": name, "sizes": workload.sizes, "input_dtypes": input_dtypes,
                    "output_dtypes": output_dtypes}
    bf16 = "bfloat16" in input_dtypes + output_dtypes
    record["tolerance"] = [0.0 if np.issubdtype(o.dtype, np.integer) else BF16_AGREEMENT if bf16 else F32_AGREEMENT
                           for o in outputs]
    if bf16:
        wide, _ = _arrays(jax.jit(workload.fn)(*_widened(workload.args)))
        record["bf16_vs_f32"] = float(f"{_difference(outputs, wide):.2e}")
        if record["bf16_vs_f32"] > BF16_AGREEMENT / 2:
            sys.exit(f"{name}: JAX's bf16 outputs differ from f32 by {record['bf16_vs_f32']} of their peak")
    (out / f"{name}.lowered.hlo").write_text(lowered_text(workload))
    (out / f"{name}.compiled.hlo").write_text(compiled_text(workload))
    arrays = {f"input:{k}": a for k, a in enumerate(inputs)}
    arrays.update({f"output:{k}": a for k, a in enumerate(outputs)})
    np.savez_compressed(out / f"{name}.npz", **arrays)
    return record


def manifest_entries(record: dict, out: Path) -> list[dict]:
    """One manifest entry per form of a workload whose files are written."""
    arrays = np.load(out / f"{record['workload']}.npz")
    inputs = [arrays[f"input:{k}"] for k in range(len(record["input_dtypes"]))]
    versions = {"jax": jax.__version__, "flax": flax.__version__}
    entries = []
    for form in FORMS:
        path = out / f"{record['workload']}.{form}.hlo"
        parameters = entry_parameters(path.read_text(), inputs, record["input_dtypes"], path)
        entries.append({"workload": record["workload"], "form": form, "file": path.name,
                        "data": f"{record['workload']}.npz", "parameters": parameters, **record, "versions": versions})
        print(f"wrote {path} ({path.stat().st_size / 1e3:.1f} kB)")
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", help=f"which of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("-o", "--output-dir", type=Path, required=True)
    parser.add_argument("--dump-into", type=Path, help=argparse.SUPPRESS)  # the child writing the dumped forms
    options = parser.parse_args()
    unknown = sorted(set(options.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"no workload {', '.join(unknown)}; there are {', '.join(WORKLOADS)}")
    names = options.workloads or list(WORKLOADS)
    if options.dump_into:
        copy_dumps(names, options.dump_into, options.output_dir)
        return
    options.output_dir.mkdir(parents=True, exist_ok=True)
    records = [write_workload(name, options.output_dir) for name in names]
    write_dumped(names, options.output_dir)
    manifest_path = options.output_dir / "manifest.json"
    manifest = {(e["workload"], e["form"]): e for e in
                (json.loads(manifest_path.read_text()) if manifest_path.exists() else [])}
    for record in records:
        manifest.update({(e["workload"], e["form"]): e for e in manifest_entries(record, options.output_dir)})
    order = {name: i for i, name in enumerate(WORKLOADS)}
    ordered = sorted(manifest.values(), key=lambda e: (order[e["workload"]], FORMS.index(e["form"])))
    manifest_path.write_text(json.dumps(ordered, indent=1) + "\n")


if __name__ == "__main__":
    main()
