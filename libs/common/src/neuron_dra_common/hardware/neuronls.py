"""Reading ``neuron-ls -j``: one JSON object per device.

The fields used are ``neuron_device``, ``bdf``, ``cpu_affinity``, ``numa_node`` (a string),
``connected_to``, ``nc_count`` (logical cores at the node's LNC),
``logical_neuroncore_config``, ``memory_size`` (bytes), ``neuroncore_ids`` and
``neuron_processes``. Output comes from a command (the real tool) or a file. Nothing here
raises on odd output: an entry without a usable ``neuron_device`` is reported and skipped; any
other odd field is reported and left out.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from neuron_dra_common.hardware.files import ProblemLog
from neuron_dra_common.hardware.model import HardwareProblem

__all__ = [
    "DEFAULT_COMMAND",
    "NeuronLsDevice",
    "NeuronLsResult",
    "parse_neuron_ls",
    "read_neuron_ls",
]

#: How the real tool is run on a node.
DEFAULT_COMMAND: tuple[str, ...] = ("neuron-ls", "-j")


class NeuronLsDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One device as ``neuron-ls -j`` describes it; ``None`` where absent or odd.

    ``process_pids`` are the ``pid`` fields of ``neuron_processes``: who is using the device.
    """

    neuron_device: int
    bdf: str | None = None
    cpu_affinity: str | None = None
    numa_node: int | None = None
    connected_to: tuple[int, ...] = ()
    nc_count: int | None = None
    logical_neuroncore_config: int | None = None
    memory_size: int | None = None
    neuroncore_ids: tuple[int, ...] = ()
    process_pids: tuple[int, ...] = ()


class NeuronLsResult(msgspec.Struct, frozen=True, kw_only=True):
    """Every device ``neuron-ls`` listed, and what could not be read."""

    devices: tuple[NeuronLsDevice, ...] = ()
    problems: tuple[HardwareProblem, ...] = ()


def read_neuron_ls(
    *,
    command: Sequence[str] | None = None,
    path: Path | None = None,
    timeout: float = 30.0,
) -> NeuronLsResult:
    """Run ``command`` (default ``neuron-ls -j``) or read ``path``, and parse the output.

    Exactly one source is used: ``path`` when given, else the command. A command that is
    missing, fails or times out is a problem in the result, not an exception.
    """
    problems = ProblemLog()
    if path is not None:
        text = problems.text(path)
        if text is None:
            return NeuronLsResult(problems=problems.items)
        return parse_neuron_ls(text, source=str(path))
    argv = list(command or DEFAULT_COMMAND)
    source = " ".join(argv)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        problems.add(source, "command not found")
        return NeuronLsResult(problems=problems.items)
    except (OSError, subprocess.TimeoutExpired) as exc:
        problems.add(source, f"could not run: {exc}")
        return NeuronLsResult(problems=problems.items)
    if done.returncode != 0:
        stderr = done.stderr.decode("utf-8", "replace").strip()[:200]
        problems.add(source, f"exit status {done.returncode}: {stderr}")
        return NeuronLsResult(problems=problems.items)
    return parse_neuron_ls(done.stdout, source=source)


def parse_neuron_ls(output: str | bytes, *, source: str = "neuron-ls -j") -> NeuronLsResult:
    """Parse ``neuron-ls -j`` output; ``source`` names it in problems."""
    problems = ProblemLog()
    try:
        data = msgspec.json.decode(output)
    except msgspec.DecodeError as exc:
        problems.add(source, f"not JSON: {exc}")
        return NeuronLsResult(problems=problems.items)
    if not isinstance(data, list):
        problems.add(source, f"expected a list of devices, got {type(data).__name__}")
        return NeuronLsResult(problems=problems.items)
    devices: dict[int, NeuronLsDevice] = {}
    for position, entry in enumerate(data):
        where = f"{source}[{position}]"
        if not isinstance(entry, dict):
            problems.add(where, f"expected an object, got {type(entry).__name__}")
            continue
        device = _parse_entry(entry, where=where, problems=problems)
        if device is None:
            continue
        if device.neuron_device in devices:
            problems.add(
                where, "device listed twice; first entry kept", device=device.neuron_device
            )
            continue
        devices[device.neuron_device] = device
    ordered = tuple(devices[i] for i in sorted(devices))
    return NeuronLsResult(devices=ordered, problems=problems.items)


def _parse_entry(
    entry: dict[str, Any], *, where: str, problems: ProblemLog
) -> NeuronLsDevice | None:
    index = _int(entry.get("neuron_device"))
    if index is None or index < 0:
        problems.add(where, f"neuron_device {entry.get('neuron_device')!r} is not a device index")
        return None

    def field_int(name: str) -> int | None:
        raw = entry.get(name)
        value = _int(raw)
        if raw is not None and value is None:
            problems.add(f"{where}.{name}", f"{raw!r} is not an integer", device=index)
        return value

    def field_str(name: str) -> str | None:
        raw = entry.get(name)
        if raw is None or isinstance(raw, str):
            return raw or None
        problems.add(f"{where}.{name}", f"{raw!r} is not a string", device=index)
        return None

    def field_ints(name: str) -> tuple[int, ...]:
        raw = entry.get(name)
        if raw is None:
            return ()
        values = [_int(v) for v in raw] if isinstance(raw, list) else [None]
        if any(v is None for v in values):
            problems.add(f"{where}.{name}", f"{raw!r} is not a list of integers", device=index)
            return ()
        return tuple(v for v in values if v is not None)

    processes = entry.get("neuron_processes")
    pids: tuple[int, ...] = ()
    if isinstance(processes, list):
        pids = tuple(
            pid
            for p in processes
            if isinstance(p, dict) and (pid := _int(p.get("pid"))) is not None
        )
    elif processes is not None:
        problems.add(f"{where}.neuron_processes", f"{processes!r} is not a list", device=index)
    return NeuronLsDevice(
        neuron_device=index,
        bdf=field_str("bdf"),
        cpu_affinity=field_str("cpu_affinity"),
        numa_node=field_int("numa_node"),
        connected_to=field_ints("connected_to"),
        nc_count=field_int("nc_count"),
        logical_neuroncore_config=field_int("logical_neuroncore_config"),
        memory_size=field_int("memory_size"),
        neuroncore_ids=field_ints("neuroncore_ids"),
        process_pids=pids,
    )


def _int(raw: object) -> int | None:
    """An int from a JSON int or a decimal string (``numa_node`` is a string)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip(), 10)
        except ValueError:
            return None
    return None
