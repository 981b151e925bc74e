"""The machine class the compiler tiles for: capacities and array size, nothing else.

The compiler never sees addresses, engines or timing; it reads a config only to learn how
much fits where, so the object it writes runs on any machine at least this large.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import ConfigError, Machine, load_machine

from .errors import CompileError


@dataclass(frozen=True)
class Level:
    banks: int  # banks (L2), tiles (L3) or buffers (L1) one compute tile may use
    bank_bytes: int


@dataclass(frozen=True)
class Target:
    name: str
    rows: int
    cols: int
    compute_tiles: int
    l3: Level
    l2: Level
    l1: Level
    dataflows: tuple[str, ...]
    line_bytes: int = 1  # the binder starts every buffer on a line: each takes whole lines


def load_target(config: str, accelerator: str | None = None) -> Target:
    """The target of a config file, or of a shipped config named without suffix; `accelerator`
    picks the KPU of a system-schema file that has several."""
    try:
        m = load_machine(config, accelerator)
    except ConfigError as e:
        raise CompileError(str(e)) from None
    return target_from_machine(m)


def target_from_machine(m: Machine) -> Target:
    """The target of a machine already read (by `kpu-dse`, from a config document it built)."""
    tiles = m.compute.tiles
    # L3 and L2 are shared: each compute tile plans with its share of the banks. The L3 tiles
    # are one address space, interleaved across them: one bank, a share of its bytes.
    return Target(
        name=m.name,
        rows=m.compute.rows,
        cols=m.compute.cols,
        compute_tiles=tiles,
        l3=Level(1, m.l3.count * m.l3.bytes // tiles),
        l2=Level(max(1, m.l2.count // tiles), m.l2.bytes),
        l1=Level(m.l1.count, m.l1.bytes),
        dataflows=m.compute.dataflows,
        line_bytes=m.line_bytes,
    )
