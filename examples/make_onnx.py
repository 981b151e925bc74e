"""Write the example ONNX models with `onnx.helper` (nothing is downloaded):

    .venv/bin/python examples/make_onnx.py -o build/            # all four
    .venv/bin/python examples/make_onnx.py gpt2_ffn -o build/   # one of them

- `mlp`: a 3-layer perceptron, input [32, 784] -> 256 -> 128 -> 10: the first and last layer
  `Gemm` with the weight transposed (`transB`, as PyTorch exports `nn.Linear`), the middle one
  `MatMul` + `Add`, ReLU between them.
- `cnn`: a small NCHW CNN on [1, 3, 32, 32]: Conv 3x3 (16) + ReLU, MaxPool 2x2, Conv 3x3 (32) +
  ReLU, GlobalAveragePool, Flatten, Gemm to 10 logits.
- `gpt2_ffn`: GPT-2's feed-forward block on `hidden_states` [128, 768]: MatMul 768x3072 + bias,
  GELU in the tanh form GPT-2 writes (`0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, as
  primitive ops), MatMul 3072x768 + bias.
- `bert_layer`: one BERT-base encoder layer on `hidden_states` [1, 128, 768], 12 heads: Q, K, V
  projections (MatMul + bias), split into heads by Reshape and Transpose, scores Q K^T / 8 (K's
  heads transposed again, their last two axes, by a Transpose feeding the MatMul), Softmax over
  the last axis, P V, heads merged back, the output projection, residual Add,
  LayerNormalization; the FFN 768 -> 3072 -> 768 with GELU in its erf form (`x * 0.5 * (1 + erf(x / sqrt 2))`, as PyTorch exports it), residual Add,
  LayerNormalization. `--decomposed-layernorm` writes each layer norm as the chain PyTorch
  exports below opset 17 (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add).

Every model is opset 17 with `ir_version` 10 (onnxruntime 1.3x refuses the IR version onnx 1.23
writes by default); its weights are initializers drawn from a generator seeded by `--seed`, so
the same command writes the same bytes. The builder functions take the sizes as parameters
(`bert_layer(seq=32, hidden=256, heads=4, ffn=1024)` is a smaller layer of the same graph).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 10
FLOAT = TensorProto.FLOAT


class _Graph:
    """Nodes, initializers and seeded weights of one model under construction."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.names: set[str] = set()

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def const(self, name: str, value: np.ndarray | float | list[int]) -> str:
        """An initializer: float32 for floats, int64 for integer lists (shapes, axes)."""
        array = np.asarray(value)
        array = array.astype(np.int64 if array.dtype.kind in "iu" else np.float32)
        name = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], fan_in: int) -> str:
        """Normal weights scaled by 1/sqrt(fan_in), so activations stay of order one."""
        return self.const(name, self.rng.standard_normal(shape) / math.sqrt(fan_in))

    def bias(self, name: str, n: int, scale: float = 0.1) -> str:
        return self.const(name, scale * self.rng.standard_normal(n))

    def node(self, op: str, inputs: list[str], name: str, output: str | None = None, **attrs) -> str:
        """Add a node named `name`; its one output (`output`, else the node's name)."""
        name = self.fresh(name)
        out = output or name
        if output:
            self.names.add(output)
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def model(self, name: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="kpu-toolchain examples/make_onnx.py")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model

    # -- blocks as exporters write them

    def linear(self, x: str, fan_in: int, fan_out: int, name: str, output: str | None = None) -> str:
        """x @ W + b as MatMul and Add (GPT-2's Conv1D, BERT's Linear as exported)."""
        w = self.weight(f"{name}.weight", (fan_in, fan_out), fan_in)
        y = self.node("MatMul", [x, w], f"{name}/MatMul")
        return self.node("Add", [y, self.bias(f"{name}.bias", fan_out)], f"{name}/Add", output)

    def gelu_tanh(self, x: str, name: str) -> str:
        """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): GPT-2's gelu_new, op by op."""
        cube = self.node("Pow", [x, self.const(f"{name}.three", 3.0)], f"{name}/Pow")
        scaled = self.node("Mul", [self.const(f"{name}.c", 0.044715), cube], f"{name}/Mul")
        inner = self.node("Add", [x, scaled], f"{name}/Add")
        arg = self.node("Mul", [self.const(f"{name}.k", math.sqrt(2 / math.pi)), inner], f"{name}/Mul_1")
        t = self.node("Tanh", [arg], f"{name}/Tanh")
        one_plus = self.node("Add", [self.const(f"{name}.one", 1.0), t], f"{name}/Add_1")
        half_x = self.node("Mul", [self.const(f"{name}.half", 0.5), x], f"{name}/Mul_2")
        return self.node("Mul", [half_x, one_plus], f"{name}/Mul_3")

    def gelu_erf(self, x: str, name: str) -> str:
        """x * 0.5 * (1 + erf(x / sqrt(2))): torch.nn.functional.gelu as PyTorch exports it."""
        scaled = self.node("Div", [x, self.const(f"{name}.sqrt2", math.sqrt(2))], f"{name}/Div")
        e = self.node("Erf", [scaled], f"{name}/Erf")
        one_plus = self.node("Add", [e, self.const(f"{name}.one", 1.0)], f"{name}/Add")
        y = self.node("Mul", [x, one_plus], f"{name}/Mul")
        return self.node("Mul", [y, self.const(f"{name}.half", 0.5)], f"{name}/Mul_1")

    def layernorm(self, x: str, hidden: int, name: str, decomposed: bool, epsilon: float = 1e-12,
                  output: str | None = None) -> str:
        """LayerNormalization over the last axis, or the chain PyTorch exports below opset 17."""
        gamma = self.const(f"{name}.weight", 1 + 0.1 * self.rng.standard_normal(hidden))
        beta = self.const(f"{name}.bias", 0.1 * self.rng.standard_normal(hidden))
        if not decomposed:
            return self.node("LayerNormalization", [x, gamma, beta], f"{name}/LayerNormalization", output,
                             axis=-1, epsilon=epsilon)
        mean = self.node("ReduceMean", [x], f"{name}/ReduceMean", axes=[-1], keepdims=1)
        centred = self.node("Sub", [x, mean], f"{name}/Sub")
        square = self.node("Pow", [centred, self.const(f"{name}.two", 2.0)], f"{name}/Pow")
        var = self.node("ReduceMean", [square], f"{name}/ReduceMean_1", axes=[-1], keepdims=1)
        std = self.node("Sqrt", [self.node("Add", [var, self.const(f"{name}.eps", epsilon)], f"{name}/Add")],
                        f"{name}/Sqrt")
        normed = self.node("Div", [centred, std], f"{name}/Div")
        scaled = self.node("Mul", [normed, gamma], f"{name}/Mul")
        return self.node("Add", [scaled, beta], f"{name}/Add_1", output)


def _tensor(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, FLOAT, shape)


# ---- the models -------------------------------------------------------------------------------


def mlp(batch: int = 32, features: tuple[int, ...] = (784, 256, 128, 10), seed: int = 0) -> onnx.ModelProto:
    """ReLU between the layers; the first and last are Gemm (transB), the others MatMul + Add."""
    g = _Graph(seed)
    x = "input"
    layers = len(features) - 1
    for i in range(layers):
        fin, fout = features[i], features[i + 1]
        last = i == layers - 1
        out = "logits" if last else None
        if i == 0 or last:  # nn.Linear as PyTorch exports it: weight [out, in], transB=1
            w = g.weight(f"fc{i + 1}.weight", (fout, fin), fin)
            y = g.node("Gemm", [x, w, g.bias(f"fc{i + 1}.bias", fout)], f"fc{i + 1}/Gemm", out, transB=1)
        else:
            y = g.linear(x, fin, fout, f"fc{i + 1}", out)
        x = y if last else g.node("Relu", [y], f"relu{i + 1}/Relu")
    return g.model("mlp", [_tensor("input", [batch, features[0]])], [_tensor("logits", [batch, features[-1]])])


def cnn(batch: int = 1, size: int = 32, channels: tuple[int, int, int] = (3, 16, 32), classes: int = 10,
        seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 + ReLU, MaxPool 2x2, Conv 3x3 + ReLU, GlobalAveragePool, Flatten, Gemm."""
    g = _Graph(seed)
    c0, c1, c2 = channels
    w1 = g.weight("conv1.weight", (c1, c0, 3, 3), 9 * c0)
    h = g.node("Conv", ["input", w1, g.bias("conv1.bias", c1)], "conv1/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Relu", [h], "relu1/Relu")
    h = g.node("MaxPool", [h], "pool1/MaxPool", kernel_shape=[2, 2], strides=[2, 2])
    w2 = g.weight("conv2.weight", (c2, c1, 3, 3), 9 * c1)
    h = g.node("Conv", [h, w2, g.bias("conv2.bias", c2)], "conv2/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Relu", [h], "relu2/Relu")
    h = g.node("GlobalAveragePool", [h], "gap/GlobalAveragePool")
    h = g.node("Flatten", [h], "flatten/Flatten", axis=1)
    w3 = g.weight("fc.weight", (classes, c2), c2)
    g.node("Gemm", [h, w3, g.bias("fc.bias", classes)], "fc/Gemm", "logits", transB=1)
    return g.model("cnn", [_tensor("input", [batch, c0, size, size])], [_tensor("logits", [batch, classes])])


def gpt2_ffn(seq: int = 128, hidden: int = 768, ffn: int = 3072, seed: int = 0) -> onnx.ModelProto:
    """GPT-2's MLP: c_fc (MatMul + bias), gelu_new (the tanh form, op by op), c_proj."""
    g = _Graph(seed)
    h = g.linear("hidden_states", hidden, ffn, "mlp.c_fc")
    h = g.gelu_tanh(h, "mlp.act")
    g.linear(h, ffn, hidden, "mlp.c_proj", "output")
    return g.model("gpt2_ffn", [_tensor("hidden_states", [seq, hidden])], [_tensor("output", [seq, hidden])])


def bert_layer(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, batch: int = 1,
               decomposed_layernorm: bool = False, seed: int = 0) -> onnx.ModelProto:
    """One BERT encoder layer (post-norm, as BERT-base): self-attention, residual, LayerNorm, the
    FFN with erf GELU, residual, LayerNorm."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} does not split into {heads} heads")
    g = _Graph(seed)
    head = hidden // heads
    x = "hidden_states"
    split = g.const("attention.split_heads", [batch, seq, heads, head])
    merged = g.const("attention.merge_heads", [batch, seq, hidden])

    def heads_of(t: str, name: str, perm: list[int]) -> str:
        r = g.node("Reshape", [t, split], f"{name}/Reshape")
        return g.node("Transpose", [r], f"{name}/Transpose", perm=perm)

    q = heads_of(g.linear(x, hidden, hidden, "attention.self.query"), "attention.self.query_heads", [0, 2, 1, 3])
    k = heads_of(g.linear(x, hidden, hidden, "attention.self.key"), "attention.self.key_heads", [0, 2, 1, 3])
    v = heads_of(g.linear(x, hidden, hidden, "attention.self.value"), "attention.self.value_heads", [0, 2, 1, 3])
    # key_layer.transpose(-1, -2), a Transpose of its own as PyTorch exports it: [b, heads, head, seq]
    k_t = g.node("Transpose", [k], "attention.self/Transpose_key", perm=[0, 1, 3, 2])
    scores = g.node("MatMul", [q, k_t], "attention.self/MatMul")  # [b, heads, seq, seq]
    scores = g.node("Div", [scores, g.const("attention.self.scale", math.sqrt(head))], "attention.self/Div")
    probs = g.node("Softmax", [scores], "attention.self/Softmax", axis=-1)
    context = g.node("MatMul", [probs, v], "attention.self/MatMul_1")  # [b, heads, seq, head]
    context = g.node("Transpose", [context], "attention.self/Transpose", perm=[0, 2, 1, 3])
    context = g.node("Reshape", [context, merged], "attention.self/Reshape")
    attn = g.linear(context, hidden, hidden, "attention.output.dense")
    attn = g.node("Add", [attn, x], "attention.output/Add")
    attn = g.layernorm(attn, hidden, "attention.output.LayerNorm", decomposed_layernorm)
    h = g.linear(attn, hidden, ffn, "intermediate.dense")
    h = g.gelu_erf(h, "intermediate.gelu")
    h = g.linear(h, ffn, hidden, "output.dense")
    h = g.node("Add", [h, attn], "output/Add")
    g.layernorm(h, hidden, "output.LayerNorm", decomposed_layernorm, output="output")
    return g.model("bert_layer", [_tensor("hidden_states", [batch, seq, hidden])],
                   [_tensor("output", [batch, seq, hidden])])


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp, "cnn": cnn, "gpt2_ffn": gpt2_ffn, "bert_layer": bert_layer,
}


def write(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write `model` to `path` (folders made as needed), atomically."""
    from dfx import OutputFiles

    with OutputFiles() as files:
        target = files.claim(path)
        files.stage(target, model.SerializeToString())
        files.commit()
    return Path(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", metavar="MODEL", help=f"any of {', '.join(MODELS)} (default: all)")
    p.add_argument("-o", "--output-dir", default="build", help="folder the NAME.onnx files go to (default build/)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    p.add_argument("--decomposed-layernorm", action="store_true",
                   help="bert_layer: each layer norm as the ReduceMean/Sub/Pow/Sqrt/Div chain, not LayerNormalization")
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model {', '.join(unknown)} (choose from {', '.join(MODELS)})")
    for name in args.models or MODELS:
        kwargs = {"decomposed_layernorm": True} if name == "bert_layer" and args.decomposed_layernorm else {}
        path = write(MODELS[name](seed=args.seed, **kwargs), Path(args.output_dir) / f"{name}.onnx")
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
