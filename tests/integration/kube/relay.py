"""A TCP relay to the local stack's apiserver that a test can cut and restore, like a network
partition, and a client that talks through it."""

from __future__ import annotations

import asyncio
import contextlib

from neuron_dra_common.kube import KubeClient, load_kubeconfig

from tests.fixtures.stack import KubeStack


class Cuttable:
    """Relays every connection to ``host:port``; :meth:`cut` drops them all at once.

    >>> relay = Cuttable("127.0.0.1", 6443)
    >>> port = await relay.start()
    >>> await relay.cut()
    >>> await relay.start(port)  # the same address answers again
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.relays: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", port)
        bound: int = self.server.sockets[0].getsockname()[1]
        return bound

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        assert this is not None
        self.relays.add(this)
        ends = [writer]
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            ends.append(up_writer)

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(OSError):
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except OSError:
            pass  # the apiserver did not answer: the client sees its connection dropped
        finally:
            # Both sockets are closed here, whichever way the relay ended, so none is left
            # for the garbage collector (and its ResourceWarning) to find.
            for end in ends:
                end.transport.abort()
            self.relays.discard(this)

    async def cut(self) -> None:
        """Stop answering and drop every open connection mid-stream."""
        assert self.server is not None
        self.server.close()
        relays = list(self.relays)
        for relay in relays:
            relay.cancel()
        await asyncio.gather(*relays, return_exceptions=True)
        await self.server.wait_closed()


async def relayed(kube_stack: KubeStack) -> tuple[Cuttable, int, KubeClient]:
    """A started relay to the stack's apiserver, its port, and a client that goes through it."""
    config = await load_kubeconfig(kube_stack.kubeconfig)
    host, _, port = config.server.removeprefix("https://").rpartition(":")
    relay = Cuttable(host, int(port))
    relay_port = await relay.start()
    return relay, relay_port, KubeClient(config.with_server(f"https://{host}:{relay_port}"))
