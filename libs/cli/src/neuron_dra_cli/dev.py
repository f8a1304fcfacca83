"""``neuron-dra dev``: the local stack (control plane, simulated Neuron nodes, NATS)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import msgspec

from neuron_dra_cli import env_cmd, fault_cmd, image_cmd, paths, restart_cmd
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.output import add_output_option
from neuron_dra_cli.stack import lifecycle, process, realconfig, realnodes, state, zygote
from neuron_dra_cli.stack.fleet import FleetError, load_fleet

K8S_VERSION_ENV = "NEURON_DRA_K8S_VERSION"
FLEET_ENV = "NEURON_DRA_FLEET"
REAL_NODES_ENV = "NEURON_DRA_REAL_NODES"


def _state_dir(args: argparse.Namespace) -> Path:
    return (
        Path(args.state_dir).expanduser().resolve() if args.state_dir else paths.default_state_dir()
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser(
        "dev",
        help="run the local stack: a real control plane, simulated Neuron nodes and NATS",
        description="Run neuron-dra's local stack on this machine: etcd, kube-apiserver, "
        "kube-controller-manager and kube-scheduler built from the official Kubernetes "
        "sources, one simulated node per fleet entry running the real kubelet code, and "
        "NATS with JetStream. Everything listens on 127.0.0.1 on free ports, so several "
        "stacks can run side by side with different --state-dir.",
    )
    verbs = dev.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    p = verbs.add_parser("up", help="build what is missing, start the stack, wait until ready")
    p.add_argument(
        "--fleet",
        default=os.environ.get(FLEET_ENV),
        help=f"fleet file: which simulated nodes to run (env {FLEET_ENV}; "
        "default deploy/fleets/default.yaml)",
    )
    p.add_argument(
        "--k8s-version",
        default=os.environ.get(K8S_VERSION_ENV),
        help=f"Kubernetes release to build and run (env {K8S_VERSION_ENV}; default the pinned one)",
    )
    p.add_argument(
        "--detach",
        action="store_true",
        help="return once the stack is ready and leave it running (stop it with `dev down`)",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="also run Jaeger, send every neuron-dra service's spans to it, print its UI",
    )
    p.add_argument(
        "--bus-auth",
        action="store_true",
        help="the default, kept for older scripts: NATS admits each service through the "
        "auth callout (neuron-dra-bus-auth) by a token of its own ServiceAccount, grants only "
        "its subjects, and only neuron-dra-bus-admin declares the streams; clients speak TLS "
        "to NATS (a certificate of the stack's CA)",
    )
    p.add_argument(
        "--insecure-bus",
        action="store_true",
        help="debugging only: an open bus, NATS without authentication or TLS, which any "
        f"local process reads and writes; every service is started with "
        f"{lifecycle.INSECURE_BUS_ENV}=1 "
        "and says so in its log",
    )
    p.add_argument(
        "--real-nodes",
        type=_count,
        # A string default goes through `type` too, so a bad env value is refused alike.
        default=os.environ.get(REAL_NODES_ENV, "0"),
        metavar="N",
        help=f"also run N real nodes (env {REAL_NODES_ENV}; default 0): the real kubelet "
        "with containerd and runc, each with its own containerd, pod network (a CNI bridge) "
        "and CDI folder, named real-node-0, real-node-1, ... and labelled "
        "neuron-dra.dev/real-node=true; pods run there as real containers (images must be "
        "imported into the node's containerd: nothing is pulled). Needs root, runc at "
        "/usr/sbin/runc and the CNI plugins in /usr/lib/cni (Debian: runc, "
        "containernetworking-plugins), gcc and podman; builds the kubelet and containerd "
        "(a few minutes, once)",
    )
    p.add_argument(
        "--real-node-driver",
        action="store_true",
        help="with --real-nodes 1: the real node is a trn2.48xlarge with simulated hardware "
        "(its /dev/neuron* character devices no driver serves), this checkout's image is "
        "imported into it, and (with --insecure-bus, NATS too: the overlay's StatefulSet, on a "
        "volume the stack makes for its claim) the driver's discovery, kubelet-plugin and "
        "health-probe DaemonSets and the Deployments of the slice publisher, topology "
        "allocator, UltraServer operator, failure detector and the alerts and audit "
        "subscribers "
        "(deploy/kustomize/overlays/local) run there as real containers, patched only for "
        "this machine by <state-dir>/real-node-driver/kustomization.yaml and "
        "<state-dir>/real-node-nats/kustomization.yaml (real nodes only, host network, one "
        "replica each, the kubelet's paths); the real kubelet calls the plugin and "
        "containerd injects its CDI devices, and the stack starts no process of those "
        "services. The simulated nodes keep their processes. "
        "Each agent connects with its projected ServiceAccount token over TLS (the base's "
        "bus-auth component; Secret neuron-dra-nats-tls, made from the stack's PKI)",
    )
    p.add_argument(
        "--real-node-device-plugin",
        action="store_true",
        help="with --real-nodes 1 (one per host: the kubelet's device manager socket is "
        "always /var/lib/kubelet/device-plugins): a mixed cluster. The real node is a "
        "trn2.48xlarge with simulated hardware labelled "
        "neuron.aws.com/device-management=device-plugin, this checkout's image is imported "
        "into it, and the device plugin's DaemonSet (deploy/kustomize/components/"
        "device-plugin) runs there as a real container, patched only for this machine by "
        "<state-dir>/real-node-device-plugin/kustomization.yaml (host network, the "
        "hardware's paths); kube-scheduler calls the scheduler extender (the configuration "
        "of components/scheduler-extender/default-scheduler), so pods asking "
        "aws.amazon.com/neuron get a connected set there, while the simulated nodes stay "
        "DRA nodes. Unless --insecure-bus the kustomization adds the device-plugin-bus-auth "
        "component: the plugin reads its node's health events with its own projected bus "
        "token. Not with --real-node-driver",
    )
    p.add_argument(
        "--efa",
        action="store_true",
        help="also run the simulated EFA DRA driver (dra.net, DeviceClass "
        "efa.networking.k8s.aws): the EFA interfaces of every trn2 and trn2u node, as on a "
        "cluster where AWS's EFA driver is installed beside the Neuron driver (see "
        "neuron_dra_cli.stack.efa)",
    )
    p.add_argument(
        "--no-agent-zygote",
        dest="agent_zygote",
        action="store_false",
        default=os.environ.get(zygote.DISABLE_ENV, "1") != "0",
        help=f"start each neuron-dra service as a `python -m` process of its own (env "
        f"{zygote.DISABLE_ENV}=0) instead of forking it from the agent zygote, a process that "
        "imports the services' code once (the local stack only; see neuron_dra_cli.stack.zygote)",
    )
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_up)

    p = verbs.add_parser("down", help="stop every process of the stack")
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_down)

    p = verbs.add_parser(
        "status",
        help="each component, up or down, with pid, memory, start-to-ready time and ports",
        description="Each component of the stack: up or down, pid, resident, proportional and "
        "unique memory (RSS, PSS, USS) of its processes, seconds from its start until it was "
        "ready, and its ports; then the totals. The PSS of all components adds up to what the "
        "stack uses (pages shared by many simulated nodes, or by the agents the agent zygote "
        "forked, counted once); USS is what a component holds alone.",
    )
    paths.add_state_dir_option(p)
    add_output_option(p)
    p.set_defaults(handler=cmd_status)

    p = verbs.add_parser("kubeconfig", help="print the path of the stack's admin kubeconfig")
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_kubeconfig)

    p = verbs.add_parser("build", help="build (or find cached) the Kubernetes binaries")
    p.add_argument("--k8s-version", default=os.environ.get(K8S_VERSION_ENV))
    p.set_defaults(handler=cmd_build)
    env_cmd.register(verbs)
    fault_cmd.register(verbs)
    image_cmd.register(verbs)
    restart_cmd.register(verbs)


def _count(value: str) -> int:
    """A count of real nodes (0 or more), from the flag or its env twin."""
    where = f"{value!r} (from --real-nodes or {REAL_NODES_ENV})"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{where} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{where} is negative")
    return n


def _progress(msg: str) -> None:
    print(msg, flush=True)


def cmd_build(args: argparse.Namespace) -> int:
    from neuron_dra_cli import kubebuild

    version = args.k8s_version or kubebuild.DEFAULT_VERSION
    bins = kubebuild.ensure_binaries(version, progress=_progress)
    print(f"Kubernetes {bins.version} binaries in {bins.kube_apiserver.parent}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from neuron_dra_cli import kubebuild

    state_dir = _state_dir(args)
    fleet_path = (
        Path(args.fleet) if args.fleet else paths.repo_root() / "deploy" / "fleets" / "default.yaml"
    )
    try:
        fleet = load_fleet(fleet_path)
    except FleetError as exc:
        raise CliError(str(exc)) from None
    version = args.k8s_version or kubebuild.DEFAULT_VERSION
    if args.insecure_bus and args.bus_auth:
        raise CliError(
            "--insecure-bus and --bus-auth: choose one (the bus is authenticated by default)"
        )
    if args.insecure_bus:
        print(
            "neuron-dra: WARNING: --insecure-bus: NATS runs WITHOUT authentication or TLS; any "
            "process that reaches it reads and writes every event. For debugging only",
            file=sys.stderr,
            flush=True,
        )
    t0 = time.monotonic()
    # SIGTERM (from a supervisor or `kill`) stops the stack like Ctrl-C does; SIGINT is set
    # explicitly because a shell starts background commands with it ignored.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    current = lifecycle.up(
        lifecycle.UpOptions(
            fleet=fleet,
            fleet_path=fleet_path,
            k8s_version=version,
            state_dir=state_dir,
            tracing=args.tracing,
            bus_auth=not args.insecure_bus,
            real_nodes=args.real_nodes,
            real_node_driver=args.real_node_driver,
            real_node_device_plugin=args.real_node_device_plugin,
            agent_zygote=args.agent_zygote,
            efa=args.efa,
        ),
        progress=_progress,
    )
    print(
        summary(current, state_dir=state_dir, seconds=time.monotonic() - t0, detached=args.detach),
        flush=True,
    )
    if args.detach:
        return 0
    try:
        _watch(state_dir)
    except KeyboardInterrupt:
        print("\nneuron-dra: stopping the stack", flush=True)
    finally:
        # A second Ctrl-C (or the signal relayed again by a wrapper) must not cut the
        # shutdown short and leave processes behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stopped = lifecycle.down(state_dir)
        print(f"neuron-dra: stopped {stopped} processes", flush=True)
    return 0


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _watch(state_dir: Path) -> None:
    """Stay in the foreground; report any component that dies, with its log's tail."""
    reported: set[str] = set()
    while True:
        time.sleep(2.0)
        found = lifecycle.status(state_dir)
        if found is None:
            return
        for c in found[1]:
            if not c.up and c.name not in reported:
                reported.add(c.name)
                print(
                    f"neuron-dra: {c.name} (pid {c.pid}) exited; last lines of {c.log}:\n"
                    + _indent(process.tail(Path(c.log), lines=20)),
                    file=sys.stderr,
                    flush=True,
                )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def summary(current: state.StackState, *, state_dir: Path, seconds: float, detached: bool) -> str:
    nodes = [c for c in current.components if c.kind == "node"]
    others = [c for c in current.components if c.kind != "node"]
    lines = [
        "",
        f"neuron-dra local stack ready in {seconds:.0f} s (Kubernetes {current.k8s_version}, "
        f"{len(nodes)} simulated nodes from {current.fleet})",
        "",
    ]
    for c in others:
        ports = " ".join(f"{k}={v}" for k, v in c.ports.items())
        lines.append(f"  {c.name:<26} pid {c.pid:<8} {ports}")
    lines.append(f"  {'simulated nodes':<26} {len(nodes)} kubelets (`kubectl get nodes`)")
    real = [c for c in current.components if c.kind == realnodes.KUBELET_KIND]
    if real:
        lines.append(
            f"  {'real nodes':<26} {len(real)} kubelets with containerd "
            f"(`kubectl get nodes -l {realconfig.REAL_NODE_LABEL}`)"
        )
    venv_bin = Path(sys.executable).parent
    lines += [
        "",
        f"  API server   {current.apiserver}",
        f"  NATS         {current.nats_url}",
        *_bus_auth_lines(current, state_dir=state_dir),
        f"  logs         {state_dir / 'logs'}",
        *_traces_line(current),
        *_alerts_lines(current, state_dir=state_dir),
        "",
        "Use it:",
        f"  export KUBECONFIG={current.kubeconfig}",
        f"  export PATH={venv_bin}:$PATH   # the pinned kubectl",
        "  kubectl get nodes -L node.kubernetes.io/instance-type",
        "",
    ]
    if detached:
        lines.append(f"Stop it with: neuron-dra dev down --state-dir {state_dir}")
    else:
        lines.append("Press Ctrl-C to stop everything.")
    return "\n".join(lines)


def _bus_auth_lines(current: state.StackState, *, state_dir: Path) -> list[str]:
    from neuron_dra_cli.stack import busauth

    if not any(c.kind == busauth.KIND for c in current.components):
        return [
            "  bus auth     NONE: the bus is OPEN (--insecure-bus), no token and no TLS; any "
            "local process reads and writes it. For debugging only"
        ]
    files = busauth.BusAuth(state_dir / "bus-auth")
    return [
        f"  bus auth     every client needs a token (audience {busauth.AUDIENCE}) and TLS "
        f"trusting {files.tls_ca}; the admin's token: {files.token(busauth.ADMIN)}, "
        f"a reader's: {files.token(busauth.READER)}"
    ]


def _traces_line(current: state.StackState) -> list[str]:
    from neuron_dra_cli.stack import tracing

    return [
        f"  traces UI    {tracing.ui_url(c.ports)}"
        for c in current.components
        if c.kind == tracing.JAEGER
    ]


def _alerts_lines(current: state.StackState, *, state_dir: Path) -> list[str]:
    from neuron_dra_cli.stack import alerting

    lines = [
        f"  alerts UI    {alerting.ui_url(c.ports)}   (Alertmanager; API under /api/v2)"
        for c in current.components
        if c.kind == alerting.ALERTMANAGER
    ]
    if any(c.kind == "audit" for c in current.components):
        lines.append(f"  audit log    {alerting.audit_file(state_dir)}   (`neuron-dra events`)")
    return lines


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    stopped = lifecycle.down(state_dir)
    print(f"neuron-dra: stopped {stopped} processes of the stack in {state_dir}")
    return 0


class ComponentReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One component in ``dev status -o json``."""

    name: str
    kind: str
    up: bool
    pid: int
    rss_bytes: int
    pss_bytes: int
    #: The pages only its processes map (a forked agent's own, without the zygote's).
    uss_bytes: int = 0
    ready_seconds: float | None
    ports: dict[str, int]
    log: str


class KindTotals(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The components of one kind: how many are up, their largest RSS, their slowest start."""

    count: int
    up: int
    max_rss_bytes: int
    max_uss_bytes: int = 0
    max_ready_seconds: float | None
    pss_bytes: int


class StatusReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``dev status -o json``: the stack, each component, totals per kind and in all."""

    state_dir: str
    running: bool = True
    k8s_version: str
    kubeconfig: str
    components: list[ComponentReport]
    kinds: dict[str, KindTotals]
    up: int
    rss_bytes: int
    pss_bytes: int
    #: From the first component's start until the last one was ready.
    ready_seconds: float | None


def status_report(state_dir: Path) -> StatusReport | None:
    """What ``dev status`` prints, as data; None when there is no stack in ``state_dir``."""
    found = lifecycle.status(state_dir)
    if found is None:
        return None
    current, comps = found
    reports = [
        ComponentReport(
            name=c.name,
            kind=c.kind,
            up=c.up,
            pid=c.pid,
            rss_bytes=c.rss_bytes,
            pss_bytes=c.memory_bytes,
            uss_bytes=c.uss_bytes,
            ready_seconds=c.ready_seconds,
            ports=c.ports,
            log=c.log,
        )
        for c in comps
    ]
    kinds: dict[str, KindTotals] = {}
    for kind in dict.fromkeys(c.kind for c in reports):
        of = [c for c in reports if c.kind == kind]
        readies = [c.ready_seconds for c in of if c.ready_seconds is not None]
        kinds[kind] = KindTotals(
            count=len(of),
            up=sum(c.up for c in of),
            max_rss_bytes=max(c.rss_bytes for c in of),
            max_uss_bytes=max(c.uss_bytes for c in of),
            max_ready_seconds=max(readies) if readies else None,
            pss_bytes=sum(c.pss_bytes for c in of),
        )
    ends = [
        s.started_at + s.ready_seconds
        for s in current.components
        if s.ready_seconds is not None and s.started_at
    ]
    starts = [s.started_at for s in current.components if s.started_at]
    return StatusReport(
        state_dir=str(state_dir),
        k8s_version=current.k8s_version,
        kubeconfig=current.kubeconfig,
        components=reports,
        kinds=kinds,
        up=sum(c.up for c in reports),
        rss_bytes=sum(c.rss_bytes for c in reports),
        pss_bytes=sum(c.pss_bytes for c in reports),
        ready_seconds=max(ends) - min(starts) if ends and starts else None,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f} s"


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    report = status_report(state_dir)
    if report is None:
        if args.output == "json":
            print(msgspec.json.encode({"stateDir": str(state_dir), "running": False}).decode())
        else:
            print(f"no stack in {state_dir}")
        return 3
    down_count = len(report.components) - report.up
    if args.output == "json":
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
        return 1 if down_count else 0
    print(f"stack in {state_dir} (Kubernetes {report.k8s_version}); KUBECONFIG={report.kubeconfig}")
    current = state.load(state_dir)
    if current is not None:
        print("\n".join(_bus_auth_lines(current, state_dir=state_dir)))
    print(
        f"  {'COMPONENT':<32} {'STATE':<5} {'PID':<8} {'RSS':>8} {'PSS':>8} {'USS':>8} "
        f"{'READY':>8}  PORTS"
    )
    for c in report.components:
        ports = " ".join(f"{k}={v}" for k, v in c.ports.items())
        rss, pss, uss = (
            (_mib(c.rss_bytes), _mib(c.pss_bytes), _mib(c.uss_bytes)) if c.up else ("", "", "")
        )
        print(
            f"  {c.name:<32} {'up' if c.up else 'DOWN':<5} {c.pid:<8} {rss:>8} {pss:>8} "
            f"{uss:>8} {_secs(c.ready_seconds):>8}  {ports}"
        )
        if not c.up:
            print(_indent(process.tail(Path(c.log), lines=5)))
    print("  by kind (largest RSS and USS, slowest start to ready, PSS of all):")
    for kind, t in report.kinds.items():
        print(
            f"    {kind:<26} {t.up}/{t.count} up  largest RSS {_mib(t.max_rss_bytes):>8}  "
            f"USS {_mib(t.max_uss_bytes):>8}  slowest ready {_secs(t.max_ready_seconds):>8}  "
            f"PSS {_mib(t.pss_bytes):>9}"
        )
    print(
        f"  {len(report.components)} components, {report.up} up, "
        f"{report.pss_bytes / 2**20:.0f} MiB of memory in all (proportional set size; "
        f"{_mib(report.rss_bytes)} resident set size summed), "
        f"first start to last ready {_secs(report.ready_seconds)}"
    )
    return 1 if down_count else 0


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    current = state.load(_state_dir(args))
    if current is None:
        raise CliError(f"no stack in {_state_dir(args)}; start one with `neuron-dra dev up`")
    print(current.kubeconfig)
    return 0
