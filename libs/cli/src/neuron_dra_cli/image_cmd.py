"""``neuron-dra dev import-image``: copy images into the real nodes' containerd.

A real node pulls nothing (no registry is reachable): a pod runs there only an image that
was imported into that node's containerd first. This copies podman images there (by
default this checkout's own image, built if its inputs changed), keeping their names, so
a manifest's ``image: <ref>`` with ``imagePullPolicy: Never`` or ``IfNotPresent`` runs it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from neuron_dra_cli import imagebuild, paths, toolbuild
from neuron_dra_cli.errors import CliError
from neuron_dra_cli.stack import process, realnodes, state
from neuron_dra_cli.stack.layout import Layout

__all__ = ["import_images", "real_nodes", "register"]

_KUBELET_PREFIX = "kubelet-"


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "import-image",
        help="copy podman images into the real nodes' containerd (they pull nothing)",
        description="Copy podman images into the containerd of the stack's real nodes "
        "(`dev up --real-nodes N`), under the same names: `podman save` then `ctr images "
        "import`. Without IMAGE, this checkout's image (localhost/neuron-dra:...), built "
        "first if its inputs changed.",
    )
    p.add_argument("images", metavar="IMAGE", nargs="*", help="podman image reference(s)")
    p.add_argument(
        "--node",
        action="append",
        default=None,
        help="a real node to import into (repeatable; default every real node)",
    )
    paths.add_state_dir_option(p)
    p.set_defaults(handler=cmd_import_image)


def real_nodes(current: state.StackState) -> list[str]:
    """The names of the stack's running real nodes."""
    return [
        c.name.removeprefix(_KUBELET_PREFIX)
        for c in current.components
        if c.kind == realnodes.KUBELET_KIND
        and process.alive(process.Running(pid=c.pid, start_ticks=c.start_ticks))
    ]


def import_images(
    state_dir: Path, *, images: list[str], nodes: list[str] | None = None
) -> list[tuple[str, str]]:
    """Import each podman image into each named real node (default all); the pairs
    (image, node) done, in order."""
    current = state.load(state_dir)
    if current is None:
        raise CliError(f"no stack recorded under {state_dir}; start one with `neuron-dra dev up`")
    running = real_nodes(current)
    if not running:
        raise CliError(
            f"the stack under {state_dir} runs no real node; start it with "
            "`neuron-dra dev up --real-nodes 1`"
        )
    wanted = nodes or running
    unknown = [n for n in wanted if n not in running]
    if unknown:
        raise CliError(
            f"{', '.join(unknown)}: not a running real node of the stack under {state_dir} "
            f"(real nodes: {', '.join(running)})"
        )
    binaries = toolbuild.ensure_containerd(progress=lambda m: print(m, file=sys.stderr))
    layout = Layout(state_dir)
    done = []
    with tempfile.TemporaryDirectory(prefix="ndra-image-") as tmp:
        for i, ref in enumerate(images):
            archive = Path(tmp) / f"{i}.oci.tar"
            imagebuild.podman("save", "--format", "oci-archive", "--output", str(archive), ref)
            for node in wanted:
                realnodes.import_archive(binaries, realnodes.node_paths(layout, node), archive)
                done.append((ref, node))
            archive.unlink()
    return done


def cmd_import_image(args: argparse.Namespace) -> int:
    state_dir = (
        Path(args.state_dir).expanduser().resolve() if args.state_dir else paths.default_state_dir()
    )
    images = list(args.images) or [
        imagebuild.ensure_image(progress=lambda m: print(m, file=sys.stderr))
    ]
    for ref, node in import_images(state_dir, images=images, nodes=args.node):
        print(f"imported {ref} into {node}")
    return 0
