"""Write a multi-layer perceptron as a Domain Flow Graph: each layer `relu(x @ W + b)`, the last
one `sigmoid(x @ W + b)`.

    .venv/bin/python examples/make_mlp.py 256 512 384 256 -o build/mlp3.dfg

makes a batch of 256 rows through layers of 512 -> 384 -> 256 features (examples/mlp3.dfg was
made with `256 1024 512 256 128`). The text follows the domain_flow serializer, as
examples/make_gemm.py does.
"""

from __future__ import annotations

import argparse

from dfx import OutputFiles, itemsize


def mlp_dfg(batch: int, features: list[int], dtype: str = "f32", name: str | None = None) -> str:
    bits = 8 * itemsize(dtype)

    def t(*dims: int) -> str:
        return f"tensor<{'x'.join(map(str, dims))}x{dtype}>"

    nodes: list[str] = []  # "|name|OP|depth|inputs|attrs|outputs" without the "NODE i : " prefix
    edges: list[tuple[int, int, str, int]] = []  # (source node, target node, type, operand slot)

    def node(text: str) -> int:
        nodes.append(text)
        return len(nodes) - 1

    x = node(f"|const.x|CONSTANT|0|||0:x|0:{t(batch, features[0])}")
    layers = len(features) - 1
    for i in range(layers):
        fin, fout = features[i], features[i + 1]
        w = node(f"|const.W{i}|CONSTANT|0|||0:W{i}|0:{t(fin, fout)}")
        b = node(f"|const.b{i}|CONSTANT|0|||0:b{i}|0:{t(fout)}")
        mm = node(f"|matmul|MATMUL|{3 * i + 1}|0:{t(batch, fin)},1:{t(fin, fout)}||0:z{i}|0:{t(batch, fout)}")
        add = node(f"|bias|ADD|{3 * i + 2}|0:{t(batch, fout)},1:{t(fout)}||0:y{i}|0:{t(batch, fout)}")
        act, result = ("SIGMOID", "out") if i == layers - 1 else ("RELU", f"h{i}")
        a = node(f"|{act.lower()}|{act}|{3 * i + 3}|0:{t(batch, fout)}||0:{result}|0:{t(batch, fout)}")
        edges += [(x, mm, t(batch, fin), 0), (w, mm, t(fin, fout), 1), (mm, add, t(batch, fout), 0),
                  (b, add, t(fout), 1), (add, a, t(batch, fout), 0)]
        x = a
    ret = node(f"|output|FUNCTION_RETURN|{3 * layers + 1}|0:{t(batch, features[-1])}|target:memory|0:out|"
               f"0:{t(batch, features[-1])}")
    edges.append((x, ret, t(batch, features[-1]), 0))
    sources = [i for i, n in enumerate(nodes) if "|CONSTANT|" in n]
    return "\n".join([
        f"Domain Flow Graph: {name or 'mlp_' + '_'.join(map(str, [batch, *features]))}",
        "DIRECTED",
        f"RUNNING_NODE_ID {len(nodes) - 1}",
        f"NODES {len(nodes)}",
        *(f"NODE {i} : {n}" for i, n in enumerate(nodes)),
        f"EDGES {len(edges)}",
        *(f"EDGE {s} -> {d} : 0|{'true' if s in sources else 'false'}|{ty}|{bits}|0|{slot}|1,1,1"
          for s, d, ty, slot in edges),
        f"ADJACENCY {len(edges)}",
        *(f"ADJ {s} : {d}" for s, d, _, _ in edges),
        f"SOURCE: {', '.join(map(str, sources))}",
        f"SINK: {ret}",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batch", type=int)
    p.add_argument("features", type=int, nargs="+", help="input features, then each layer's outputs")
    p.add_argument("--dtype", default="f32")
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args()
    if len(args.features) < 2:
        p.error("give the input features and at least one layer's outputs")
    with OutputFiles() as files:
        files.stage(files.claim(args.output), (mlp_dfg(args.batch, args.features, args.dtype) + "\n").encode())
        files.commit()


if __name__ == "__main__":
    main()
