"""Operators and fusion: every graph without a convolution, fused and unfused, on `standard`.

    .venv/bin/python benchmarks/operators.py

Writes the section "Operators and fusion" of benchmarks/RESULTS.md: per graph, the kernels with
and without fusion, DRAM bytes and simulated cycles of each, and the array and vector units'
busy share of the fused run. Everything runs in-process with the greedy binder, timing only (the
cycles do not depend on the values).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import machine, today, write_section  # noqa: E402

from hardware import load_machine  # noqa: E402
from kernel_compiler import CompileError, compile_graph, load_graph, load_target  # noqa: E402
from loader import bind_greedy, bind_program, simulate  # noqa: E402
from loader.report import dram_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "standard.json"
GRAPHS = [ROOT / "examples" / "mlp3.dfg", ROOT / "tests" / "data" / "softmax_tosa.dfg"] + sorted(
    p for p in (ROOT / "tests" / "data" / "dfg").iterdir()
    if p.suffix in (".dfg", ".json") and not p.name.startswith(("dfg__mobilenet", "tosa__oneLayerMLP", "tosa__twoLayerMLP")))


def run(path: Path, fuse: bool) -> dict:
    graph, warnings = load_graph(str(path))
    program = compile_graph(graph, str(path), load_target(str(CONFIG)), fuse=fuse, warnings=warnings)
    machine_ = load_machine(str(CONFIG))
    sim = simulate(program, machine_, bind_program(program, machine_, str(path), bind_greedy))

    def busy(prefix: str) -> float:
        units = [u for name, u in sim.units.items() if name.startswith(prefix)]
        return sum(u.busy_cycles for u in units) / (len(units) * sim.cycles)

    return {"kernels": len(program.kernels), "dram": sum(dram_bytes(sim).values()), "cycles": sim.cycles,
            "array": busy("array"), "vector": busy("vec")}


def main() -> None:
    rows, skipped = [], []
    for path in GRAPHS:
        try:
            fused, unfused = run(path, True), run(path, False)
        except CompileError as e:  # a graph that does not compile is listed with its reason
            skipped.append(f"- {path.name}: {str(e).replace(str(ROOT) + '/', '')}")
            continue
        change = (fused["dram"] - unfused["dram"]) / unfused["dram"]
        rows.append(f"| {path.name} | {unfused['kernels']} -> {fused['kernels']} | {unfused['dram']:,} | "
                    f"{fused['dram']:,} | {change:+.1%} | {unfused['cycles']:,} | {fused['cycles']:,} | "
                    f"{fused['array']:.1%} | {fused['vector']:.1%} |")
    text = f"""Machine: {machine()}. Date: {today()}.
Reproduce: `.venv/bin/python benchmarks/operators.py`.

Each graph is compiled for `configs/standard.json` with fusion (the default) and with
`--no-fusion`, after the compiler's passes (LINEAR -> MATMUL; with fusion, the softmax and
layernorm chains recognised as one op, without it left as their ops), bound by the greedy
binder and simulated timing-only. DRAM bytes are what the simulator moved over external memory
(reads and writes); array and vector are each unit kind's busy cycles over the fused run's
cycles, averaged over the compute tiles.

| graph | kernels unfused -> fused | DRAM bytes unfused | DRAM bytes fused | DRAM change | cycles unfused | cycles fused | array busy (fused) | vector busy (fused) |
|---|---|---:|---:|---:|---:|---:|---:|---:|
""" + "\n".join(rows) + ("\n\nNot run:\n" + "\n".join(skipped) if skipped else "")
    write_section("Operators and fusion", text)
    print(text)


if __name__ == "__main__":
    main()
