"""Build neuron-dra's image with podman, from a Debian base made on this machine.

No container registry is needed: the base is Debian's ``bookworm`` with ``python3`` and
``ca-certificates`` (``mmdebstrap --variant=minbase``), imported into podman, and the
repository's ``Dockerfile`` is built on it (``--build-arg BASE=...``). PyPI is reached during
the build for uv and the locked packages.

- The base tarball is kept under ``<cache>/image-base/<key>/base.tar``, the key a digest of
  what makes it (suite, variant, packages), made once under a file lock (about 2 minutes)
  and imported as ``localhost/neuron-dra-base:<key>``.
- The image is tagged ``localhost/neuron-dra:<version>-<digest of its build inputs>``
  (Dockerfile, lock, package metadata and sources): an unchanged checkout finds its image
  and builds nothing; a changed one rebuilds from podman's layer cache (third-party packages
  are one layer, keyed by ``uv.lock`` and the packages' metadata). The checkout's earlier
  images are untagged then, so a long-lived machine does not keep one per change.

``python -m neuron_dra_cli.imagebuild`` makes both and prints the image's name
(``scripts/test.sh`` runs it before the tests when podman is installed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from neuron_dra_cli import paths
from neuron_dra_cli.cachelock import duration, locked
from neuron_dra_cli.errors import CliError

__all__ = [
    "BASE_PACKAGES",
    "BASE_SUITE",
    "IMAGE_REPOSITORY",
    "PODMAN",
    "RUN_LIMITS",
    "ImageBuildError",
    "ensure_base",
    "ensure_image",
    "find_tool",
    "image_inputs_digest",
    "missing_tools",
    "tool_env",
]

Progress = Callable[[str], None]

BASE_SUITE = "bookworm"
BASE_VARIANT = "minbase"
BASE_PACKAGES = ("python3", "ca-certificates")
BASE_REPOSITORY = "localhost/neuron-dra-base"
IMAGE_REPOSITORY = "localhost/neuron-dra"

#: podman with Debian's runc and cgroupfs: crun (podman's default on Debian) refuses hosts
#: with a hybrid cgroup layout, and cgroupfs needs no systemd session.
RUNC = "/usr/sbin/runc"
PODMAN = ("podman", "--runtime", RUNC, "--cgroup-manager", "cgroupfs")
#: Limits at or below the host's: a sandboxed host may forbid raising them, and podman's
#: defaults would try.
RUN_LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")

#: What the Dockerfile copies into the image (files and folders of the checkout).
_INPUTS = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "uv.lock",
    "scripts/fetch_uv.py",
    "libs",
    "protos",
    "services",
)
#: Which checkout built an image (a digest of its path), so its earlier images can go.
_CHECKOUT_LABEL = "io.neuron-dra.checkout"
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


class ImageBuildError(CliError):
    """The base or the image could not be made."""


#: Where Debian keeps the administrator's programs that podman's network runs (iptables):
#: a user's PATH (or a fresh ``env -i``) often lacks these folders.
SYSTEM_BIN_DIRS: tuple[Path, ...] = (Path("/usr/sbin"), Path("/sbin"))


def find_tool(name: str, *, path: str | None = None) -> Path | None:
    """``name`` on ``path`` (default PATH), or else in /usr/sbin or /sbin; None if nowhere.

    >>> find_tool("iptables", path="/usr/bin:/bin")
    PosixPath('/usr/sbin/iptables')
    """
    found = shutil.which(name, path=os.environ.get("PATH", "") if path is None else path)
    if found is None:
        found = shutil.which(name, path=os.pathsep.join(str(d) for d in SYSTEM_BIN_DIRS))
    return Path(found) if found is not None else None


def tool_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default this process's environment) with /usr/sbin and /sbin at the end of
    its PATH where missing: podman finds iptables (and the CNI plugins their tools) by
    PATH, and without those folders its network fails deep inside a container's start."""
    out = dict(os.environ if env is None else env)
    folders = [f for f in out.get("PATH", "").split(os.pathsep) if f]
    folders += [str(d) for d in SYSTEM_BIN_DIRS if str(d) not in folders]
    out["PATH"] = os.pathsep.join(folders)
    return out


def missing_tools() -> list[str]:
    """The programs this module needs that this machine lacks (empty when all are there).

    iptables counts as there in /usr/sbin or /sbin even when PATH lacks them: podman is
    always run with them on its PATH (:func:`tool_env`).
    """
    missing = [name for name in ("podman", "mmdebstrap") if find_tool(name) is None]
    if not os.access(RUNC, os.X_OK):
        missing.append("runc")
    if find_tool("iptables") is None:
        missing.append("iptables")
    return missing


def podman(
    *args: str, check: bool = True, timeout: float | None = None, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run podman with :data:`PODMAN`'s options (and :func:`tool_env`'s PATH); raise with its
    output when it fails."""
    argv = [*PODMAN, *args]
    proc = subprocess.run(
        argv,
        env=tool_env(),
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise ImageBuildError(f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout or ''}")
    return proc


def _image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, check=False).returncode == 0


def _base_key() -> str:
    spec = {"suite": BASE_SUITE, "variant": BASE_VARIANT, "include": sorted(BASE_PACKAGES)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def ensure_base(*, progress: Progress = print) -> str:
    """The local base image's reference, its tarball made and imported first if missing."""
    key = _base_key()
    ref = f"{BASE_REPOSITORY}:{key}"
    if _image_exists(ref):
        return ref
    root = paths.cache_dir() / "image-base" / key
    tarball = root / "base.tar"
    with locked(root / ".lock", progress=progress, what="another process making the same base"):
        if not tarball.is_file():
            if find_tool("mmdebstrap") is None:
                raise ImageBuildError(
                    "`mmdebstrap` is not installed: the image's local base is made from Debian's "
                    "packages with it (Debian: apt-get install mmdebstrap)"
                )
            packages = ",".join(BASE_PACKAGES)
            progress(
                f"making the image's base: Debian {BASE_SUITE} {BASE_VARIANT} with {packages} "
                "(mmdebstrap; about 2 minutes, once)"
            )
            t0 = time.monotonic()
            root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".build-", dir=root) as tmp:
                out = Path(tmp) / "base.tar"
                argv = [
                    "mmdebstrap",
                    "--quiet",
                    f"--variant={BASE_VARIANT}",
                    f"--include={packages}",
                    BASE_SUITE,
                    str(out),
                ]
                proc = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    check=False,
                    # It runs chroot, mount and friends from /usr/sbin.
                    env=tool_env(),
                )
                if proc.returncode != 0 or not out.is_file():
                    raise ImageBuildError(
                        f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout.strip()}"
                    )
                os.replace(out, tarball)
            progress(f"  base tarball {tarball} in {duration(time.monotonic() - t0)}")
        if not _image_exists(ref):
            podman("import", "--message", f"Debian {BASE_SUITE} {packages}", str(tarball), ref)
    return ref


def _input_files(repo: Path) -> Iterator[Path]:
    for name in _INPUTS:
        top = repo / name
        if top.is_file():
            yield top
            continue
        for path in sorted(top.rglob("*")):
            rel = path.relative_to(repo)
            if path.is_file() and not _SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
                yield path


def image_inputs_digest(repo: Path, *, base: str) -> str:
    """A digest of everything the image is built from: the base and the checkout's files the
    Dockerfile copies (names, contents and the executable bit)."""
    h = hashlib.sha256(base.encode() + b"\0")
    for path in _input_files(repo):
        rel = path.relative_to(repo).as_posix()
        mode = b"x" if os.access(path, os.X_OK) else b"-"
        h.update(rel.encode() + b"\0" + mode + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


#: Where Debian (and the official python image, built on it) keeps its CA bundle.
_BASE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _host_ca_mount() -> list[str]:
    host = Path(os.environ.get("SSL_CERT_FILE") or _BASE_CA_BUNDLE)
    return ["--volume", f"{host}:{_BASE_CA_BUNDLE}:ro"] if host.is_file() else []


def _version(repo: Path) -> str:
    for line in (repo / "libs" / "cli" / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise ImageBuildError("libs/cli/pyproject.toml names no version")


def ensure_image(
    *, base: str | None = None, progress: Progress = print, extra_args: Sequence[str] = ()
) -> str:
    """The image of this checkout (built first if its inputs changed); its reference."""
    repo = paths.repo_root()
    base = base or ensure_base(progress=progress)
    ref = f"{IMAGE_REPOSITORY}:{_version(repo)}-{image_inputs_digest(repo, base=base)}"
    checkout = hashlib.sha256(str(repo).encode()).hexdigest()[:12]
    if _image_exists(ref):
        return ref
    lock = paths.cache_dir() / "image-build.lock"
    with locked(lock, progress=progress, what="another image build"):
        if _image_exists(ref):
            return ref
        progress(f"building {ref} from {repo / 'Dockerfile'} on {base} (podman)")
        t0 = time.monotonic()
        podman(
            "build",
            *RUN_LIMITS,
            # The build's RUN steps reach PyPI through the host's network, trusting what the
            # host trusts (a TLS-inspecting proxy's CA too); the mount is not in the image.
            "--network",
            "host",
            *_host_ca_mount(),
            "--build-arg",
            f"BASE={base}",
            "--tag",
            ref,
            "--label",
            f"{_CHECKOUT_LABEL}={checkout}",
            *extra_args,
            str(repo),
        )
        progress(f"  {ref} built in {duration(time.monotonic() - t0)}")
        _remove_older(checkout, keep=ref)
    return ref


def _remove_older(checkout: str, *, keep: str) -> None:
    """Untag this checkout's earlier images (each source change makes one); podman's layer
    cache stays, and an image a container still uses stays too."""
    listed = podman(
        "images", "--filter", f"label={_CHECKOUT_LABEL}={checkout}", "--format",
        "{{.Repository}}:{{.Tag}}",
    )  # fmt: skip
    for old in set(listed.stdout.split()) - {keep}:
        if old.startswith(f"{IMAGE_REPOSITORY}:"):
            podman("rmi", old, check=False)


def main() -> int:
    """Make the base and the image; print the image's reference."""
    missing = missing_tools()
    if missing:
        print(
            f"neuron-dra: cannot build the image: {', '.join(missing)} not installed",
            file=sys.stderr,
        )
        return 2
    try:
        ref = ensure_image(progress=lambda m: print(m, file=sys.stderr))
    except CliError as exc:
        print(f"neuron-dra: {exc}", file=sys.stderr)
        return 2
    print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
