"""Write a GEMM as a Domain Flow Graph: `.venv/bin/python examples/make_gemm.py M N K [dtype] -o gemm.dfg`.

The text follows the domain_flow serializer (examples/matmul_256.dfg was made with it).
"""

from __future__ import annotations

import argparse

from dfx import OutputFiles, itemsize


def gemm_dfg(M: int, N: int, K: int, dtype: str = "f32", name: str | None = None) -> str:
    a, b, c = f"tensor<{M}x{K}x{dtype}>", f"tensor<{K}x{N}x{dtype}>", f"tensor<{M}x{N}x{dtype}>"
    bits = 8 * itemsize(dtype)
    name = name or f"gemm_{M}x{N}x{K}_{dtype}"
    return "\n".join([
        f"Domain Flow Graph: {name}",
        "DIRECTED",
        "RUNNING_NODE_ID 3",
        "NODES 4",
        f"NODE 0 : |const.A|CONSTANT|0|||0:A|0:{a}",
        f"NODE 1 : |const.B|CONSTANT|0|||0:B|0:{b}",
        f"NODE 2 : |matmul|MATMUL|1|0:{a},1:{b}||0:C|0:{c}",
        f"NODE 3 : |C|FUNCTION_RETURN|2|0:{c}|target:memory|0:C|0:{c}",
        "EDGES 3",
        f"EDGE 0 -> 2 : 0|true|{a}|{bits}|0|0|1,1,1",
        f"EDGE 1 -> 2 : 0|true|{b}|{bits}|0|1|1,1,1",
        f"EDGE 2 -> 3 : 0|false|{c}|{bits}|0|0|1,1,1",
        "ADJACENCY 3",
        "ADJ 0 : 2",
        "ADJ 1 : 2",
        "ADJ 2 : 3",
        "SOURCE: 0, 1",
        "SINK: 3",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("M", type=int)
    p.add_argument("N", type=int)
    p.add_argument("K", type=int)
    p.add_argument("dtype", nargs="?", default="f32")
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args()
    with OutputFiles() as files:
        files.stage(files.claim(args.output), (gemm_dfg(args.M, args.N, args.K, args.dtype) + "\n").encode())
        files.commit()


if __name__ == "__main__":
    main()
