"""``neuron-dra-scheduler-extender``: settings, wiring, run.

The settings are read before anything else is imported: ``--help`` and a bad setting answer
at once, without loading the Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_dra_common.runtime import Service

    from neuron_dra_scheduler_extender.settings import ExtenderSettings

__all__ = ["build", "main"]

log = logging.getLogger(__name__)

NAME = "scheduler-extender"
PROG = "neuron-dra-scheduler-extender"


async def build(settings: ExtenderSettings) -> Service:
    """Watch Nodes and Pods (the pods' annotations rebuild who holds what), serve the verbs
    over HTTPS with client certificates on ``verbs_port``, the probes and metrics on
    ``http_port``; ready once both watches have listed."""
    from neuron_dra_common.kube import connect
    from neuron_dra_common.runtime import HealthServer, Service
    from neuron_dra_common.runtime.process import limits_of

    from neuron_dra_scheduler_extender.cluster import KubeCluster
    from neuron_dra_scheduler_extender.extender import Extender
    from neuron_dra_scheduler_extender.tls import server_context
    from neuron_dra_scheduler_extender.verbs import body_limits, routes

    # Before the API is reached: a bad certificate setting stops the start at once.
    tls = server_context(settings)
    client = await connect(kubeconfig=settings.kubeconfig or None)
    cluster = KubeCluster(client)
    extender = Extender(cluster)
    cluster.follow(extender)

    service = Service(name=NAME, settings=settings)
    service.add_task("nodes", cluster.nodes.run, stop=cluster.nodes.stop)
    service.add_task("pods", cluster.pods.run, stop=cluster.pods.stop)
    service.add_readiness("synced", lambda: cluster.synced)
    service.on_shutdown(client.close)
    verbs = HealthServer(
        host=settings.http_host, port=settings.verbs_port, limits=limits_of(settings), tls=tls
    )
    verbs.add_readiness("synced", lambda: cluster.synced)
    limits = body_limits(args_max_body=settings.max_args_bytes)
    for path, handler in routes(extender, ready=lambda: cluster.synced).items():
        verbs.add_json_post(path, handler, max_body=limits[path])
    await verbs.start()  # a start that fails here closes the client (see runtime.process)
    # Stopped first at shutdown (the callbacks run in reverse): no verb is answered once the
    # API client is closed.
    service.on_shutdown(verbs.stop)
    log.info(
        "extender verbs listening",
        extra={"port": verbs.port, "scheme": "https" if tls else "http", "client_auth": bool(tls)},
    )
    return service


def main(argv: Sequence[str] | None = None) -> int:
    from neuron_dra_common.runtime.process import serve

    from neuron_dra_scheduler_extender.settings import ExtenderSettings

    return serve(ExtenderSettings, build, name=NAME, prog=PROG, argv=argv)
