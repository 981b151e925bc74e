"""A compiled program: what one `.kpu` object file holds."""

from __future__ import annotations

from dataclasses import dataclass, field

from .graph import Graph
from .kernel import Kernel


@dataclass
class Program:
    name: str
    source: str  # the input file the compiler read (base name)
    target: str  # the machine class the tiling was chosen for
    graph: Graph
    kernels: list[Kernel] = field(default_factory=list)
    objective: str = "latency"  # what the tiler ranked by (`kpu-kernel-compiler --objective`)
    # groups of consecutive kernels (by name, at least two) that run at once, band by band: each
    # member after the first reads rows of the one before's result as they are written (a link
    # tensor, kept in L3), so the loader interleaves their tile ops by rows
    chains: list[list[str]] = field(default_factory=list)

    def spans(self) -> list[tuple[int, int]]:
        """Each kernel (by position) -> the first and last position of the kernels running while
        it runs: its chain's, or its own."""
        return chain_spans(self.kernels, self.chains)


def chain_spans(kernels: list[Kernel], chains: list[list[str]]) -> list[tuple[int, int]]:
    """`Program.spans` of kernels in execution order and their chains (by kernel name)."""
    out = [(i, i) for i in range(len(kernels))]
    position = {k.name: i for i, k in enumerate(kernels)}
    for chain in chains:
        members = [position[name] for name in chain]
        for i in members:
            out[i] = (min(members), max(members))
    return out
