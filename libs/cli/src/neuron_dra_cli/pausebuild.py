"""Build and cache the pause image of the stack's real nodes.

Every pod's sandbox runs the pause program; nothing can be pulled here, so it is built
from the Kubernetes module the control plane is built from (``build/pause/linux/pause.c``
at the pinned release, found through ``tools/kube``'s ``go.mod``), linked statically
with gcc, in an image with nothing else (``FROM scratch``), and kept as an OCI archive
under ``<cache>/pause/<release>/pause.oci.tar`` for ``ctr images import``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from neuron_dra_cli import imagebuild, kubebuild, paths
from neuron_dra_cli.cachelock import duration, locked
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack.realconfig import PAUSE_IMAGE

Progress = Callable[[str], None]

_PAUSE_SOURCE = Path("build") / "pause" / "linux" / "pause.c"
_CONTAINERFILE = 'FROM scratch\nADD pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n'


class PauseBuildError(CliError):
    """The pause image could not be built."""


def kubernetes_module_dir(version: str) -> Path:
    """Where the Go module cache holds ``k8s.io/kubernetes`` at release ``version`` (the
    module is downloaded first if it is not there)."""
    release = kubebuild.resolve_version(version)
    module_dir = paths.repo_root() / "tools" / "kube"
    argv = ["go", "list", "-mod=readonly", "-m", "-f", "{{.Dir}}"]
    if release.modfile != "go.mod":
        argv.append(f"-modfile={release.modfile}")
    argv.append("k8s.io/kubernetes")
    proc = subprocess.run(
        argv,
        cwd=module_dir,
        env={**os.environ, "GOWORK": "off"},
        capture_output=True,
        text=True,
        check=False,
    )
    found = Path(proc.stdout.strip())
    if proc.returncode != 0 or not (found / _PAUSE_SOURCE).is_file():
        raise PauseBuildError(
            f"cannot find k8s.io/kubernetes v{release.version}'s {_PAUSE_SOURCE} "
            f"(`{' '.join(argv)}` in {module_dir} exited {proc.returncode}: {proc.stderr.strip()})"
        )
    return found


def ensure_pause_archive(version: str, *, progress: Progress = print) -> Path:
    """The pause image (:data:`PAUSE_IMAGE`) as an OCI archive, built first if missing."""
    release = kubebuild.resolve_version(version)
    root = paths.cache_dir() / "pause" / release.version
    archive = root / "pause.oci.tar"
    if archive.is_file():
        return archive
    with locked(root / ".lock", progress=progress, what="another build of the pause image"):
        if archive.is_file():
            return archive
        for tool in ("gcc", "podman"):
            if imagebuild.find_tool(tool) is None:
                raise PauseBuildError(
                    f"`{tool}` is not installed: the real nodes' pause image is compiled with gcc "
                    "and packed with podman (Debian: apt-get install gcc libc6-dev podman)"
                )
        source = kubernetes_module_dir(version) / _PAUSE_SOURCE
        progress(f"building the pause image {PAUSE_IMAGE} from {source}")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
            work = Path(tmp)
            tag = PAUSE_IMAGE.rsplit(":", 1)[1]
            # The upstream Makefile's flags, with the upstream tag as the version it prints.
            cc = ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}"]
            cc += ["-o", str(work / "pause"), str(source)]
            proc = subprocess.run(cc, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise PauseBuildError(
                    f"`{' '.join(cc)}` exited {proc.returncode}:\n{proc.stderr.strip()}"
                )
            (work / "Containerfile").write_text(_CONTAINERFILE)
            imagebuild.podman(
                "build", "--file", str(work / "Containerfile"), "--tag", PAUSE_IMAGE, str(work)
            )
            out = work / "pause.oci.tar"
            imagebuild.podman("save", "--format", "oci-archive", "--output", str(out), PAUSE_IMAGE)
            os.replace(out, archive)
        progress(f"  {archive} in {duration(time.monotonic() - t0)}")
    return archive
