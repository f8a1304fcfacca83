"""Real nodes: the real kubelet with containerd and runc, beside the simulated nodes.

``neuron-dra dev up --real-nodes N`` starts, per real node, a containerd of its own (root,
state, sockets, CNI bridge and CDI folder under the node's folder) with the pause image
imported, then a kubelet registered to the stack's apiserver with its own client and
serving certificates. ``dev down`` stops the kubelets, kills every container, stops
containerd and removes what the containers left behind (shims, mounts, the bridge, the
node's folder), so nothing of a real node outlives its stack.

It needs root (mounts, network namespaces, cgroups), Debian's runc and CNI plugins.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from neuron_dra_cli.errors import CliError
from neuron_dra_cli.imagebuild import find_tool, tool_env
from neuron_dra_cli.stack import probes, process, realconfig, state
from neuron_dra_cli.stack.components import Component
from neuron_dra_cli.stack.layout import Layout
from neuron_dra_cli.stack.pki import Pki, write_kubeconfig
from neuron_dra_cli.toolbuild import ContainerdBinaries

Progress = Callable[[str], None]

#: Component kinds in ``state.json``.
KUBELET_KIND = "real-node"
RUNTIME_KIND = "containerd"
_CNI_PLUGINS = ("bridge", "host-local", "loopback")
_HOST_CONTAINER_LOGS = Path("/var/log/containers")


class RealNodeError(CliError):
    """A real node cannot run here, or one of its steps failed."""


def missing_requirements(
    *, runc: Path = realconfig.RUNC, cni_bin_dir: Path = realconfig.CNI_BIN_DIR
) -> list[str]:
    """What this machine lacks to run a real node, each said with how to get it (``runc``
    and ``cni_bin_dir``: where containerd's config says they are)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (containerd mounts filesystems and creates network namespaces)")
    if not os.access(runc, os.X_OK):
        missing.append(f"runc at {runc} (Debian: apt-get install runc)")
    for name in _CNI_PLUGINS:
        if not os.access(cni_bin_dir / name, os.X_OK):
            missing.append(
                f"the CNI plugin {cni_bin_dir / name} "
                "(Debian: apt-get install containernetworking-plugins)"
            )
    # ip and podman may sit in /usr/sbin or /sbin, which a user's PATH can lack: found there
    # too, and run with those folders on their PATH (imagebuild.tool_env).
    for tool in ("gcc", "podman", "ip"):
        if find_tool(tool) is None:
            missing.append(
                f"`{tool}` on PATH, /usr/sbin or /sbin (it builds the pause image / manages "
                "the bridge)"
            )
    return missing


def check_requirements(
    count: int, *, runc: Path = realconfig.RUNC, cni_bin_dir: Path = realconfig.CNI_BIN_DIR
) -> None:
    """Raise, naming everything missing at once, if ``count`` real nodes cannot run here."""
    if count <= 0:
        return
    missing = missing_requirements(runc=runc, cni_bin_dir=cni_bin_dir)
    if missing:
        raise RealNodeError(
            f"--real-nodes {count} needs: " + "; ".join(missing) + ". Without them run the "
            "stack with simulated nodes only (--real-nodes 0)."
        )


def node_paths(layout: Layout, name: str) -> realconfig.NodePaths:
    """A real node's folder, reached through the layout's short alias (socket paths)."""
    return realconfig.NodePaths(layout.ensure_short_nodes() / name)


def _socket_open(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


def runtime_component(
    *, layout: Layout, name: str, index: int, binaries: ContainerdBinaries
) -> Component:
    """The node's containerd, its folder made afresh and its configs written."""
    paths = node_paths(layout, name)
    if paths.base.exists():  # left by a stack that was not stopped with `dev down`
        _unmount_under([paths.base])
        shutil.rmtree(paths.base)
    for folder in (
        paths.containerd_root,
        paths.containerd_state,
        paths.cni_conf_dir,
        paths.cni_data_dir,
        paths.cdi_dir,
        paths.kubelet_root,
        paths.pod_logs,
    ):
        folder.mkdir(parents=True, exist_ok=True)
    net = realconfig.network(stack_id=str(layout.root), index=index)
    make_bridge(net)
    stream_port = process.free_port()
    paths.containerd_config.write_text(
        realconfig.containerd_config(paths=paths, stream_port=stream_port)
    )
    (paths.cni_conf_dir / "10-neuron-dra.conflist").write_text(
        realconfig.cni_config(paths=paths, net=net)
    )
    sock = paths.socket
    return Component(
        name=f"containerd-{name}",
        kind=RUNTIME_KIND,
        argv=[str(binaries.containerd), f"--config={paths.containerd_config}"],
        ports={"stream": stream_port},
        ready=lambda: _socket_open(sock),
        # containerd starts containerd-shim-runc-v2 by name from its PATH.
        env={"PATH": f"{binaries.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def make_bridge(net: realconfig.Network) -> None:
    """Create the node's bridge with its address before the kubelet starts: the address is
    the node's IP, which the kubelet wants on the host (the CNI plugin finds the bridge
    and its gateway address there and adds the pods' ports to it)."""
    subprocess.run(
        ["ip", "link", "delete", net.bridge], capture_output=True, check=False, env=tool_env()
    )
    for argv in (
        ["ip", "link", "add", net.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{net.gateway}/{net.prefix_length}", "dev", net.bridge],
        ["ip", "link", "set", net.bridge, "up"],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=tool_env())
        if proc.returncode != 0:
            raise RealNodeError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr}")


def kubelet_component(
    *,
    layout: Layout,
    name: str,
    index: int,
    binary: Path,
    pki: Pki,
    server: str,
    labels: dict[str, str] | None = None,
) -> Component:
    """The node's kubelet, with its kubeconfig, certificates and config written;
    ``labels`` adds node labels to the real-node one."""
    paths = node_paths(layout, name)
    net = realconfig.network(stack_id=str(layout.root), index=index)
    kubeconfig = write_kubeconfig(
        layout.component_kubeconfig(name),
        server=server,
        ca=pki.ca.cert,
        pair=pki.node(name),
        user=f"system:node:{name}",
    )
    serving = pki.kubelet_serving(name, ip=net.gateway)
    port = process.free_port()
    healthz = process.free_port()
    paths.kubelet_config.write_text(
        realconfig.kubelet_config(
            paths=paths,
            tls=realconfig.KubeletTls(cert=serving.cert, key=serving.key, client_ca=pki.ca.cert),
            address=net.gateway,
            port=port,
            healthz_port=healthz,
        )
    )
    return Component(
        name=f"kubelet-{name}",
        kind=KUBELET_KIND,
        argv=realconfig.kubelet_argv(
            binary=binary,
            paths=paths,
            kubeconfig=kubeconfig,
            name=name,
            node_ip=net.gateway,
            labels={realconfig.REAL_NODE_LABEL: "true", **(labels or {})},
        ),
        ports={"kubelet": port, "healthz": healthz},
        ready=lambda: probes.http_ok(f"http://127.0.0.1:{healthz}/healthz"),
        # It runs mount, iptables and friends by name, from /usr/sbin or /sbin on Debian.
        env={"PATH": tool_env()["PATH"]},
    )


def ctr(binaries: ContainerdBinaries, paths: realconfig.NodePaths, *args: str) -> str:
    """Run ``ctr`` against the node's containerd in the Kubernetes namespace."""
    argv = [
        str(binaries.ctr),
        f"--address={paths.socket}",
        f"--namespace={realconfig.K8S_NAMESPACE}",
        *args,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RealNodeError(
            f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
        )
    return proc.stdout


def import_archive(
    binaries: ContainerdBinaries, paths: realconfig.NodePaths, archive: Path
) -> None:
    """Import an OCI archive's images into the node's containerd (for the kubelet)."""
    ctr(binaries, paths, "images", "import", "--local", str(archive))


def node_names(count: int) -> list[str]:
    return [realconfig.node_name(i) for i in range(count)]


# --- stopping ---------------------------------------------------------------------------


def _config_of(entry: state.ComponentState) -> Path | None:
    for arg in entry.argv:
        if arg.startswith("--config="):
            return Path(arg.removeprefix("--config="))
    return None


def _running(c: state.ComponentState) -> process.Running:
    return process.Running(pid=c.pid, start_ticks=c.start_ticks)


def stop(current: state.StackState, *, timeout: float = 15.0) -> None:
    """Stop every real node of ``current``: kubelets first, then each node's containers,
    containerd, the shims, mounts, bridge and folder. A no-op without real nodes."""
    kubelets = [c for c in current.components if c.kind == KUBELET_KIND]
    runtimes = [c for c in current.components if c.kind == RUNTIME_KIND]
    if not kubelets and not runtimes:
        return
    process.stop([_running(c) for c in kubelets], timeout=timeout)
    for entry in runtimes:
        config = _config_of(entry)
        if config is None:
            process.stop([_running(entry)], timeout=timeout)
            continue
        paths = realconfig.NodePaths(config.parent.parent)
        _teardown(entry, paths=paths, timeout=timeout)


def _teardown(entry: state.ComponentState, *, paths: realconfig.NodePaths, timeout: float) -> None:
    ctr_binary = Path(entry.argv[0]).parent / "ctr"
    bases = _spellings(paths.base)
    if process.alive(_running(entry)) and os.access(ctr_binary, os.X_OK):
        _kill_tasks(ctr_binary, paths)
    process.stop([_running(entry)], timeout=timeout)
    _kill_shims(_spellings(paths.socket))
    _remove_log_links(_spellings(paths.pod_logs))
    _unmount_under(bases)
    bridge = _bridge_of(paths)
    if bridge:
        subprocess.run(
            ["ip", "link", "delete", bridge], capture_output=True, check=False, env=tool_env()
        )
    shutil.rmtree(bases[-1], ignore_errors=True)


def _spellings(path: Path) -> list[Path]:
    """``path`` as given (through the short alias) and as the kernel reports it."""
    resolved = path.resolve()
    return [path] if resolved == path else [path, resolved]


def _kill_tasks(ctr_binary: Path, paths: realconfig.NodePaths) -> None:
    """SIGKILL every container of the node and delete it, so runc removes its cgroups and
    the shims their mounts; the kubelet is already stopped and restarts nothing."""
    base = [str(ctr_binary), f"--address={paths.socket}", f"--namespace={realconfig.K8S_NAMESPACE}"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=60, check=False
        )

    tasks = run("tasks", "list", "--quiet").stdout.split()
    for task in tasks:
        run("tasks", "kill", "--all", "--signal", "SIGKILL", task)
    for task in tasks:
        run("tasks", "delete", "--force", task)
    for container in run("containers", "list", "--quiet").stdout.split():
        run("containers", "delete", container)


def _kill_shims(sockets: Sequence[Path]) -> None:
    """SIGKILL any shim still serving this node's containerd: each runs in a session of
    its own (not the daemon's group) and names the daemon's socket on its command line."""
    wanted = {str(s).encode() for s in sockets}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and wanted & set(argv):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid_dir.name), signal.SIGKILL)


def _remove_log_links(pod_logs: Sequence[Path]) -> None:
    """The kubelet links each container's log into the host's /var/log/containers."""
    try:
        links = list(_HOST_CONTAINER_LOGS.iterdir())
    except OSError:
        return
    prefixes = tuple(str(p) + os.sep for p in pod_logs)
    for link in links:
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith(prefixes):
            link.unlink(missing_ok=True)


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            # The mount point is the 5th field, with spaces and the like octal-escaped.
            points.append(fields[4].encode().decode("unicode_escape"))
    return points


def _unmount_under(bases: Sequence[Path]) -> None:
    """Unmount (lazily, deepest first) everything mounted under the node's folder: container
    root filesystems, network namespaces, the kubelet's volume mounts."""
    prefixes = tuple(str(b) + os.sep for b in bases)
    inside = [p for p in _mount_points() if p.startswith(prefixes)]
    for point in sorted(inside, key=lambda p: p.count("/"), reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def _bridge_of(paths: realconfig.NodePaths) -> str:
    try:
        for conf in paths.cni_conf_dir.glob("*.conflist"):
            for plugin in json.loads(conf.read_text()).get("plugins", []):
                if plugin.get("type") == "bridge":
                    return str(plugin.get("bridge", ""))
    except (OSError, ValueError):
        return ""
    return ""
