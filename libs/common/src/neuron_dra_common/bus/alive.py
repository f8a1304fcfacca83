"""Alive beats on ``NEURON_ALIVE``: the bus keeps each node's last one for its TTL.

A ttl-mode agent publishes a message with no body on ``neuron.alive.<node token>`` every
interval, with the header ``Nats-TTL`` (whole seconds) and who sent it. The server drops the
message when its TTL runs out, so the subjects the stream holds are the nodes that beat
within their TTL. :class:`AliveView` asks for them with one ``STREAM.INFO`` request (paged
by the server beyond 100,000 subjects) and reads one node's last beat back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from neuron_dra_common.bus.declarations import ALIVE
from neuron_dra_common.bus.errors import PublishError
from neuron_dra_common.events.base import SUBJECT_ROOT, subject_token

__all__ = ["AliveBeat", "AlivePublisher", "AliveView", "Blind", "alive_subject"]

_PREFIX: Final = f"{SUBJECT_ROOT}.alive."
_TTL: Final = "Nats-TTL"
_SEQUENCE: Final = "Neuron-Seq"
_INSTANCE: Final = "Neuron-Instance"
_BOOT: Final = "Neuron-Boot"


def alive_subject(node: str) -> str:
    """Where ``node``'s alive beats go.

    >>> alive_subject("ip-10-0-0-1.ec2.internal")
    'neuron.alive.ip-10-0-0-1_ec2_internal'
    """
    return _PREFIX + subject_token(node)


class AliveBeat(msgspec.Struct, frozen=True, kw_only=True):
    """A node's last alive beat as the bus holds it."""

    sequence: int
    instance: str
    boot_id: str
    stored_at: datetime | None


class AlivePublisher:
    """Publishes one node's alive beats and waits for JetStream to store each."""

    def __init__(self, js: JetStreamContext, *, node: str, ack_timeout: float = 2.0) -> None:
        self._js = js
        self._subject = alive_subject(node)
        self._ack_timeout = ack_timeout

    async def publish(self, *, ttl: int, sequence: int, instance: str, boot_id: str) -> None:
        """One beat the bus keeps ``ttl`` seconds; :class:`PublishError` when not stored."""
        headers = {
            _TTL: f"{ttl}s",
            _SEQUENCE: str(sequence),
            _INSTANCE: instance,
            _BOOT: boot_id,
        }
        try:
            await self._js.publish(
                self._subject,
                b"",
                timeout=self._ack_timeout,
                stream=ALIVE.name,
                headers=headers,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            raise PublishError(f"{self._subject}: {exc!r}") from exc


class Blind(Exception):
    """The bus's answer cannot be trusted (the message says why): judge nobody meanwhile."""


class _State(msgspec.Struct):
    first_seq: int = 0
    subjects: dict[str, int] | None = None


class _Cluster(msgspec.Struct):
    leader: str = ""


class _ApiError(msgspec.Struct):
    description: str = ""


class _Info(msgspec.Struct):
    state: _State | None = None
    cluster: _Cluster | None = None
    total: int = 0
    error: _ApiError | None = None


_decode_info = msgspec.json.Decoder(_Info).decode


class AliveView:
    """What ``NEURON_ALIVE`` holds now, as one reader (the failure detector) sees it.

    :meth:`tokens` raises :class:`Blind` when the answer cannot be trusted: the request
    failed, the stream's leader changed since the last answer (its replicas may have dropped
    beats while publishes were refused during the election), or its first sequence went back
    (the stream was restored or recreated).
    """

    def __init__(self, nc: Client, js: JetStreamContext, *, timeout: float = 2.0) -> None:
        self._nc = nc
        self._js = js
        self._timeout = timeout
        self._leader: str | None = None
        self._first_seq = 0
        #: requests sent (one per page of an answer)
        self.requests = 0

    async def tokens(self) -> set[str]:
        """The subject tokens (:func:`~neuron_dra_common.events.base.subject_token`) of the
        nodes whose last alive beat the stream holds."""
        found: set[str] = set()
        offset = 0
        while True:
            body = msgspec.json.encode({"subjects_filter": f"{_PREFIX}*", "offset": offset})
            self.requests += 1
            try:
                msg = await self._nc.request(
                    f"$JS.API.STREAM.INFO.{ALIVE.name}", body, timeout=self._timeout
                )
                info = _decode_info(msg.data)
            except (nats.errors.Error, TimeoutError, msgspec.DecodeError) as exc:
                raise Blind(f"{ALIVE.name} not answered: {exc!r}") from exc
            if info.error is not None or info.state is None:
                why = info.error.description if info.error else "no state in the answer"
                raise Blind(f"{ALIVE.name} not answered: {why}")
            leader = info.cluster.leader if info.cluster else ""
            changed = self._leader is not None and leader != self._leader
            back = info.state.first_seq < self._first_seq
            self._leader, self._first_seq = leader, info.state.first_seq
            if changed:
                raise Blind(f"{ALIVE.name} has a new leader ({leader or 'none'})")
            if back:
                raise Blind(f"{ALIVE.name} went back to sequence {info.state.first_seq}")
            page = info.state.subjects or {}
            found.update(subject[len(_PREFIX) :] for subject in page)
            offset += len(page)
            if not page or offset >= info.total:
                return found

    async def last(self, node: str) -> AliveBeat | None:
        """``node``'s last alive beat; None when the stream holds none (or cannot be read)."""
        try:
            msg = await self._js.get_last_msg(ALIVE.name, alive_subject(node))
        except (nats.errors.Error, TimeoutError):  # none held (NotFoundError), or no answer
            return None
        headers = msg.headers or {}
        try:
            sequence = int(headers.get(_SEQUENCE, "0"))
        except ValueError:
            sequence = 0
        return AliveBeat(
            sequence=sequence,
            instance=headers.get(_INSTANCE, ""),
            boot_id=headers.get(_BOOT, ""),
            stored_at=msg.time,
        )
