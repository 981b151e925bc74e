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
