"""Put the pinned uv where the bootstrap looks for it, with nothing but python3's standard library.

A fresh machine may have no pip (or a system Python that refuses ``pip install``, PEP 668),
so uv is taken from its wheel on PyPI: downloaded, checked against the pinned SHA-256 and
unpacked. Usage::

    python3 scripts/fetch_uv.py VERSION DEST

prints the path of the uv binary (``DEST/uv``); does nothing but print it when it is there.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

#: PyPI's simple index; ``UV_INDEX_URL``/``PIP_INDEX_URL`` point elsewhere (a mirror).
INDEX = "https://pypi.org/simple"

#: (version, machine) -> (wheel file name, its SHA-256 as PyPI lists it)
WHEELS: dict[tuple[str, str], tuple[str, str]] = {
    ("0.13.8", "x86_64"): (
        "uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984",
    ),
    ("0.13.8", "aarch64"): (
        "uv-0.13.8-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        "0b3e8b1a4f5e405e31e2ff33de8af4744831e9f7338539671efbd8c3c94e791d",
    ),
}


def fail(message: str) -> None:
    print(f"neuron-dra bootstrap: {message}", file=sys.stderr)
    raise SystemExit(1)


def wheel_url(index: str, name: str) -> str:
    """The download address of ``name`` in the simple index's page for uv."""
    page = f"{index.rstrip('/')}/uv/"
    with urllib.request.urlopen(page, timeout=60) as resp:
        html = resp.read().decode()
    for chunk in html.split('href="')[1:]:
        href = chunk.split('"', 1)[0]
        if href.split("#", 1)[0].rsplit("/", 1)[-1] == name:
            return str(urllib.parse.urljoin(page, href.split("#", 1)[0]))
    fail(f"{name} is not listed in {page}")
    raise AssertionError  # unreachable


def fetch(version: str, dest: Path) -> Path:
    binary = dest / "uv"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    machine = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    if sys.platform != "linux" or (version, machine) not in WHEELS:
        fail(
            f"no pinned uv {version} wheel for {sys.platform}/{machine}; install uv {version} "
            "yourself (https://docs.astral.sh/uv/) and put it on PATH"
        )
    name, sha256 = WHEELS[(version, machine)]
    index = os.environ.get("UV_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or INDEX
    url = wheel_url(index, name)
    print(f"==> downloading {name}", file=sys.stderr)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        wheel = Path(tmp) / name
        with urllib.request.urlopen(url, timeout=300) as resp, wheel.open("wb") as out:
            digest = hashlib.sha256()
            while block := resp.read(1 << 20):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != sha256:
            fail(f"{url}: SHA-256 {digest.hexdigest()} is not the pinned {sha256}")
        member = f"uv-{version}.data/scripts/uv"
        with zipfile.ZipFile(wheel) as zf:
            staged = Path(tmp) / "uv"
            staged.write_bytes(zf.read(member))
        staged.chmod(0o755)
        os.replace(staged, binary)  # atomic: a concurrent bootstrap sees all of it or nothing
    return binary


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(fetch(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
