"""Coverage-guided fuzz targets (atheris, libFuzzer) for the two decoders that take input
from outside: ``admit``, which every consumer of the bus runs on every message, and the
kubelet plugin's opaque-config decoder, which reads what a user wrote in a claim.

Each target accepts what it is given or refuses it with its own error (``Refused`` with a
dead-letter kind and a reason; ``ConfigError`` naming the field); any other exception is a
crash, which libFuzzer reports with the input that caused it, and the process exits non-zero.

    python -m tests.contracts.atheris_targets intake -runs=20000 -seed=1
    python -m tests.contracts.atheris_targets opaque -runs=20000 -seed=1

The arguments after the target's name are libFuzzer's (``-help=1`` lists them). The code under
test is instrumented as it is imported, so the fuzzer steers toward inputs that reach new
branches of the decoders; ``intake`` starts from a valid event of every type on its own
subject (a corpus written to a temporary folder), so its mutations are near-misses of real
messages rather than noise the JSON decoder refuses at the first byte.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import atheris

# Only the product's code: instrumenting its dependencies too would only slow the start.
with atheris.instrument_imports(include=["neuron_dra_common", "neuron_dra_kubelet_plugin"]):
    from neuron_dra_common.bus import IntakeLimits, Refused, admit
    from neuron_dra_common.bus.deadletter import DeadLetterKind
    from neuron_dra_common.events import EVENT_TYPES
    from neuron_dra_kubelet_plugin.config import (
        API_VERSIONS,
        KINDS,
        ConfigError,
        decode_parameters,
    )

# After the instrumented imports: the samples use the modules instrumented above.
from neuron_dra_common.events import encode

from tests.contracts.fuzz import SAMPLES

LIMITS = IntakeLimits(max_message_bytes=64 * 1024, max_inventory_devices=64)
_KINDS_OF_DEAD_LETTER = set(get_args(DeadLetterKind))
#: Every event type's sample, on its own subject: the corpus ``intake`` starts from.
_SEEDS = tuple(SAMPLES[name](1) for name in sorted(SAMPLES))
#: The samples' subjects and a few others, so the fuzzer meets the subject checks too.
SUBJECTS = (
    *(event.subject for event in _SEEDS),
    "neuron.health.trn2-0.node",
    "neuron.rpc.allocator",
    "neuron.inventory.*",
)
#: Field names the two config kinds have, and a few they do not.
CONFIG_FIELDS = ("logicalNeuronCore", "ultraserverMode", "mode", "cores", "")


def intake(data: bytes) -> None:
    """One message on one subject (the first byte picks it, the rest is the payload): an
    event for that subject, or a reasoned refusal."""
    if not data:
        return
    subject, payload = SUBJECTS[data[0] % len(SUBJECTS)], data[1:]
    try:
        event = admit(payload, subject=subject, limits=LIMITS)
    except Refused as refused:
        if refused.kind not in _KINDS_OF_DEAD_LETTER or not str(refused):
            raise AssertionError(f"refusal without a kind or a reason: {refused!r}") from None
        return
    if type(event).event_type() not in EVENT_TYPES:
        raise AssertionError(f"admitted an event of no known type: {event!r}")


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """A JSON value of any type, nested a little."""
    choice = fdp.ConsumeIntInRange(0, 7 if depth < 2 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return fdp.ConsumeBool()
    if choice == 2:
        return fdp.ConsumeIntInRange(-(2**40), 2**40)
    if choice == 3:
        return fdp.ConsumeRegularFloat()
    if choice in (4, 5):
        return fdp.ConsumeUnicodeNoSurrogates(16)
    if choice == 6:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {
        fdp.ConsumeUnicodeNoSurrogates(8): _value(fdp, depth + 1)
        for _ in range(fdp.ConsumeIntInRange(0, 3))
    }


def opaque(data: bytes) -> None:
    """One claim's ``opaque.parameters``: a config, or an error that names the field."""
    fdp = atheris.FuzzedDataProvider(data)
    parameters: Any
    if fdp.ConsumeIntInRange(0, 9) == 0:
        parameters = _value(fdp)
    else:
        versions = (*API_VERSIONS, fdp.ConsumeUnicodeNoSurrogates(12))
        kinds = (*KINDS, fdp.ConsumeUnicodeNoSurrogates(12))
        parameters = {
            "apiVersion": versions[fdp.ConsumeIntInRange(0, len(versions) - 1)],
            "kind": kinds[fdp.ConsumeIntInRange(0, len(kinds) - 1)],
        }
        for _ in range(fdp.ConsumeIntInRange(0, 3)):
            field = CONFIG_FIELDS[fdp.ConsumeIntInRange(0, len(CONFIG_FIELDS) - 1)]
            parameters[field or fdp.ConsumeUnicodeNoSurrogates(8)] = _value(fdp)
    try:
        decode_parameters(parameters, path="config[0].opaque.parameters")
    except ConfigError as exc:
        if not str(exc).startswith("config[0].opaque.parameters"):
            raise AssertionError(f"an error that does not name the field: {exc}") from None


TARGETS: dict[str, Callable[[bytes], None]] = {"intake": intake, "opaque": opaque}


def intake_corpus(folder: Path) -> Path:
    """One file per sample: its subject's index, then the encoded event."""
    for index, event in enumerate(_SEEDS):
        (folder / f"{type(event).__name__}.bin").write_bytes(bytes([index]) + encode(event))
    return folder


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(
            "usage: python -m tests.contracts.atheris_targets "
            f"{{{','.join(TARGETS)}}} [libFuzzer flags]"
        )
    name, flags = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        corpus = [str(intake_corpus(Path(tmp)))] if name == "intake" else []
        atheris.Setup([sys.argv[0], *flags, *corpus], TARGETS[name])
        atheris.Fuzz()


if __name__ == "__main__":
    main()
