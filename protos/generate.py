"""Regenerate the Python code of the .proto files under ``protos/proto``.

Run from the repository root::

    uv run python -m protos.generate            # rewrites protos/gen/neuron_dra_protos
    uv run python -m protos.generate --check    # exit 1 when protos/gen is stale

Output: ``*_pb2.py`` (messages), ``*_pb2_grpc.py`` (grpcio's stubs, servicers and
``add_*Servicer_to_server``, which the services serve and call with, and the tests and
benchmarks call them with) and typed ``.pyi`` stubs for the messages and grpcio's code
(mypy-protobuf), plus the ``__init__.py`` of every package. The tool versions
are pinned in the workspace's dev group, so the same inputs always give the same bytes; the
test suite regenerates into a temporary directory and compares.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE / "proto"
GEN_ROOT = HERE / "gen"
PACKAGE = "neuron_dra_protos"

_TOP_DOC = '''"""Generated code of the kubelet's DRA, plugin registration, DRA health and device plugin
services, and of the Kubernetes protobuf messages the slice publisher writes.

Do not edit: ``protos/proto`` holds the sources, ``python -m protos.generate`` rewrites this.

- ``neuron_dra_protos.dra.v1`` / ``.dra.v1beta1``: ``DRAPlugin`` (prepare, unprepare)
- ``neuron_dra_protos.health.v1alpha1``: ``DRAResourceHealth`` (device health stream)
- ``neuron_dra_protos.registration.v1``: ``Registration`` (kubelet plugin watcher)
- ``neuron_dra_protos.deviceplugin.v1beta1``: the device plugin API (``Registration`` with the
  kubelet's device manager, ``DevicePlugin``)
- ``neuron_dra_protos.kube.resource.v1``: ``resource.k8s.io/v1`` ResourceSlice (the fields
  the slice publisher sets) and the ``runtime.Unknown`` envelope of a protobuf request body
"""
'''

_SUB_DOC = '"""Generated from protos/proto; do not edit."""\n'


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto file under ``root``, sorted so the generated output is stable."""
    return sorted(root.rglob("*.proto"))


def _plugin(name: str) -> str:
    # The plugins are console scripts of mypy-protobuf, installed next to this interpreter.
    path = Path(sys.executable).parent / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise SystemExit(f"{name} not found: run `uv sync --all-packages` first")
        return found
    return str(path)


def generate(out_root: Path) -> None:
    """Write the generated package ``neuron_dra_protos`` into ``out_root`` (replacing it)."""
    from grpc_tools import protoc  # dev-only dependency: imported where it is needed

    package_dir = out_root / PACKAGE
    if package_dir.exists():
        shutil.rmtree(package_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *files,
    ]
    status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    for directory in sorted({package_dir, *(p.parent for p in package_dir.rglob("*.py"))}):
        for parent in (directory, *directory.relative_to(out_root).parents):
            init = out_root / parent / "__init__.py"
            if parent == Path(".") or init.exists():
                continue
            init.write_text(_TOP_DOC if init.parent == package_dir else _SUB_DOC)
    (package_dir / "py.typed").write_text("")


def stale_files(expected_root: Path, actual_root: Path) -> list[str]:
    """Relative paths that differ between two generated trees (missing on either side too)."""
    expected = {p.relative_to(expected_root) for p in expected_root.rglob("*") if p.is_file()}
    actual = {
        p.relative_to(actual_root)
        for p in actual_root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    differing = {
        str(rel)
        for rel in expected & actual
        if not filecmp.cmp(expected_root / rel, actual_root / rel, shallow=False)
    }
    return sorted(differing | {str(rel) for rel in expected ^ actual})


def check() -> list[str]:
    """Regenerate into a temporary directory and list what differs from ``protos/gen``."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return stale_files(Path(tmp) / PACKAGE, GEN_ROOT / PACKAGE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    options = parser.parse_args(argv)
    if options.check:
        stale = check()
        for rel in stale:
            print(f"stale: protos/gen/{PACKAGE}/{rel}", file=sys.stderr)
        return 1 if stale else 0
    generate(GEN_ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
