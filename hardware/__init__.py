"""The machine: config loading and validation, timing models, simulator core."""

from hardware.config import (
    MAX_INT_CHARS,
    ConfigError,
    Unreadable,
    load_machine,
    machine_from_dict,
    read_document,
    read_document_file,
    resolve_config,
)
from hardware.energy import AreaModel, EnergyCounts, EnergyModel, kernel_energy, machine_area, total_energy
from hardware.machine import (
    DATAFLOWS,
    VECTOR_CYCLES_PER_ELEMENT,
    VECTOR_OP_CLASSES,
    ComputeFabric,
    Engines,
    ExternalMemory,
    HostLink,
    Machine,
    MemoryLevel,
    VectorUnit,
)
from hardware.simulator import PhaseSpan, SimResult, Simulator, UnitStats
from hardware.task import UNIT_PREFIX, Task
from hardware.trace import trace_json
from hardware.units import move_timer
from hardware.units.systolic_array import matmul_cycles
from hardware.units.vector_unit import vector_cycles

__all__ = [
    "AreaModel",
    "DATAFLOWS",
    "ComputeFabric",
    "ConfigError",
    "EnergyCounts",
    "EnergyModel",
    "Engines",
    "ExternalMemory",
    "HostLink",
    "MAX_INT_CHARS",
    "Machine",
    "MemoryLevel",
    "PhaseSpan",
    "SimResult",
    "Simulator",
    "Task",
    "UNIT_PREFIX",
    "UnitStats",
    "Unreadable",
    "VECTOR_CYCLES_PER_ELEMENT",
    "VECTOR_OP_CLASSES",
    "VectorUnit",
    "kernel_energy",
    "load_machine",
    "machine_area",
    "machine_from_dict",
    "matmul_cycles",
    "move_timer",
    "read_document",
    "read_document_file",
    "resolve_config",
    "total_energy",
    "trace_json",
    "vector_cycles",
]
