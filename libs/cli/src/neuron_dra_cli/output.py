"""``-o/--output``: the same state as text for people or as JSON for scripts."""

from __future__ import annotations

import argparse

__all__ = ["add_output_option"]


def add_output_option(parser: argparse.ArgumentParser) -> None:
    """Add ``-o {text,json}`` to a command that prints state."""
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text (default) or json: one JSON document on stdout",
    )
