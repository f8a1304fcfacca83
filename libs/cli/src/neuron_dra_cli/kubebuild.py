"""Build and cache the Kubernetes binaries of the local stack.

The binaries come from the official Kubernetes Go modules at a pinned release
(``tools/kube``): kube-apiserver, kube-controller-manager, kube-scheduler, etcd,
the upstream DRA test driver and ``hollow-node`` (the real kubelet code with a
fake container runtime and the kubelet's DRA manager). They are built once per
release into ``<cache>/kube/<version>/bin`` and reused from there. The real
``kubelet`` is built the same way, but only when a real node is asked for
(``ensure_binaries(kubelet=True)``): few stacks need it and it takes minutes.

A few older kubelets are kept too (``NODE_RELEASES``), for a simulated node only: their
``hollow-node`` is built on its own (``ensure_node_binary``) and joins a control plane of
a supported release, so that the product can be run against a kubelet it warns about.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from neuron_dra_cli import paths
from neuron_dra_cli.cachelock import duration, locked
from neuron_dra_cli.errors import CliError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Release:
    """How one Kubernetes release is built from ``tools/kube``."""

    version: str
    modfile: str  # relative to tools/kube; go.mod is the default release
    sumfile: str
    tags: tuple[str, ...]
    etcd_version: str
    build_date: str  # the release's publication time, stamped into the binaries

    @property
    def major_minor(self) -> tuple[str, str]:
        major, minor, _ = self.version.split(".")
        return major, minor


DEFAULT_VERSION = "1.36.3"
FLOOR_VERSION = "1.34.4"

SUPPORTED: dict[str, Release] = {
    "1.36.3": Release(
        version="1.36.3",
        modfile="go.mod",
        sumfile="go.sum",
        tags=(),
        etcd_version="3.6.8",
        build_date="2026-07-22T18:07:38Z",
    ),
    "1.34.4": Release(
        version="1.34.4",
        modfile="go.1.34.mod",
        sumfile="go.1.34.sum",
        tags=("k8s1_34",),
        etcd_version="3.6.4",
        build_date="2026-02-10T12:53:36Z",
    ),
}


#: Kubelets the product warns about, built only as a simulated node (``hollow-node``) that
#: joins a stack of a supported release. 1.34.1 has the DRA regression of kubernetes#133920
#: (fixed in 1.34.2), which the kubelet plugin checks for (``kubelet_plugin.kubeletcheck``).
NODE_RELEASES: dict[str, Release] = {
    "1.34.1": Release(
        version="1.34.1",
        modfile="go.1.34.1.mod",
        sumfile="go.1.34.1.sum",
        tags=("k8s1_34",),
        etcd_version="3.6.4",
        build_date="2025-09-09T19:37:19Z",
    ),
}


@dataclass(frozen=True)
class KubeBinaries:
    version: str
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    etcd: Path
    hollow_node: Path
    dra_test_driver: Path
    kubelet: Path  # present only once built with ``ensure_binaries(kubelet=True)``


@dataclass(frozen=True)
class _Binary:
    name: str  # file name in the cache
    package: str  # Go package path (or ./relative to tools/kube)
    built_as: str  # file name `go build -o DIR` gives it
    own_sources: tuple[str, ...] = ()  # tools/kube folders whose files key the build


_HOLLOW_NODE = _Binary("hollow-node", "./cmd/hollow-node", "hollow-node", ("cmd/hollow-node",))
_BINARIES: tuple[_Binary, ...] = (
    _Binary("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
    _Binary(
        "kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "kube-controller-manager",
    ),
    _Binary("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
    _Binary("etcd", "go.etcd.io/etcd/server/v3", "server"),
    _HOLLOW_NODE,
    _Binary("dra-test-driver", "k8s.io/kubernetes/test/e2e/dra/test-driver", "test-driver"),
)
_KUBELET = _Binary("kubelet", "k8s.io/kubernetes/cmd/kubelet", "kubelet")

_KEYS_FILE = "build-keys.json"


class KubeBuildError(CliError):
    """A Kubernetes binary could not be built."""


def resolve_version(version: str) -> Release:
    """The supported release for ``1.36.3``, ``v1.36.3`` or a minor like ``1.34``."""
    wanted = version.strip().removeprefix("v")
    if wanted in SUPPORTED:
        return SUPPORTED[wanted]
    by_minor = [r for v, r in SUPPORTED.items() if v.rsplit(".", 1)[0] == wanted]
    if len(by_minor) == 1:
        return by_minor[0]
    supported = ", ".join(sorted(SUPPORTED, key=_version_key, reverse=True))
    raise KubeBuildError(
        f"Kubernetes version {version!r} is not supported; supported versions: {supported}"
    )


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def bin_dir(version: str = DEFAULT_VERSION) -> Path:
    """Where the binaries of ``version`` are cached."""
    return paths.cache_dir() / "kube" / resolve_version(version).version / "bin"


def ldflags(release: Release) -> str:
    """Linker flags: stripped, with the release's version stamped in."""
    major, minor = release.major_minor
    values = {
        "gitVersion": f"v{release.version}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": release.build_date,
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in values.items()]
    return " ".join(flags)


def go_build_argv(release: Release, out_dir: Path, packages: list[str]) -> list[str]:
    """The ``go build`` command line (run in tools/kube)."""
    argv = ["go", "build", "-mod=readonly", "-trimpath", f"-ldflags={ldflags(release)}"]
    if release.modfile != "go.mod":
        argv.append(f"-modfile={release.modfile}")
    if release.tags:
        argv.append(f"-tags={','.join(release.tags)}")
    return [*argv, "-o", str(out_dir) + os.sep, *packages]


def _build_key(release: Release, binary: _Binary, module_dir: Path) -> str:
    """What a cached binary depends on: the release, flags and its own sources."""
    h = hashlib.sha256()
    h.update(json.dumps([release.version, release.tags, ldflags(release)]).encode())
    if binary.own_sources:
        files = [module_dir / release.modfile, module_dir / release.sumfile]
        for folder in binary.own_sources:
            files += sorted((module_dir / folder).rglob("*.go"))
        for f in files:
            h.update(f.relative_to(module_dir).as_posix().encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def _result(release: Release, bdir: Path) -> KubeBinaries:
    return KubeBinaries(
        version=release.version,
        kube_apiserver=bdir / "kube-apiserver",
        kube_controller_manager=bdir / "kube-controller-manager",
        kube_scheduler=bdir / "kube-scheduler",
        etcd=bdir / "etcd",
        hollow_node=bdir / "hollow-node",
        dra_test_driver=bdir / "dra-test-driver",
        kubelet=bdir / "kubelet",
    )


def _wanted(*, kubelet: bool) -> tuple[_Binary, ...]:
    return (*_BINARIES, _KUBELET) if kubelet else _BINARIES


def _missing(
    release: Release, bdir: Path, module_dir: Path, wanted: tuple[_Binary, ...]
) -> list[tuple[_Binary, str]]:
    try:
        keys = json.loads((bdir.parent / _KEYS_FILE).read_text())
    except (OSError, ValueError):
        keys = {}
    out = []
    for b in wanted:
        key = _build_key(release, b, module_dir)
        if keys.get(b.name) != key or not os.access(bdir / b.name, os.X_OK):
            out.append((b, key))
    return out


def _watch(
    tmp: Path,
    todo: list[_Binary],
    t0: float,
    progress: Progress,
    stop: threading.Event,
    done: set[str],
) -> None:
    """Print one line per binary as `go build` writes it, and a heartbeat."""
    sizes: dict[str, int] = {}
    last_note = t0
    while not stop.wait(1.0):
        for b in todo:
            if b.name in done:
                continue
            try:
                size = (tmp / b.built_as).stat().st_size
            except OSError:
                continue
            if size and sizes.get(b.name) == size:
                done.add(b.name)
                progress(f"{b.name} built ({duration(time.monotonic() - t0)})")
            sizes[b.name] = size
        now = time.monotonic()
        if now - last_note >= 60 and len(done) < len(todo):
            last_note = now
            progress(f"still compiling ({duration(now - t0)}, {len(done)}/{len(todo)} done)")


def go_module_cache() -> Path:
    """Go's module cache (``go env GOMODCACHE``), where building the binaries leaves the
    sources of the Kubernetes modules: ``$GOPATH/pkg/mod`` unless the user set it elsewhere."""
    try:
        out = subprocess.run(
            [_go(), "env", "GOMODCACHE"], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise KubeBuildError(f"`go env GOMODCACHE` failed: {exc}") from None
    found = out.stdout.strip()
    if not found:
        raise KubeBuildError("`go env GOMODCACHE` printed nothing; is GOPATH set to a folder?")
    return Path(found)


def kube_module_dir(module: str, version: str = DEFAULT_VERSION) -> Path:
    """The sources of a Kubernetes staging module (``k8s.io/api``, ``k8s.io/kubelet``...) at
    the release ``version`` (1.36.3 -> v0.36.3) in Go's module cache, where building that
    release's binaries puts them; :class:`KubeBuildError` saying so when they are not there.

    >>> kube_module_dir("k8s.io/api")
    PosixPath('/root/go/pkg/mod/k8s.io/api@v0.36.3')
    """
    release = resolve_version(version)
    _, minor = release.major_minor
    patch = release.version.rsplit(".", 1)[1]
    tag = f"v0.{minor}.{patch}"
    cache = go_module_cache()
    # The cache spells an upper-case letter as '!' and its lower case (Go's module escaping).
    escaped = "".join(f"!{c.lower()}" if c.isupper() else c for c in module)
    folder = cache / f"{escaped}@{tag}"
    if not folder.is_dir():
        raise KubeBuildError(
            f"{module}@{tag} is not in Go's module cache ({cache}, from `go env GOMODCACHE`); "
            f"building the Kubernetes {release.version} binaries puts it there: "
            f"`neuron-dra dev build --k8s-version {release.version}`"
        )
    return folder


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise KubeBuildError(
            "`go` is not on PATH; the Kubernetes binaries are built from the official "
            "Go modules (tools/kube) and need Go 1.26 or newer (https://go.dev/dl/)"
        )
    return go


def ensure_binaries(
    version: str = DEFAULT_VERSION, *, progress: Progress = print, kubelet: bool = False
) -> KubeBinaries:
    """Return the cached binaries of ``version``, building whatever is missing (the real
    ``kubelet`` too when ``kubelet`` is true)."""
    release = resolve_version(version)
    bdir = paths.cache_dir() / "kube" / release.version / "bin"
    _build(release, bdir, _wanted(kubelet=kubelet), progress)
    return _result(release, bdir)


def ensure_node_binary(version: str, *, progress: Progress = print) -> Path:
    """The cached ``hollow-node`` of ``version`` (a supported release or one of
    ``NODE_RELEASES``), building it alone when it is missing: a simulated node of that
    kubelet release, to join a stack of a supported one."""
    wanted = version.strip().removeprefix("v")
    release = NODE_RELEASES.get(wanted)
    if release is None:
        try:
            release = resolve_version(wanted)
        except KubeBuildError:
            known = ", ".join(sorted({*SUPPORTED, *NODE_RELEASES}, key=_version_key, reverse=True))
            raise KubeBuildError(
                f"no simulated node of Kubernetes {version!r}; known releases: {known}"
            ) from None
    bdir = paths.cache_dir() / "kube" / release.version / "bin"
    _build(release, bdir, (_HOLLOW_NODE,), progress)
    return bdir / _HOLLOW_NODE.name


def _build(release: Release, bdir: Path, wanted: tuple[_Binary, ...], progress: Progress) -> None:
    """Build whichever of ``wanted`` is missing or stale in ``bdir``."""
    module_dir = paths.repo_root() / "tools" / "kube"
    if not _missing(release, bdir, module_dir, wanted):
        return
    with locked(bdir.parent / ".lock", progress=progress, what="another build of the same version"):
        # Another process may have built them meanwhile.
        todo = _missing(release, bdir, module_dir, wanted)
        if not todo:
            return
        go = _go()
        bdir.mkdir(parents=True, exist_ok=True)
        names = ", ".join(b.name for b, _ in todo)
        slow = any(b.name not in ("hollow-node", "kubelet") for b, _ in todo)
        progress(
            f"building Kubernetes v{release.version} ({names}) with {go}"
            + ("; a first build takes about 10 minutes on 2 cores" if slow else "")
        )
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".build-", dir=bdir.parent) as tmp_name:
            tmp = Path(tmp_name)
            argv = go_build_argv(release, tmp, [b.package for b, _ in todo])
            argv[0] = go
            env = {
                **os.environ,
                "CGO_ENABLED": "0",
                "GOWORK": "off",
                "GOFLAGS": "-mod=readonly -buildvcs=false",
            }
            stop = threading.Event()
            done: set[str] = set()
            watcher = threading.Thread(
                target=_watch,
                args=(tmp, [b for b, _ in todo], t0, progress, stop, done),
                daemon=True,
            )
            watcher.start()
            try:
                proc = subprocess.run(
                    argv,
                    cwd=module_dir,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    check=False,
                )
            finally:
                stop.set()
                watcher.join()
            if proc.returncode != 0:
                raise KubeBuildError(
                    f"building Kubernetes v{release.version} ({names}) failed "
                    f"(go build exited {proc.returncode}; command, run in {module_dir}: "
                    f"{' '.join(argv)}):\n{proc.stdout.strip()}"
                )
            keys_path = bdir.parent / _KEYS_FILE
            try:
                keys = json.loads(keys_path.read_text())
            except (OSError, ValueError):
                keys = {}
            for b, key in todo:
                built = tmp / b.built_as
                if not built.is_file():
                    raise KubeBuildError(
                        f"go build did not produce {b.name} ({b.package}) for v{release.version}"
                    )
                if b.name not in done:
                    progress(f"{b.name} built ({duration(time.monotonic() - t0)})")
                os.replace(built, bdir / b.name)
                keys[b.name] = key
            tmp_keys = keys_path.with_suffix(".tmp")
            tmp_keys.write_text(json.dumps(keys, indent=2, sort_keys=True) + "\n")
            os.replace(tmp_keys, keys_path)
        progress(
            f"Kubernetes v{release.version} binaries ready in {bdir} ({duration(time.monotonic() - t0)})"
        )
