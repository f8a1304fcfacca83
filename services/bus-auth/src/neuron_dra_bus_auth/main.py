"""``neuron-dra-bus-auth``: settings, wiring, run.

The settings are read before anything else is imported: ``--help`` and a bad setting answer
at once, without loading the bus or the Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from neuron_dra_common.runtime import Service

    from neuron_dra_bus_auth.settings import BusAuthSettings

__all__ = ["AUTH_SUBJECT", "build", "main"]

NAME: Final = "bus-auth"
PROG: Final = "neuron-dra-bus-auth"
#: Where the NATS server asks (auth callout, nats-server 2.10+).
AUTH_SUBJECT: Final = "$SYS.REQ.USER.AUTH"


async def build(settings: BusAuthSettings) -> Service:
    """Read the issuer seed, connect to the apiserver and NATS, answer requests."""
    import asyncio
    from pathlib import Path

    from neuron_dra_common.bus import Bus, BusCredentials, limits_of
    from neuron_dra_common.kube import connect
    from neuron_dra_common.runtime import Service

    from neuron_dra_bus_auth.callout import Callout
    from neuron_dra_bus_auth.identities import Review
    from neuron_dra_bus_auth.natsjwt import Signer
    from neuron_dra_bus_auth.tokenreview import review_token

    try:
        seed = await asyncio.to_thread(Path(settings.issuer_seed_file).read_bytes)
    except OSError as exc:
        raise RuntimeError(
            f"NEURON_DRA_ISSUER_SEED_FILE={settings.issuer_seed_file}: {exc.strerror}"
        ) from None
    signer = Signer(seed)
    kube = await connect(kubeconfig=settings.kubeconfig or None)

    async def review(token: str) -> Review:
        return await review_token(kube, token, audiences=settings.token_audiences)

    callout = Callout(
        signer=signer,
        review=review,
        namespace=settings.namespace,
        audiences=settings.token_audiences,
        account=settings.account,
        user_seconds=settings.user_seconds,
    )
    credentials = BusCredentials(
        user=settings.nats_user,
        password_file=settings.nats_password_file,
        tls_ca=settings.nats_tls_ca,
        tls_cert=settings.nats_tls_cert,
        tls_key=settings.nats_tls_key,
    )
    bus = await Bus.connect(
        settings.nats_servers, name=NAME, limits=limits_of(settings), credentials=credentials
    )
    stop_answering = await bus.answer(AUTH_SUBJECT, callout.answer)
    stopped = asyncio.Event()

    async def serve() -> None:
        await stopped.wait()

    service = Service(name=NAME, settings=settings)
    service.add_task("callout", serve, stop=stopped.set)
    service.add_readiness("nats", lambda: bus.connected)
    service.on_shutdown(stop_answering)
    service.on_shutdown(bus.close)
    service.on_shutdown(kube.close)
    return service


def main(argv: Sequence[str] | None = None) -> int:
    from neuron_dra_common.runtime import serve

    from neuron_dra_bus_auth.settings import BusAuthSettings

    return serve(BusAuthSettings, build, name=NAME, prog=PROG, argv=argv)
