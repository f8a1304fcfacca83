"""Bringing the local stack up and down.

``up`` starts the components in dependency order (NATS and etcd, the apiserver, the
controller-manager and scheduler, then one simulated kubelet per node of the fleet, and
with ``real_nodes`` that many real kubelets, each with its own containerd),
records each one in ``state.json`` as soon as it starts, waits until it is ready, and
finally waits until every node is Ready. A failure stops whatever was started and says
which component failed, with the tail of its log.

The neuron-dra services (three agents per simulated node, and the cluster services) are
forked by the agent zygote (``stack.zygote``), started first so that it imports their code
once while the control plane starts; each is still a process, session and log of its own,
recorded like any other component.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec
from neuron_dra_common.hardware.simulate import SimNode

from neuron_dra_cli import toolbuild
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import (
    accounts,
    alerting,
    busauth,
    bytecode,
    deviceplugin,
    efa,
    healthprobe,
    kubectl,
    plugin,
    process,
    realdeviceplugin,
    realdriver,
    realnats,
    realnodes,
    services,
    state,
    tracing,
    zygote,
)
from neuron_dra_cli.stack import components as comp
from neuron_dra_cli.stack.fleet import Fleet
from neuron_dra_cli.stack.health import health_components
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.nodes import node_component
from neuron_dra_cli.stack.pki import Pki, write_kubeconfig
from neuron_dra_cli.stack.ultraserver import ultraserver_components

Progress = Callable[[str], None]
T = TypeVar("T")

#: Set for every service of a stack started with ``--insecure-bus``: it then connects to
#: the open bus, and says so in its log, instead of refusing to start without credentials.
INSECURE_BUS_ENV = "NEURON_DRA_INSECURE_BUS"


@dataclass(frozen=True)
class UpOptions:
    fleet: Fleet
    fleet_path: Path
    k8s_version: str
    state_dir: Path
    tracing: bool = False  # start Jaeger and point every neuron-dra service at it
    #: NATS admits clients through the auth callout; every service presents its own token.
    #: False (``--insecure-bus``): an open bus, every service told so by INSECURE_BUS_ENV.
    bus_auth: bool = True
    #: Real kubelets with containerd and runc, beside the simulated nodes (needs root).
    real_nodes: int = 0
    #: The product's discovery and kubelet-plugin DaemonSets on the (one) real node.
    real_node_driver: bool = False
    #: The device-plugin component's DaemonSet on the (one) real node, labelled for it, and
    #: the scheduler extender in kube-scheduler; the simulated nodes stay DRA nodes.
    real_node_device_plugin: bool = False
    #: Fork the Python services from the agent zygote (``stack.zygote``), which imports
    #: their code once, rather than start each as a ``python -m`` of its own.
    agent_zygote: bool = True
    #: The simulated EFA DRA driver on the nodes with EFA interfaces (``stack.efa``).
    efa: bool = False


def _running(c: state.ComponentState) -> process.Running:
    return process.Running(pid=c.pid, start_ticks=c.start_ticks)


class Launcher:
    """Starts components, records each in ``state.json``, and waits until they are ready."""

    def __init__(self, layout: Layout, current: state.StackState, progress: Progress) -> None:
        self.layout = layout
        self.current = current
        self.progress = progress
        #: Added to every component's environment (the trace backend's address, with tracing).
        self.env: dict[str, str] = {}
        #: The agent zygote's socket once it is ready: Python services are forked by it.
        self.zygote: Path | None = None
        #: Started by :meth:`launch` and not seen ready yet.
        self._early: list[_Starting] = []

    def _record(self, entry: state.ComponentState) -> None:
        """Add ``entry``, or replace the one of its name where it stands."""
        old = self.current.components
        if any(c.name == entry.name for c in old):
            new = tuple(entry if c.name == entry.name else c for c in old)
        else:
            new = (*old, entry)
        self.current = msgspec.structs.replace(self.current, components=new)

    def _process(
        self, c: comp.Component, *, log: Path, env: dict[str, str]
    ) -> tuple[process.Running, bool]:
        """Start ``c``: forked by the agent zygote when it is a Python service and the
        zygote runs, else as a process of its own; whether it was forked."""
        if c.module and self.zygote is not None:
            try:
                pid = zygote.spawn(
                    self.zygote,
                    module=c.module,
                    args=c.argv[3:],  # after [python, -m, module]
                    env={**os.environ, **env},
                    log=log,
                    name=c.name,
                )
                return process.running(pid), True
            except zygote.ZygoteError as exc:
                self.progress(
                    f"  {c.name}: {exc}; it and the agents after it start as processes of their own"
                )
                self.zygote = None
        return process.start(c.argv, log_path=log, env=env), False

    def launch(self, c: comp.Component) -> _Starting:
        """Start ``c`` and record it; :meth:`wait` for it to be ready. Until then, whatever
        else this launcher waits for, it notes when ``c`` became ready."""
        started = self._launch(c)
        self._early.append(started)
        return started

    def _note_early(self) -> None:
        """Record the start-to-ready time of each component :meth:`launch` started that is
        ready now."""
        for s in [s for s in self._early if s.component.ready()]:
            self._early.remove(s)
            self._record(msgspec.structs.replace(s.entry, ready_seconds=time.monotonic() - s.t0))
            state.save(self.layout.root, self.current)

    def _launch(self, c: comp.Component) -> _Starting:
        log = self.layout.log(c.name)
        env = {**self.env, **c.env}
        running, forked = self._process(c, log=log, env=env)
        entry = state.ComponentState(
            name=c.name,
            kind=c.kind,
            pid=running.pid,
            start_ticks=running.start_ticks,
            log=str(log),
            ports=c.ports,
            started_at=time.time(),
            argv=tuple(c.argv),
            env=env,
            forked=forked,
        )
        self._record(entry)
        # Recorded before waiting, so `dev down` finds it even if this command dies now.
        state.save(self.layout.root, self.current)
        return _Starting(component=c, running=running, entry=entry, t0=time.monotonic())

    def start(
        self, items: Sequence[comp.Component], *, timeout: float = 90.0, parallel: int = 0
    ) -> None:
        """Start ``items`` and wait until each one is ready, within ``timeout`` seconds of
        its own start.

        ``parallel`` > 0 keeps at most that many starting at once: Python services spend
        their first second importing, and dozens of them at once on a few cores would each
        take the whole batch's time (every one ready late, none early).
        """
        t0 = time.monotonic()
        self._run(list(items), [], timeout=timeout, parallel=parallel)
        names = ", ".join(c.name for c in items) if len(items) <= 3 else f"{len(items)} components"
        self.progress(f"  {names} ready in {time.monotonic() - t0:.1f} s")

    def wait(self, started: Sequence[_Starting], *, timeout: float = 90.0) -> None:
        """Wait until each of ``started`` (from :meth:`launch`) is ready, within ``timeout``
        seconds of its own start."""
        self._note_early()
        pending = [s for s in started if s in self._early]
        for s in pending:
            self._early.remove(s)
        self._run([], pending, timeout=timeout, parallel=0)

    def _run(
        self,
        pending: list[comp.Component],
        starting: list[_Starting],
        *,
        timeout: float,
        parallel: int,
    ) -> None:
        while pending or starting:
            self._note_early()
            while pending and (parallel <= 0 or len(starting) < parallel):
                starting.append(self._launch(pending.pop(0)))
            waiting: list[_Starting] = []
            for s in starting:
                if s.component.ready():
                    self._record(
                        msgspec.structs.replace(s.entry, ready_seconds=time.monotonic() - s.t0)
                    )
                    continue
                log = self.layout.log(s.component.name)
                if not process.alive(s.running):
                    raise CliError(
                        f"{s.component.name} exited while starting; last lines of {log}:\n"
                        + process.tail(log, lines=15)
                    )
                if time.monotonic() - s.t0 > timeout:
                    raise CliError(
                        f"{s.component.name} was not ready {timeout:.0f} s after its start; "
                        f"last lines of {log}:\n" + process.tail(log, lines=15)
                    )
                waiting.append(s)
            if len(waiting) < len(starting):
                state.save(self.layout.root, self.current)
            starting = waiting
            if starting:
                time.sleep(0.05)


@dataclass
class _Starting:
    component: comp.Component
    running: process.Running
    entry: state.ComponentState
    t0: float


def up(opts: UpOptions, *, progress: Progress = print) -> state.StackState:
    """Start the whole stack; return its recorded state once every node is Ready."""
    from neuron_dra_cli import kubebuild

    layout = Layout(opts.state_dir)
    existing = state.load(layout.root)
    if existing is not None:
        live = [c for c in existing.components if process.alive(_running(c))]
        if live:
            raise CliError(
                f"a stack is already running from {layout.root} "
                f"({len(live)} components up); `neuron-dra dev down` first, "
                "or pass another --state-dir"
            )
        state.clear(layout.root)

    # Before anything is built: flags that do not go together, then a machine that cannot
    # run a real node, are told so at once.
    _check_real_node_driver(opts)
    _check_real_node_device_plugin(opts)
    realnodes.check_requirements(opts.real_nodes)
    # Compiles the services' Python modules while the control plane starts (the agent
    # zygote does, importing them all, when it runs).
    warmup = bytecode.start_warmup() if not opts.agent_zygote else bytecode.Warmup(None)
    progress(f"neuron-dra: Kubernetes {opts.k8s_version} binaries")
    bins = kubebuild.ensure_binaries(
        opts.k8s_version, progress=lambda m: progress("  " + m), kubelet=opts.real_nodes > 0
    )
    # Nodes of the fleet on a kubelet release of their own (``kubeletVersion``).
    node_binaries = {
        v: kubebuild.ensure_node_binary(v, progress=lambda m: progress("  " + m))
        for v in sorted({n.kubelet_version for n in opts.fleet.nodes if n.kubelet_version})
    }
    real = _real_node_inputs(opts, progress) if opts.real_nodes > 0 else None
    jaeger_binary = None
    if opts.tracing:
        progress("neuron-dra: Jaeger, the trace backend")
        jaeger_binary = toolbuild.ensure_jaeger(progress=lambda m: progress("  " + m))

    progress("neuron-dra: Alertmanager, the alert receiver")
    alertmanager_binary = toolbuild.ensure_alertmanager(progress=lambda m: progress("  " + m))

    progress(f"neuron-dra: certificates in {layout.pki}")
    pki = Pki(layout.pki)
    admin = pki.client("admin", user="kubernetes-admin", groups=("system:masters",))

    ports = {
        name: process.free_port()
        for name in ("nats", "nats_monitor", "etcd", "etcd_peer", "apiserver", "kcm", "scheduler")
    }
    server = f"https://127.0.0.1:{ports['apiserver']}"
    write_kubeconfig(
        layout.kubeconfig, server=server, ca=pki.ca.cert, pair=admin, user="kubernetes-admin"
    )
    current = state.StackState(
        k8s_version=opts.k8s_version,
        fleet=str(opts.fleet_path),
        kubeconfig=str(layout.kubeconfig),
        apiserver=server,
        nats_url=f"nats://127.0.0.1:{ports['nats']}",
    )
    state.save(layout.root, current)
    launcher = Launcher(layout, current, progress)
    # Work that needs no control plane, or only the apiserver, runs beside the rest.
    background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stack-up")
    try:
        # Imports the services (a few seconds of CPU) while the control plane starts;
        # waited for just before the first of them.
        forker = None
        if opts.agent_zygote:
            layout.ensure_short_nodes()  # where its socket's short path leads
            forker = launcher.launch(comp.agent_zygote(socket=layout.zygote_socket))

        def write_hardware() -> dict[str, SimNode]:
            return services.write_fleet_hardware(fleet=opts.fleet, layout=layout)

        hardware = background.submit(_timed, write_hardware)
        auth = busauth.prepare(layout) if opts.bus_auth else None
        if auth is None:
            launcher.env[INSECURE_BUS_ENV] = "1"
        # With the driver on the real node, NATS is its StatefulSet there (started once the
        # node is up, see realnats); the authenticated bus keeps the stack's own server.
        nats_on_node = real is not None and real.nats_image is not None
        progress("neuron-dra: starting the control plane" + ("" if nats_on_node else " and NATS"))
        launcher.start(
            [
                *(
                    []
                    if nats_on_node
                    else [
                        comp.nats(
                            state_dir=layout.root,
                            port=ports["nats"],
                            monitor_port=ports["nats_monitor"],
                            config=auth.config if auth else None,
                            env=auth.nats_env() if auth else None,
                        )
                    ]
                ),
                comp.etcd(
                    binary=bins.etcd,
                    state_dir=layout.root,
                    port=ports["etcd"],
                    peer_port=ports["etcd_peer"],
                ),
            ]
        )
        receiver = alerting.alertmanager(binary=alertmanager_binary, state_dir=layout.root)
        launcher.start([receiver])
        if jaeger_binary is not None:
            backend = tracing.jaeger(binary=jaeger_binary, state_dir=layout.root)
            launcher.start([backend])
            launcher.env.update(tracing.otlp_env(backend.ports))
        launcher.start(
            [
                comp.apiserver(
                    binary=bins.kube_apiserver,
                    pki=pki,
                    etcd_port=ports["etcd"],
                    port=ports["apiserver"],
                    admin=admin,
                )
            ]
        )

        # Pods asking for aws.amazon.com/neuron are placed by the scheduler extender wherever
        # a device plugin serves them: on the real node, or on simulated nodes labelled so.
        plugin_nodes = any(n.device_plugin for n in opts.fleet.nodes)
        with_extender = opts.real_node_device_plugin or plugin_nodes

        warned = kubebuild.NODE_RELEASES

        def apply_objects() -> dict[str, Path]:
            found = _apply_cluster_objects(layout, auth)
            if with_extender:
                found[realdeviceplugin.EXTENDER_KIND] = realdeviceplugin.extender_kubeconfig(
                    layout, layout.kubeconfig
                )
            # The node agents' tokens are bound to a pod on their node (stack.accounts).
            found |= accounts.node_agent_kubeconfigs(
                layout,
                layout.kubeconfig,
                healthprobe.KIND,
                [n.name for n in opts.fleet.nodes if n.managed],
            )
            # The kubelet plugin writes its Node only on a kubelet it warns about
            # (kubeletcheck): those nodes' plugins get a token bound to a pod there, which its
            # admission policy asks for; the others keep a plain one (no pod for their kubelets).
            found |= accounts.node_agent_kubeconfigs(
                layout,
                layout.kubeconfig,
                plugin.KIND,
                [n.name for n in opts.fleet.nodes if n.dra and n.kubelet_version in warned],
            )
            if plugin_nodes:
                found |= deviceplugin.device_plugin_kubeconfigs(
                    layout, layout.kubeconfig, [n.name for n in opts.fleet.nodes if n.device_plugin]
                )
            return found

        service_kubeconfigs = background.submit(_timed, apply_objects)
        kcm_cfg = write_kubeconfig(
            layout.component_kubeconfig("kube-controller-manager"),
            server=server,
            ca=pki.ca.cert,
            pair=pki.client("kube-controller-manager", user="system:kube-controller-manager"),
            user="system:kube-controller-manager",
        )
        sched_cfg = write_kubeconfig(
            layout.component_kubeconfig("kube-scheduler"),
            server=server,
            ca=pki.ca.cert,
            pair=pki.client("kube-scheduler", user="system:kube-scheduler"),
            user="system:kube-scheduler",
        )
        # Started with the services, once its account's token is written (see apply_objects);
        # its address is known now, for the scheduler's configuration.
        extender: list[comp.Component] = []
        sched_file = None
        if with_extender:
            ext_tls = realdeviceplugin.extender_tls(layout.pki / "scheduler-extender")
            ext = realdeviceplugin.extender(
                kubeconfig=layout.component_kubeconfig(realdeviceplugin.EXTENDER_KIND),
                tls=ext_tls,
            )
            extender = [ext]
            sched_file = realdeviceplugin.scheduler_config_file(
                extender_url=f"https://127.0.0.1:{ext.ports['verbs']}",
                kubeconfig=sched_cfg,
                folder=layout.root / "scheduler-extender",
                tls=ext_tls,
            )
        scheduler = comp.scheduler(
            binary=bins.kube_scheduler,
            kubeconfig=sched_cfg,
            port=ports["scheduler"],
            config=sched_file,
        )
        launcher.start(
            [
                comp.controller_manager(
                    binary=bins.kube_controller_manager,
                    pki=pki,
                    kubeconfig=kcm_cfg,
                    port=ports["kcm"],
                ),
                scheduler,
            ]
        )
        progress(f"neuron-dra: starting {len(opts.fleet.nodes)} simulated nodes")
        nodes = [
            node_component(
                fleet=opts.fleet,
                node=n,
                binary=node_binaries.get(n.kubelet_version, bins.hollow_node),
                layout=layout,
                kubeconfig=write_kubeconfig(
                    layout.component_kubeconfig(f"node-{n.name}"),
                    server=server,
                    ca=pki.ca.cert,
                    pair=pki.node(n.name),
                    user=f"system:node:{n.name}",
                ),
                version=opts.k8s_version,
            )
            for n in opts.fleet.nodes
        ]
        launcher.start(nodes, timeout=60.0 + 5.0 * len(nodes))
        if real is not None:
            _start_real_nodes(
                launcher, real=real, count=opts.real_nodes, kubelet=bins.kubelet, pki=pki,
                server=server,
            )  # fmt: skip
        t_wait = time.monotonic()
        sims, t_hardware = hardware.result()
        own_kubeconfigs, t_objects = service_kubeconfigs.result()
        if real is not None and real.nats_image is not None:
            # After the namespace (apply_objects), before anything that uses the bus.
            progress("neuron-dra: NATS from the local overlay's StatefulSet on the real node")
            realnats.apply(
                layout=layout,
                kubeconfig=layout.kubeconfig,
                binaries=real.containerd,
                image=real.nats_image,
                node=realnodes.node_names(1)[0],
                port=ports["nats"],
                monitor_port=ports["nats_monitor"],
            )
        if forker is not None:
            _use_zygote(launcher, forker)
        t_bytecode = warmup.wait()
        progress(
            f"  simulated hardware written in {t_hardware:.1f} s, cluster objects applied in "
            f"{t_objects:.1f} s, bytecode compiled in {t_bytecode:.1f} s "
            f"(beside the control plane; waited {time.monotonic() - t_wait:.1f} s more)"
        )
        progress("neuron-dra: starting the neuron-dra services")
        agents = [
            *services.product_components(
                fleet=opts.fleet,
                layout=layout,
                nats_url=current.nats_url,
                kubeconfig=own_kubeconfigs["slice-publisher"],
                hardware=sims,
                kubelet_healthz={c.name.removeprefix("node-"): c.ports["healthz"] for c in nodes},
            ),
            *plugin.plugin_components(
                fleet=opts.fleet,
                layout=layout,
                nats_url=current.nats_url,
                kubeconfig=layout.kubeconfig,
                plugin_kubeconfig=own_kubeconfigs[plugin.KIND],
                kubeconfigs=own_kubeconfigs,
            ),
            *(
                deviceplugin.device_plugin_components(
                    fleet=opts.fleet,
                    layout=layout,
                    nats_url=current.nats_url,
                    kubeconfigs=own_kubeconfigs,
                )
                if plugin_nodes
                else []
            ),
            *ultraserver_components(
                nats_url=current.nats_url, kubeconfig=own_kubeconfigs["ultraserver-operator"]
            ),
            *alerting.subscriber_components(
                nats_url=current.nats_url,
                state_dir=layout.root,
                alertmanager_url=alerting.ui_url(receiver.ports).rstrip("/"),
            ),
            *healthprobe.probe_components(
                fleet=opts.fleet,
                layout=layout,
                nats_url=current.nats_url,
                kubeconfigs=own_kubeconfigs,
            ),
            *health_components(
                nats_url=current.nats_url, kubeconfig=own_kubeconfigs["failure-detector"]
            ),
            *extender,
        ]
        if opts.efa and (
            sim := efa.efa_component(fleet=opts.fleet, layout=layout, kubeconfig=layout.kubeconfig)
        ):
            agents.append(sim)
        if real is not None and real.image is not None and opts.real_node_driver:
            # Their Deployments run on the real node instead (realdriver.SERVICES).
            agents = [a for a in agents if a.kind not in realdriver.SERVICE_KINDS]
        if auth is not None:
            agents = _authenticated(
                agents,
                launcher=launcher,
                auth=auth,
                nats_url=current.nats_url,
                kubeconfig=own_kubeconfigs[busauth.KIND],
            )
        # Started as processes of their own, one per core: each spends about half a second
        # importing on a core of its own and then mostly waits (for NATS, the apiserver, its
        # kubelet's registration); two per core made every plugin take about 1.2 s instead
        # of about 1 s. Forked, an agent imports nothing and mostly waits from the start, so
        # more of them start at once.
        per_core = 4 if launcher.zygote is not None else 1
        # The kubelet plugins first: a node takes claims once its plugin has registered.
        launcher.start(
            sorted(agents, key=lambda a: a.kind != plugin.KIND),
            timeout=60.0,
            parallel=per_core * (os.cpu_count() or 2),
        )
        if real is not None and real.image is not None:
            if opts.real_node_device_plugin:
                _start_real_node_device_plugin(
                    launcher, real=real, apiserver_port=ports["apiserver"], pki=pki,
                    bus_auth=auth is not None,
                )  # fmt: skip
            else:
                _start_real_node_driver(
                    launcher, real=real, apiserver_port=ports["apiserver"], pki=pki,
                    bus_auth=auth is not None,
                )  # fmt: skip
        progress("neuron-dra: waiting for every node to be Ready")
        t_nodes = time.monotonic()
        names = [n.name for n in opts.fleet.nodes] + realnodes.node_names(opts.real_nodes)
        wait_nodes_ready(layout.kubeconfig, names, timeout=120.0 + 2.0 * len(names))
        progress(f"  {len(names)} nodes Ready in {time.monotonic() - t_nodes:.1f} s")
        remove_other_nodes(layout.kubeconfig, names, progress)
        # A pod applied the moment this returns must not be refused for want of the
        # namespace's default ServiceAccount.
        wait_default_service_account(layout.kubeconfig, timeout=60.0)
    except BaseException:
        progress("neuron-dra: start failed; stopping what was started")
        warmup.stop()
        background.shutdown(wait=True, cancel_futures=True)
        # A second Ctrl-C must not cut the clean-up short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_all(launcher.current)
        raise
    background.shutdown()
    return launcher.current


def _use_zygote(launcher: Launcher, forker: _Starting) -> None:
    """Wait for the agent zygote, then have it fork the Python services; one that failed to
    start leaves them to start as processes of their own (slower, same result)."""
    t0 = time.monotonic()
    try:
        launcher.wait([forker], timeout=90.0)
    except CliError as exc:
        launcher.progress(
            f"  the agent zygote did not start, so each service starts as a process of its "
            f"own: {exc}"
        )
        return
    launcher.zygote = launcher.layout.zygote_socket
    entry = next(c for c in launcher.current.components if c.name == forker.entry.name)
    launcher.progress(
        f"  agent zygote ready {entry.ready_seconds or 0.0:.1f} s after its start "
        f"(waited {time.monotonic() - t0:.1f} s for it)"
    )


@dataclass(frozen=True)
class _RealNodeInputs:
    containerd: toolbuild.ContainerdBinaries
    pause: Path  # the pause image's OCI archive
    #: The product's image, with ``real_node_driver`` or ``real_node_device_plugin``.
    image: str | None = None
    #: Labels of the real nodes (what the DaemonSets select).
    labels: dict[str, str] | None = None
    #: The NATS image, when NATS runs from its StatefulSet on the real node (see realnats).
    nats_image: str | None = None


def _check_real_node_driver(opts: UpOptions) -> None:
    if not opts.real_node_driver:
        return
    if opts.real_nodes != 1:
        raise CliError(
            f"--real-node-driver runs the driver on exactly one real node (--real-nodes 1, "
            f"not {opts.real_nodes}): each real node keeps its kubelet root, CDI folder and "
            "hardware in a folder of its own, and a DaemonSet has one pod spec"
        )


def _check_real_node_device_plugin(opts: UpOptions) -> None:
    if not opts.real_node_device_plugin:
        return
    option = "--real-node-device-plugin"
    realdeviceplugin.check_count(opts.real_nodes, option=option)
    if opts.real_node_driver:
        raise CliError(
            f"{option} does not go with --real-node-driver: a node is served by the device "
            "plugin or by the DRA driver, never both"
        )


def _real_node_inputs(opts: UpOptions, progress: Progress) -> _RealNodeInputs:
    from neuron_dra_cli import imagebuild, natsimage, pausebuild

    progress("neuron-dra: containerd and the pause image, for the real nodes")
    image = None
    labels = None
    if opts.real_node_driver or opts.real_node_device_plugin:
        progress("neuron-dra: this checkout's image, for the DaemonSets on the real node")
        image = imagebuild.ensure_image(progress=lambda m: progress("  " + m))
        # What the DaemonSets select (the simulated hardware's type).
        labels = (
            dict(realdeviceplugin.NODE_LABELS)
            if opts.real_node_device_plugin
            else {"node.kubernetes.io/instance-type": realdriver.INSTANCE_TYPE}
        )
    nats_image = None
    if opts.real_node_driver and not opts.bus_auth:
        progress("neuron-dra: the NATS image, for the StatefulSet on the real node")
        nats_image = natsimage.ensure_nats_image(progress=lambda m: progress("  " + m))
    return _RealNodeInputs(
        nats_image=nats_image,
        containerd=toolbuild.ensure_containerd(progress=lambda m: progress("  " + m)),
        pause=pausebuild.ensure_pause_archive(
            opts.k8s_version, progress=lambda m: progress("  " + m)
        ),
        image=image,
        labels=labels,
    )


def _prepare_real_node(launcher: Launcher, *, real: _RealNodeInputs, image: str, what: str) -> str:
    """The one real node that runs ``what`` (the product's DaemonSets): its simulated
    hardware written and ``image`` imported into its containerd; returns its name."""
    name = realnodes.node_names(1)[0]
    launcher.progress(f"neuron-dra: {what} on {name}")
    realdriver.write_hardware(launcher.layout, name)
    realdriver.import_product_image(
        image=image, binaries=real.containerd, layout=launcher.layout, nodes=[name]
    )
    return name


def _start_real_node_driver(
    launcher: Launcher, *, real: _RealNodeInputs, apiserver_port: int, pki: Pki, bus_auth: bool
) -> None:
    """The real node's simulated hardware, the product's image in its containerd, then the
    discovery and kubelet-plugin DaemonSets (with ``bus_auth``, each with its projected bus
    token and NATS's CA), waited for until Ready there."""
    assert real.image is not None
    layout = launcher.layout
    name = _prepare_real_node(launcher, real=real, image=real.image, what="the driver's DaemonSets")
    kubelet = next(c for c in launcher.current.components if c.name == f"kubelet-{name}")
    paths = realnodes.node_paths(layout, name)
    discovery_port, plugin_port, probe_port = realdriver.free_ports()
    receiver = next(c for c in launcher.current.components if c.name == "alertmanager")
    realdriver.apply(
        layout=layout,
        kubeconfig=layout.kubeconfig,
        setup=realdriver.NodeSetup(
            image=real.image,
            nats_url=launcher.current.nats_url,
            apiserver_port=apiserver_port,
            kubelet_root=paths.kubelet_root,
            cdi_dir=paths.cdi_dir,
            hardware=realdriver.hardware_root(layout, name),
            plugin_state=paths.base / "plugin-state",
            kubelet_healthz_port=kubelet.ports["healthz"],
            discovery_port=discovery_port,
            plugin_port=plugin_port,
            service_ports=realdriver.free_service_ports(),
            probe_port=probe_port,
            probe_state=paths.base / "health-probe",
            alertmanager_url=alerting.ui_url(receiver.ports).rstrip("/"),
            bus_auth=bus_auth,
        ),
        nodes=[name],
        pki=pki,
    )


def _start_real_node_device_plugin(
    launcher: Launcher, *, real: _RealNodeInputs, apiserver_port: int, pki: Pki, bus_auth: bool
) -> None:
    """The real node's simulated hardware, the product's image in its containerd, then the
    device plugin's DaemonSet (with its bus token on the authenticated bus), waited for until
    Ready there."""
    assert real.image is not None
    layout = launcher.layout
    name = _prepare_real_node(
        launcher, real=real, image=real.image, what="the device plugin's DaemonSet"
    )
    realdeviceplugin.apply(
        layout=layout,
        kubeconfig=layout.kubeconfig,
        setup=realdeviceplugin.PluginSetup(
            image=real.image,
            nats_url=launcher.current.nats_url,
            apiserver_port=apiserver_port,
            hardware=realdriver.hardware_root(layout, name),
            http_port=process.free_port(),
            bus_auth=bus_auth,
        ),
        node=name,
        pki=pki,
    )


def _start_real_nodes(
    launcher: Launcher,
    *,
    real: _RealNodeInputs,
    count: int,
    kubelet: Path,
    pki: Pki,
    server: str,
) -> None:
    """Each real node's containerd, the pause image imported into it, then its kubelet."""
    names = realnodes.node_names(count)
    launcher.progress(f"neuron-dra: starting {count} real nodes ({', '.join(names)})")
    launcher.start(
        [
            realnodes.runtime_component(
                layout=launcher.layout, name=name, index=i, binaries=real.containerd
            )
            for i, name in enumerate(names)
        ]
    )
    for name in names:
        realnodes.import_archive(
            real.containerd, realnodes.node_paths(launcher.layout, name), real.pause
        )
    launcher.start(
        [
            realnodes.kubelet_component(
                layout=launcher.layout,
                name=name,
                index=i,
                binary=kubelet,
                pki=pki,
                server=server,
                labels=real.labels,
            )
            for i, name in enumerate(names)
        ],
        timeout=90.0,
    )


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    t0 = time.monotonic()
    return work(), time.monotonic() - t0


def _apply_cluster_objects(layout: Layout, auth: busauth.BusAuth | None) -> dict[str, Path]:
    """The local overlay, then every service's ServiceAccount and RBAC from the base (the
    bus-auth component's among them); returns each API-calling service's own kubeconfig (a
    token of its ServiceAccount), by kind, the callout's too with ``auth``."""
    services.apply_cluster_objects(layout.kubeconfig)
    found = accounts.service_kubeconfigs(layout, layout.kubeconfig)
    if auth is None:
        return found
    found[busauth.KIND] = accounts.service_kubeconfig(
        layout, layout.kubeconfig, busauth.KIND, account=busauth.CALLOUT_ACCOUNT
    )
    return found


def _authenticated(
    agents: list[comp.Component],
    *,
    launcher: Launcher,
    auth: busauth.BusAuth,
    nats_url: str,
    kubeconfig: Path,
) -> list[comp.Component]:
    """Start the auth callout, declare the streams as the bus's admin, and return ``agents``
    each with a bus token of its own ServiceAccount."""
    launcher.start(
        [busauth.callout_component(files=auth, nats_url=nats_url, kubeconfig=kubeconfig)]
    )
    t0 = time.monotonic()
    busauth.declare_streams(
        files=auth, nats_url=nats_url, admin_kubeconfig=launcher.layout.kubeconfig
    )
    with_tokens = busauth.with_tokens(
        agents, files=auth, admin_kubeconfig=launcher.layout.kubeconfig
    )
    launcher.progress(
        f"  streams declared as {busauth.ADMIN} and bus tokens issued in "
        f"{time.monotonic() - t0:.1f} s"
    )
    return with_tokens


def wait_nodes_ready(kubeconfig: Path, names: Sequence[str], *, timeout: float) -> None:
    """Wait until every named Node reports the Ready condition True."""
    deadline = time.monotonic() + timeout
    missing: list[str] = list(names)
    while time.monotonic() < deadline:
        ready = kubectl.ready_nodes(kubeconfig)
        missing = [n for n in names if n not in ready]
        if not missing:
            return
        time.sleep(1.0)
    raise CliError(f"nodes not Ready after {timeout:.0f} s: {', '.join(missing)}")


def remove_other_nodes(
    kubeconfig: Path, names: Sequence[str], progress: Callable[[str], None]
) -> None:
    """Delete the Nodes that are not this fleet's.

    The stack keeps its cluster (etcd's data) from one ``up`` to the next, so an earlier
    fleet's nodes would stay, NotReady, with their ResourceSlices and pods. Deleted, their
    slices go with them (a slice is owned by its Node) and the pod garbage collector removes
    the pods bound to them.
    """
    others = sorted(kubectl.node_names(kubeconfig) - set(names))
    if others:
        nodes = "node" if len(others) == 1 else "nodes"
        progress(
            f"neuron-dra: removing {len(others)} {nodes} an earlier fleet left in the cluster: "
            + ", ".join(others)
        )
        kubectl.run(kubeconfig, ["delete", "nodes", "--wait=false", *others])


def wait_default_service_account(kubeconfig: Path, *, timeout: float) -> None:
    """Wait until the ``default`` namespace has its ``default`` ServiceAccount."""
    deadline = time.monotonic() + timeout
    while not kubectl.has_default_service_account(kubeconfig):
        if time.monotonic() > deadline:
            raise CliError(
                f"the default ServiceAccount of namespace default is missing after {timeout:.0f} s "
                "(is kube-controller-manager running?)"
            )
        time.sleep(0.5)


def stop_all(current: state.StackState, *, timeout: float = 15.0) -> None:
    """Stop every recorded component: the services and the simulated nodes first, then the
    real nodes with their containers and runtimes (NATS may be one of those), then the
    control plane, then the bus."""
    order = {
        "node": 0,
        # After the agents it forked, so that its log says how each of them exited.
        zygote.KIND: 1,
        "kube-scheduler": 1,
        "kube-controller-manager": 1,
        "kube-apiserver": 2,
        "etcd": 3,
        "nats": 3,
    }
    by_rank: dict[int, list[process.Running]] = {}
    for c in current.components:
        if c.kind in (realnodes.KUBELET_KIND, realnodes.RUNTIME_KIND):
            continue
        by_rank.setdefault(order.get(c.kind, 0), []).append(_running(c))
    process.stop(by_rank.pop(0, []), timeout=timeout)
    realnodes.stop(current, timeout=timeout)
    for rank in sorted(by_rank):
        process.stop(by_rank[rank], timeout=timeout)


def down(state_dir: Path) -> int:
    """Stop the stack recorded in ``state_dir``; return how many processes were stopped."""
    current = state.load(state_dir)
    if current is None:
        return 0
    live = [c for c in current.components if process.alive(_running(c))]
    stop_all(current)
    state.clear(state_dir)
    Layout(state_dir).short_nodes.unlink(missing_ok=True)
    return len(live)


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    kind: str
    up: bool
    pid: int
    ports: dict[str, int]
    log: str
    #: Proportional set size of its process group (shared pages divided among sharers).
    memory_bytes: int
    #: Resident set size of its process group (shared pages counted in full).
    rss_bytes: int
    #: Unique set size of its process group: the pages only it maps (a forked agent's own,
    #: without what it shares with the agent zygote).
    uss_bytes: int
    #: Seconds from its start until it was first ready (None: not known).
    ready_seconds: float | None


def status(state_dir: Path) -> tuple[state.StackState, list[ComponentStatus]] | None:
    """Each recorded component with whether it is still running; None if no stack."""
    current = state.load(state_dir)
    if current is None:
        return None
    found = []
    for c in current.components:
        up = process.alive(_running(c))
        memory = process.group_memory(c.pid) if up else process.Memory(rss=0, pss=0)
        found.append(
            ComponentStatus(
                name=c.name,
                kind=c.kind,
                up=up,
                pid=c.pid,
                ports=dict(c.ports),
                log=c.log,
                memory_bytes=memory.pss,
                rss_bytes=memory.rss,
                uss_bytes=memory.uss,
                ready_seconds=c.ready_seconds,
            )
        )
    return current, found
