"""Build or fetch, and cache, the observability tools the stack and the tests run.

- **Jaeger** (v2: an OpenTelemetry Collector distribution with Jaeger's in-memory storage,
  query API and UI), the trace backend of ``neuron-dra dev up --tracing`` and of the tracing
  tests. Built from its Go module at the version ``tools/jaeger/go.mod`` pins, stripped
  (``-trimpath -ldflags=-s -w``), into ``<cache>/jaeger/<version>/bin/jaeger``.
- **Alertmanager**, which receives the alerts of ``neuron-dra-alerts`` on the local stack and
  in the alerting tests. Built from its Go module (``tools/alertmanager/go.mod``) the same way,
  into ``<cache>/alertmanager/<version>/bin/alertmanager``, web UI included. (Debian's
  ``prometheus-alertmanager`` ships without the UI and reads its default notification template
  from a fixed path under ``/usr/share``, so it cannot run from an unpacked copy.)
- **containerd** (with ``containerd-shim-runc-v2`` and ``ctr``), the container runtime of
  the stack's real nodes (``neuron-dra dev up --real-nodes N``). Built from its Go module
  (``tools/containerd/go.mod``) the same way, into ``<cache>/containerd/<version>/bin/``.
  Made only when a real node is asked for.
- **promtool**, which checks and unit-tests the alerting rules of the monitoring component.
  Taken from Debian's ``prometheus`` package without root: ``apt-get download`` then
  ``dpkg-deb -x``, into ``<cache>/promtool/<package version>/promtool``.

Each is made once, under a file lock (two test runs starting together wait for each other,
as the Kubernetes build does), and reused. ``python -m neuron_dra_cli.toolbuild`` makes all
three (``scripts/test.sh`` runs it before the tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from neuron_dra_cli import paths
from neuron_dra_cli.cachelock import duration, locked
from neuron_dra_cli.errors import CliError

__all__ = [
    "ALERTMANAGER",
    "ALERTMANAGER_PACKAGE",
    "CONTAINERD",
    "JAEGER",
    "JAEGER_PACKAGE",
    "ContainerdBinaries",
    "GoTool",
    "ToolBuildError",
    "ensure_alertmanager",
    "ensure_containerd",
    "ensure_go_tool",
    "ensure_jaeger",
    "ensure_promtool",
    "jaeger_module_version",
]

Progress = Callable[[str], None]

JAEGER_PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"
_JAEGER_MODULE = "github.com/jaegertracing/jaeger"
ALERTMANAGER_PACKAGE = "github.com/prometheus/alertmanager/cmd/alertmanager"
_GO_FLAGS = ("-mod=readonly", "-trimpath", "-ldflags=-s -w")
_KEY_FILE = "build-key"
_PROMTOOL_PACKAGE = "prometheus"


class ToolBuildError(CliError):
    """A tool could not be built or fetched."""


class GoTool:
    """A program built from a Go module that ``tools/<name>/go.mod`` pins.

    ``also``: more packages of the module built beside it into the same folder (each named
    after its last path element); ``version_var``: a Go variable the module version is
    stamped into (``-X``), so the program reports the pinned release.
    """

    def __init__(
        self,
        *,
        name: str,
        module: str,
        package: str,
        what: str,
        minutes: str,
        also: tuple[str, ...] = (),
        version_var: str = "",
    ) -> None:
        self.name = name
        self.module = module
        self.package = package
        self.what = what
        self.minutes = minutes
        self.also = also
        self.version_var = version_var

    def go_flags(self, version: str) -> tuple[str, ...]:
        """``go build``'s flags: stripped, trimmed, the version stamped in when asked."""
        if not self.version_var:
            return _GO_FLAGS
        return (*_GO_FLAGS[:-1], f"{_GO_FLAGS[-1]} -X {self.version_var}={version}")

    def module_dir(self) -> Path:
        return paths.repo_root() / "tools" / self.name

    def version(self, module_dir: Path | None = None) -> str:
        """The module version ``tools/<name>/go.mod`` requires."""
        text = ((module_dir or self.module_dir()) / "go.mod").read_text()
        found = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)}\s+(v\S+)", text, re.M)
        if found is None:
            raise ToolBuildError(f"tools/{self.name}/go.mod does not require {self.module}")
        return found.group(1)


JAEGER = GoTool(
    name="jaeger",
    module=_JAEGER_MODULE,
    package=JAEGER_PACKAGE,
    what="Jaeger",
    minutes="about 6 CPU-minutes (3 minutes on 2 idle cores)",
)
ALERTMANAGER = GoTool(
    name="alertmanager",
    module="github.com/prometheus/alertmanager",
    package=ALERTMANAGER_PACKAGE,
    what="Alertmanager",
    minutes="about 3 CPU-minutes",
)
_CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD = GoTool(
    name="containerd",
    module=_CONTAINERD_MODULE,
    package=f"{_CONTAINERD_MODULE}/cmd/containerd",
    what="containerd",
    minutes="about 4 CPU-minutes",
    # containerd starts the shim by name from its PATH; ctr imports images into it.
    also=(f"{_CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2", f"{_CONTAINERD_MODULE}/cmd/ctr"),
    version_var=f"{_CONTAINERD_MODULE}/version.Version",
)


def jaeger_module_version(module_dir: Path | None = None) -> str:
    """The Jaeger module version ``tools/jaeger/go.mod`` requires (``v1.76.0``: Jaeger
    tags each v2 release with a v1 module version too, and Go resolves those)."""
    return JAEGER.version(module_dir)


def _build_key(module_dir: Path, flags: tuple[str, ...] = _GO_FLAGS) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(flags).encode())
    for name in ("go.mod", "go.sum"):
        h.update(name.encode() + b"\0" + (module_dir / name).read_bytes() + b"\0")
    return h.hexdigest()


def _current(binaries: list[Path], key: str) -> bool:
    try:
        return (binaries[0].parent.parent / _KEY_FILE).read_text().strip() == key and all(
            os.access(b, os.X_OK) for b in binaries
        )
    except OSError:
        return False


def ensure_go_tool(tool: GoTool, *, progress: Progress = print) -> Path:
    """The cached binary of ``tool``, built first if missing or built from other pins."""
    module_dir = tool.module_dir()
    version = tool.version(module_dir)
    root = paths.cache_dir() / tool.name / version
    binary = root / "bin" / tool.name
    packages = [tool.package, *tool.also]
    binaries = [root / "bin" / p.rsplit("/", 1)[-1] for p in packages]
    flags = tool.go_flags(version)
    key = _build_key(module_dir, flags)
    if _current(binaries, key):
        return binary
    with locked(root / ".lock", progress=progress, what="another process making the same tool"):
        if _current(binaries, key):  # another process built it meanwhile
            return binary
        go = shutil.which("go")
        if go is None:
            raise ToolBuildError(
                f"`go` is not on PATH; {tool.what} is built from its Go module "
                f"(tools/{tool.name}) and needs Go 1.26 or newer (https://go.dev/dl/)"
            )
        progress(
            f"building {tool.what} {version} ({tool.package}) with {go}; a first build takes "
            f"{tool.minutes}"
        )
        t0 = time.monotonic()
        (root / "bin").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
            out = Path(tmp) / tool.name
            argv = [go, "build", *flags, "-o", str(out), tool.package]
            if tool.also:
                argv = [go, "build", *flags, "-o", tmp + os.sep, *packages]
            env = {
                **os.environ,
                "CGO_ENABLED": "0",
                "GOWORK": "off",
                "GOFLAGS": "-mod=readonly -buildvcs=false",
            }
            proc = subprocess.run(
                argv,
                cwd=module_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
            )
            built = [Path(tmp) / b.name for b in binaries]
            if proc.returncode != 0 or not all(b.is_file() for b in built):
                raise ToolBuildError(
                    f"building {tool.what} {version} failed (go build exited "
                    f"{proc.returncode}; command, run in {module_dir}: {' '.join(argv)}):\n"
                    f"{proc.stdout.strip()}"
                )
            for src, dest in zip(built, binaries, strict=True):
                os.replace(src, dest)
        (root / _KEY_FILE).write_text(key + "\n")
        progress(f"{tool.what} {version} ready in {binary} ({duration(time.monotonic() - t0)})")
    return binary


def ensure_jaeger(*, progress: Progress = print) -> Path:
    """The cached Jaeger binary, built first if missing or built from other pins."""
    return ensure_go_tool(JAEGER, progress=progress)


def ensure_alertmanager(*, progress: Progress = print) -> Path:
    """The cached Alertmanager binary, built first if missing or built from other pins."""
    return ensure_go_tool(ALERTMANAGER, progress=progress)


class ContainerdBinaries:
    """containerd and the programs built beside it (one folder: containerd's PATH)."""

    def __init__(self, containerd: Path) -> None:
        self.containerd = containerd
        self.bin_dir = containerd.parent
        self.shim = self.bin_dir / "containerd-shim-runc-v2"
        self.ctr = self.bin_dir / "ctr"


def ensure_containerd(*, progress: Progress = print) -> ContainerdBinaries:
    """The cached containerd, its runc shim and ctr, built first if missing or built from
    other pins."""
    return ContainerdBinaries(ensure_go_tool(CONTAINERD, progress=progress))


def _promtool_cached(root: Path) -> Path | None:
    if not root.is_dir():
        return None
    for candidate in sorted(root.glob("*/promtool"), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_promtool(*, progress: Progress = print) -> Path:
    """The cached promtool, fetched from Debian's ``prometheus`` package first if missing."""
    root = paths.cache_dir() / "promtool"
    found = _promtool_cached(root)
    if found is not None:
        return found
    with locked(root / ".lock", progress=progress, what="another process making the same tool"):
        found = _promtool_cached(root)
        if found is not None:
            return found
        for tool in ("apt-get", "dpkg-deb"):
            if shutil.which(tool) is None:
                raise ToolBuildError(
                    f"`{tool}` is not on PATH: promtool comes from Debian's "
                    f"`{_PROMTOOL_PACKAGE}` package (apt-get download, dpkg-deb -x); on another "
                    f"system put a promtool at {root}/<version>/promtool"
                )
        progress(f"fetching promtool from Debian's {_PROMTOOL_PACKAGE} package")
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
            work = Path(tmp)
            _run(["apt-get", "download", _PROMTOOL_PACKAGE], cwd=work)
            debs = sorted(work.glob(f"{_PROMTOOL_PACKAGE}_*.deb"))
            if not debs:
                raise ToolBuildError(f"apt-get download {_PROMTOOL_PACKAGE} left no .deb in {work}")
            version = debs[0].name.split("_")[1].replace("%3a", ":")
            _run(["dpkg-deb", "-x", str(debs[0]), str(work / "root")], cwd=work)
            extracted = work / "root" / "usr" / "bin" / "promtool"
            if not extracted.is_file():
                raise ToolBuildError(f"{debs[0].name} holds no usr/bin/promtool")
            target = root / _safe(version) / "promtool"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(extracted, target)
        progress(f"promtool {version} in {target}")
        return target


def _safe(version: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+~-]", "_", version)


def _run(argv: list[str], *, cwd: Path) -> None:
    proc = subprocess.run(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    if proc.returncode != 0:
        raise ToolBuildError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout.strip()}")


def main() -> int:
    """Make every tool; print where they are."""
    try:
        jaeger = ensure_jaeger()
        alertmanager = ensure_alertmanager()
        promtool = ensure_promtool()
    except CliError as exc:
        print(f"neuron-dra: {exc}", file=sys.stderr)
        return 2
    print(f"jaeger       {jaeger}\nalertmanager {alertmanager}\npromtool     {promtool}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
