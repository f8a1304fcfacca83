"""Build or fetch, and cache, the observability tools the stack and the tests run.

- **Jaeger** (v2: an OpenTelemetry Collector distribution with Jaeger's in-memory storage,
  query API and UI), the trace backend of ``neuron-dra dev up --tracing`` and of the tracing
  tests. Built from its Go module at the version ``tools/jaeger/go.mod`` pins, stripped
  (``-trimpath -ldflags=-s -w``), into ``<cache>/jaeger/<version>/bin/jaeger``.
- **promtool**, which checks and unit-tests the alerting rules of the monitoring component.
  Taken from Debian's ``prometheus`` package without root: ``apt-get download`` then
  ``dpkg-deb -x``, into ``<cache>/promtool/<package version>/promtool``.

Both are made once, under a file lock (two test runs starting together wait for each other,
as the Kubernetes build does), and reused. ``python -m neuron_dra_cli.toolbuild`` makes both
(``scripts/test.sh`` runs it before the tests).
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
    "JAEGER_PACKAGE",
    "ToolBuildError",
    "ensure_jaeger",
    "ensure_promtool",
    "jaeger_module_version",
]

Progress = Callable[[str], None]

JAEGER_PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"
_JAEGER_MODULE = "github.com/jaegertracing/jaeger"
_JAEGER_FLAGS = ("-mod=readonly", "-trimpath", "-ldflags=-s -w")
_KEY_FILE = "build-key"
_PROMTOOL_PACKAGE = "prometheus"


class ToolBuildError(CliError):
    """A tool could not be built or fetched."""


def _module_dir() -> Path:
    return paths.repo_root() / "tools" / "jaeger"


def jaeger_module_version(module_dir: Path | None = None) -> str:
    """The Jaeger module version ``tools/jaeger/go.mod`` requires (``v1.76.0``: Jaeger
    tags each v2 release with a v1 module version too, and Go resolves those)."""
    text = ((module_dir or _module_dir()) / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(_JAEGER_MODULE)}\s+(v\S+)", text, re.M)
    if found is None:
        raise ToolBuildError(f"tools/jaeger/go.mod does not require {_JAEGER_MODULE}")
    return found.group(1)


def _jaeger_key(module_dir: Path) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(_JAEGER_FLAGS).encode())
    for name in ("go.mod", "go.sum"):
        h.update(name.encode() + b"\0" + (module_dir / name).read_bytes() + b"\0")
    return h.hexdigest()


def _current(binary: Path, key: str) -> bool:
    try:
        return (binary.parent.parent / _KEY_FILE).read_text().strip() == key and os.access(
            binary, os.X_OK
        )
    except OSError:
        return False


def ensure_jaeger(*, progress: Progress = print) -> Path:
    """The cached Jaeger binary, built first if missing or built from other pins."""
    module_dir = _module_dir()
    version = jaeger_module_version(module_dir)
    root = paths.cache_dir() / "jaeger" / version
    binary = root / "bin" / "jaeger"
    key = _jaeger_key(module_dir)
    if _current(binary, key):
        return binary
    with locked(root / ".lock", progress=progress, what="another process making the same tool"):
        if _current(binary, key):  # another process built it meanwhile
            return binary
        go = shutil.which("go")
        if go is None:
            raise ToolBuildError(
                "`go` is not on PATH; Jaeger is built from its Go module (tools/jaeger) and "
                "needs Go 1.26 or newer (https://go.dev/dl/)"
            )
        progress(
            f"building Jaeger {version} ({JAEGER_PACKAGE}) with {go}; a first build takes "
            "about 6 CPU-minutes (3 minutes on 2 idle cores)"
        )
        t0 = time.monotonic()
        (root / "bin").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
            out = Path(tmp) / "jaeger"
            argv = [go, "build", *_JAEGER_FLAGS, "-o", str(out), JAEGER_PACKAGE]
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
            if proc.returncode != 0 or not out.is_file():
                raise ToolBuildError(
                    f"building Jaeger {version} failed (go build exited {proc.returncode}; "
                    f"command, run in {module_dir}: {' '.join(argv)}):\n{proc.stdout.strip()}"
                )
            os.replace(out, binary)
        (root / _KEY_FILE).write_text(key + "\n")
        progress(f"Jaeger {version} ready in {binary} ({duration(time.monotonic() - t0)})")
    return binary


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
    """Make both tools; print where they are."""
    try:
        jaeger = ensure_jaeger()
        promtool = ensure_promtool()
    except CliError as exc:
        print(f"neuron-dra: {exc}", file=sys.stderr)
        return 2
    print(f"jaeger   {jaeger}\npromtool {promtool}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
