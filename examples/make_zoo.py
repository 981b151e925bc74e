"""Export real models with PyTorch, torchvision and transformers to ONNX, as their users do, and
write each with an input and onnxruntime's outputs (nothing is downloaded: random weights,
configs built in code):

    pip install -e '.[zoo]'
    python examples/make_zoo.py -o examples/zoo               # the test set (small, in the repo)
    python examples/make_zoo.py --full -o build/zoo-full      # full-size models for benchmarks/ (and resnet18_96)
    python examples/make_zoo.py gpt2 bert -o examples/zoo     # some of them
    python examples/make_zoo.py --quantized -o examples/zoo   # the int8 models (below; with --full, full size)

Every model is exported twice, `torch.onnx.export` with its default exporter (`dynamo=True`)
and with the legacy TorchScript one (`dynamo=False`, still what most deployment scripts use),
to `<model>.<exporter>.onnx` beside `<model>.<exporter>.npz`: the inputs under their ONNX names
(`input:<name>`), onnxruntime's outputs (`output:<name>`) and PyTorch's (`torch:<name>`). The
script refuses to write a model whose onnxruntime outputs differ from PyTorch's by more than
1e-4 of their peak (an exporter bug is not a test of ours). `manifest.json` lists every model
with its architecture, sizes, exporter, opset and that difference.

The test set keeps each architecture and shrinks what the architecture allows (64x64 images,
10 classes, narrower widths, two transformer layers), so all of it stays a few MB; `--full`
writes the sizes the benchmarks quote (224x224 images, GPT-2 small at 12 layers, 124 M
parameters, sequence 128; those go to external data files beside the model).

`--quantized` writes int8 models as onnxruntime's quantization tool makes them from the legacy
exports (its pre-processing, then `quantize_static` calibrated on random inputs, or
`quantize_dynamic`): `<model>.<scheme>.onnx` for the schemes of QUANTIZED, beside the same npz
(onnxruntime's outputs of the quantized model, `float:output` of the float one, and for the
static schemes `quantized:<name>`, every int8 or uint8 tensor a node makes, as onnxruntime
computes it with those tensors made outputs too). Their
batch normalizations first take statistics from random batches (a fresh network's are 0 and 1,
which leave MobileNet's last layers near zero, where int8 holds nothing to compare).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime
import torch
import torchvision
from torch import nn

EXPORTERS = {"dynamo": True, "legacy": False}
OPSET = 18
AGREEMENT = 1e-4  # onnxruntime against PyTorch, relative to the output's peak


@dataclass
class Model:
    """A module ready to export, its example inputs, and what to record about it."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    sizes: str
    dynamic_batch: bool = False


def _image(size: int, batch: int = 1) -> dict[str, torch.Tensor]:
    return {"image": torch.randn(batch, 3, size, size)}


def _tokens(vocab: int, seq: int) -> dict[str, torch.Tensor]:
    """Token ids and the attention mask a tokenizer gives with them (the last two tokens padding)."""
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[:, -2:] = 0
    return {"input_ids": torch.randint(0, vocab, (1, seq), dtype=torch.int64), "attention_mask": mask}


class FirstOutput(nn.Module):
    """A transformers model called as its users call it, by keyword, returning its main tensor."""

    def __init__(self, model: nn.Module, field: str, inputs: list[str]):
        super().__init__()
        self.model, self.field, self.inputs = model, field, inputs

    def forward(self, *args):
        return getattr(self.model(**dict(zip(self.inputs, args))), self.field)


# ---- torchvision ----------------------------------------------------------------------------


def resnet18(full: bool) -> Model:
    from torchvision.models.resnet import BasicBlock, ResNet

    if full:
        return Model(torchvision.models.resnet18(weights=None), _image(224), "224x224, 1000 classes")
    # resnet18's blocks ([2, 2, 2, 2] BasicBlocks, stride 2 at each stage) at a quarter of its width
    model = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=10)
    model.inplanes = 16
    model.conv1 = nn.Conv2d(3, 16, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(16)
    model.layer1 = model._make_layer(BasicBlock, 16, 2)
    model.layer2 = model._make_layer(BasicBlock, 32, 2, stride=2)
    model.layer3 = model._make_layer(BasicBlock, 64, 2, stride=2)
    model.layer4 = model._make_layer(BasicBlock, 128, 2, stride=2)
    model.fc = nn.Linear(128, 10)
    return Model(model, _image(64), "64x64, widths 16-128 (a quarter), 10 classes")


def resnet18_96(full: bool) -> Model:
    """torchvision's resnet18 whole, at 96x96: the whole-network benchmark's (`--full` only)."""
    return Model(torchvision.models.resnet18(weights=None), _image(96), "96x96, 1000 classes")


def mobilenet_v2(full: bool) -> Model:
    if full:
        return Model(torchvision.models.mobilenet_v2(weights=None), _image(224), "224x224, 1000 classes")
    return Model(torchvision.models.mobilenet_v2(weights=None, width_mult=0.5, num_classes=10), _image(64),
                 "64x64, width 0.5, 10 classes")


def mobilenet_v3_small(full: bool) -> Model:
    if full:
        return Model(torchvision.models.mobilenet_v3_small(weights=None), _image(224), "224x224, 1000 classes")
    return Model(torchvision.models.mobilenet_v3_small(weights=None, width_mult=0.5, num_classes=10), _image(64),
                 "64x64, width 0.5, 10 classes")


def efficientnet_b0(full: bool) -> Model:
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf

    if full:
        return Model(torchvision.models.efficientnet_b0(weights=None), _image(224), "224x224, 1000 classes")
    setting, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=1.0)
    return Model(EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=last_channel), _image(64),
                 "64x64, width 0.25, 10 classes")


def efficientnet_v2(full: bool) -> Model:
    """Its first stage adds each fused block's input back (y + SiLU(BN(conv(y))))."""
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig

    if full:
        return Model(torchvision.models.efficientnet_v2_s(weights=None), _image(224), "V2-S, 224x224, 1000 classes")
    setting = [FusedMBConvConfig(1, 3, 1, 16, 16, 2), FusedMBConvConfig(4, 3, 2, 16, 24, 1),
               MBConvConfig(4, 3, 2, 24, 32, 2)]
    return Model(EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=128), _image(64),
                 "64x64, V2 stages fused 16, 24, then 32, 10 classes")


def swin(full: bool) -> Model:
    """Its windows of 7 pad each stage's image (16 x 16, then 8 x 8 at 64x64), and its shifted
    windows' attention mask is built by ScatterND."""
    from torchvision.models.swin_transformer import SwinTransformer

    if full:
        return Model(torchvision.models.swin_t(weights=None), _image(224), "Swin-T, 224x224, 1000 classes")
    model = SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[7, 7],
                            num_classes=10)
    return Model(model, _image(64), "64x64, embed 32, depths [2, 2], window 7, 10 classes")


def convnext(full: bool) -> Model:
    """Its blocks' MLPs are Linear layers on the channels-last [1, H, W, C] image, and a layer
    scale multiplies each block's result before the residual."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    if full:
        return Model(torchvision.models.convnext_tiny(weights=None), _image(224), "ConvNeXt-T, 224x224, 1000 classes")
    setting = [CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 2)]
    return Model(ConvNeXt(setting, num_classes=10), _image(64), "64x64, widths 32 and 64, depths [2, 2], 10 classes")


def shufflenet(full: bool) -> Model:
    if full:
        return Model(torchvision.models.shufflenet_v2_x1_0(weights=None), _image(224), "x1.0, 224x224, 1000 classes")
    return Model(torchvision.models.shufflenet_v2_x0_5(weights=None, num_classes=10), _image(64),
                 "x0.5, 64x64, 10 classes")


# ---- transformers ---------------------------------------------------------------------------


def vit(full: bool) -> Model:
    from transformers import ViTConfig, ViTForImageClassification

    size, config = (224, ViTConfig()) if full else (32, ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_labels=10))
    model = FirstOutput(ViTForImageClassification(config), "logits", ["pixel_values"])
    return Model(model, _image(size), f"ViT {size}x{size}, patch {config.patch_size}, hidden {config.hidden_size}, "
                                      f"{config.num_hidden_layers} layers")


def bert(full: bool) -> Model:
    from transformers import BertConfig, BertModel

    seq, config = (128, BertConfig()) if full else (16, BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64))
    model = FirstOutput(BertModel(config, add_pooling_layer=False), "last_hidden_state",
                        ["input_ids", "attention_mask"])
    return Model(model, _tokens(config.vocab_size, seq), f"BERT seq {seq}, hidden {config.hidden_size}, "
                                                         f"{config.num_hidden_layers} layers, vocab {config.vocab_size}")


def gpt2(full: bool) -> Model:
    from transformers import GPT2Config, GPT2LMHeadModel

    seq, config = (128, GPT2Config()) if full else (16, GPT2Config(
        vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64))
    config.use_cache = False
    model = FirstOutput(GPT2LMHeadModel(config), "logits", ["input_ids", "attention_mask"])
    return Model(model, _tokens(config.vocab_size, seq), f"GPT-2 seq {seq}, n_embd {config.n_embd}, "
                                                         f"{config.n_layer} layers, vocab {config.vocab_size}")


def llama(full: bool) -> Model:
    """Rotary embeddings: the legacy exporter computes their angles' Cos and Sin from a constant."""
    from transformers import LlamaConfig, LlamaModel

    seq, config = (128, LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)) \
        if full else (16, LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    config.use_cache = False
    model = FirstOutput(LlamaModel(config), "last_hidden_state", ["input_ids", "attention_mask"])
    return Model(model, _tokens(config.vocab_size, seq), f"Llama seq {seq}, hidden {config.hidden_size}, "
                                                         f"{config.num_hidden_layers} layers, vocab {config.vocab_size}")


def ffn(full: bool) -> Model:
    """A transformer's feed-forward block with its layer norm: x + W2 GELU(W1 LayerNorm(x))."""
    hidden, inner, seq = (768, 3072, 128) if full else (64, 256, 16)

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(hidden), nn.Linear(hidden, inner), nn.Linear(inner, hidden)

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    return Model(FeedForward(), {"x": torch.randn(1, seq, hidden)}, f"hidden {hidden}, inner {inner}, seq {seq}")


def mlp(full: bool) -> Model:
    widths = [784, 512, 256, 10] if full else [64, 32, 16, 10]
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return Model(nn.Sequential(*layers[:-1]), {"x": torch.randn(1, widths[0])},
                 f"widths {widths}, batch dynamic", dynamic_batch=True)


MODELS: dict[str, Callable[[bool], Model]] = {f.__name__: f for f in (
    resnet18, resnet18_96, mobilenet_v2, mobilenet_v3_small, efficientnet_b0, efficientnet_v2, shufflenet, swin,
    convnext, vit,
    bert, gpt2, llama, ffn, mlp)}
FULL_ONLY = {"resnet18_96"}  # no smaller form: its 47 MB of weights stay out of the repository


# ---- export ---------------------------------------------------------------------------------

STACK_TRACE = "pkg.torch.onnx.stack_trace"


def export(model: Model, dynamo: bool, path: Path, full: bool) -> None:
    names = list(model.inputs)
    args = tuple(model.inputs.values())
    options: dict = {"input_names": names, "output_names": ["output"], "opset_version": OPSET}
    if dynamo:
        options["external_data"] = full
        if model.dynamic_batch:
            batch = torch.export.Dim("batch")
            options["dynamic_shapes"] = {"input": {0: batch}}
    elif model.dynamic_batch:
        options["dynamic_axes"] = {name: {0: "batch"} for name in [*names, "output"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.module, args, str(path), dynamo=dynamo, **options)
    without_stack_traces(path)


def without_stack_traces(path: Path) -> None:
    """Drop the Python stack traces the dynamo exporter keeps on each node: they name files of the
    machine that exported the model, and nothing reads them."""
    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != STACK_TRACE]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(model, str(path))


def write(name: str, exporter: str, full: bool, out: Path) -> dict:
    torch.manual_seed(0)
    model = MODELS[name](full)
    model.module.eval()
    path = out / f"{name}.{exporter}.onnx"
    with torch.no_grad():
        expected = model.module(*model.inputs.values()).numpy()
        export(model, EXPORTERS[exporter], path, full)
    feeds = {k: v.numpy() for k, v in model.inputs.items()}
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    (got,) = outputs.values()
    difference = float(np.max(np.abs(got - expected)) / max(np.max(np.abs(expected)), 1e-30))
    if difference > AGREEMENT:
        sys.exit(f"{path}: onnxruntime differs from PyTorch by {difference:.2e} of the output's peak")
    arrays = {f"input:{k}": v for k, v in feeds.items()}
    arrays.update({f"output:{k}": v for k, v in outputs.items()})
    arrays["torch:output"] = expected
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    opset = next(o.version for o in onnx.load(str(path), load_external_data=False).opset_import if o.domain == "")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, opset {opset}, ort vs torch {difference:.1e})")
    return {"model": name, "exporter": exporter, "file": path.name, "sizes": model.sizes, "opset": opset,
            "ort_vs_torch": float(f"{difference:.2e}"),
            "versions": {"torch": torch.__version__.split("+")[0], "torchvision": torchvision.__version__.split("+")[0]}}


# ---- quantized -------------------------------------------------------------------------------

# scheme -> how onnxruntime's quantization tool makes it
SCHEMES = {
    "qdq_per_channel": {"quant_format": "QDQ", "per_channel": True},
    "qdq_per_tensor": {"quant_format": "QDQ", "per_channel": False},
    "qoperator": {"quant_format": "QOperator", "per_channel": False},  # QLinearConv, QGemm, QLinearAdd, ...
    "qoperator_per_channel": {"quant_format": "QOperator", "per_channel": True},
    "dynamic": {},  # quantize_dynamic: DynamicQuantizeLinear and MatMulInteger
}
# a CNN in each static scheme: the QOperator ones take the same scales as the QDQ ones of their
# channel scheme, and onnxruntime runs every one of their convolutions on its integer kernels
QUANTIZED = [(cnn, scheme) for cnn in ("resnet18", "mobilenet_v2") for scheme in SCHEMES if scheme != "dynamic"] + \
    [("mlp", "dynamic"), ("ffn", "dynamic")]
CALIBRATION = 8  # random inputs the static schemes take their ranges from


def batchnorm_statistics(model: Model) -> None:
    """Batch normalizations take their running statistics from random batches like the input."""
    norms = [m for m in model.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a plain average over the batches
    model.module.train()
    with torch.no_grad():
        for _ in range(CALIBRATION):
            model.module(*(torch.randn(4, *v.shape[1:]) for v in model.inputs.values()))
    model.module.eval()


def with_quantized_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with every int8 or uint8 tensor its nodes make as an output too (after its own
    outputs), and their names. A com.microsoft op's result has its first input's type."""
    typed = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    typed.update((t.name, t.data_type) for t in model.graph.initializer)
    typed.update((v.name, v.type.tensor_type.elem_type) for v in model.graph.input)
    outputs = {o.name for o in model.graph.output}
    names = []
    for node in model.graph.node:
        elem = typed.get(node.output[0]) or typed.get(node.input[0])
        if elem in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) and node.output[0] not in outputs:
            typed[node.output[0]] = elem
            names.append(node.output[0])
            model.graph.output.append(onnx.helper.make_tensor_value_info(node.output[0], elem, None))
    return model, names


class RandomInputs:
    """The calibration data reader onnxruntime's quantize_static reads: random inputs."""

    def __init__(self, model: Model):
        self.batches = iter([{k: torch.randn(v.shape).numpy() for k, v in model.inputs.items()}
                             for _ in range(CALIBRATION)])

    def get_next(self) -> dict | None:
        return next(self.batches, None)


def write_quantized(name: str, scheme: str, full: bool, out: Path) -> dict:
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    torch.manual_seed(0)
    model = MODELS[name](full)
    batchnorm_statistics(model)
    path = out / f"{name}.{scheme}.onnx"
    float_path, prepared = out / f"{name}.{scheme}.float.onnx", out / f"{name}.{scheme}.prepared.onnx"
    with torch.no_grad():
        export(model, EXPORTERS["legacy"], float_path, full)
    quant_pre_process(str(float_path), str(prepared))
    options = SCHEMES[scheme]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if scheme == "dynamic":
            quantize_dynamic(str(prepared), str(path))
        else:
            quantize_static(str(prepared), str(path), RandomInputs(model), per_channel=options["per_channel"],
                            quant_format=getattr(QuantFormat, options["quant_format"]))
    feeds = {k: v.numpy() for k, v in model.inputs.items()}
    run = lambda p: onnxruntime.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    (got,), (reference,) = run(str(path)), run(str(float_path))
    float_path.unlink()
    prepared.unlink()
    arrays = {**{f"input:{k}": v for k, v in feeds.items()}, "output:output": got, "float:output": reference}
    if scheme != "dynamic":
        augmented, names = with_quantized_outputs(onnx.load(str(path)))
        arrays.update((f"quantized:{k}", v) for k, v in zip(names, run(augmented.SerializeToString())[1:]))
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    error = float(np.max(np.abs(got - reference)) / max(np.max(np.abs(reference)), 1e-30))
    ops = sorted({n.op_type for n in onnx.load(str(path)).graph.node})
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB, int8 vs float {error:.1e} of the peak)")
    return {"model": name, "exporter": "legacy", "quantization": scheme, "file": path.name,
            "sizes": model.sizes, "opset": OPSET, "int8_vs_float": float(f"{error:.2e}"), "ops": ops,
            "versions": {"torch": torch.__version__.split("+")[0], "onnxruntime": onnxruntime.__version__}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"which of {', '.join(MODELS)} (default: all)")
    parser.add_argument("-o", "--output-dir", type=Path, required=True)
    parser.add_argument("--full", action="store_true", help="the full-size models, for the benchmarks")
    parser.add_argument("--exporter", choices=list(EXPORTERS), action="append", help="which (default: both)")
    parser.add_argument("--quantized", action="store_true", help="the int8 models of QUANTIZED (of the models named)")
    options = parser.parse_args()
    unknown = sorted(set(options.models) - set(MODELS))
    if unknown:
        parser.error(f"no model {', '.join(unknown)}; there are {', '.join(MODELS)}")
    if not options.full and FULL_ONLY & set(options.models):
        parser.error(f"{', '.join(sorted(FULL_ONLY & set(options.models)))}: only with --full")
    options.output_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = options.output_dir / "manifest.json"
    manifest = {e["file"]: e for e in (json.loads(manifest_path.read_text()) if manifest_path.exists() else [])}
    if options.quantized:
        written = [write_quantized(name, scheme, options.full, options.output_dir) for name, scheme in QUANTIZED
                   if not options.models or name in options.models]
    else:
        written = [write(name, exporter, options.full, options.output_dir)
                   for name in options.models or [m for m in MODELS if options.full or m not in FULL_ONLY]
                   for exporter in options.exporter or EXPORTERS]
    manifest.update((e["file"], e) for e in written)
    manifest_path.write_text(json.dumps([manifest[k] for k in sorted(manifest)], indent=1) + "\n")


if __name__ == "__main__":
    main()
