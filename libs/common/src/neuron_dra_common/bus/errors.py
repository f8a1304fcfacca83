"""Errors of the bus, and which nats-py errors are worth another try."""

from __future__ import annotations

import asyncio
from typing import Final

import nats.errors
import nats.js.errors

__all__ = ["TRANSIENT", "PermanentError", "PublishError", "RetryLater"]

#: Failures that go away once the connection or JetStream is back (a restart, a leader
#: election): the same request with the same ``Nats-Msg-Id`` is safe to send again.
TRANSIENT: Final[tuple[type[BaseException], ...]] = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    nats.js.errors.TooManyStalledMsgsError,
)


class PermanentError(Exception):
    """Raised by a handler when retrying cannot help: the message goes to the dead letter now.

    >>> raise PermanentError("NodeInventory ip-1: hardware.devices is empty")
    """


class PublishError(Exception):
    """A publish did not reach JetStream before its deadline; the message names the subject."""


class RetryLater(Exception):
    """Raised by a request handler that cannot answer yet (it is still starting): the
    requester gets the message as an error and asks again; the request is not a dead letter.
    """
