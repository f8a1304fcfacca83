"""The command's output reaches a pipe or a file line by line, as it is printed."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path


def test_a_line_printed_reaches_a_pipe_before_the_command_ends() -> None:
    """A foreground ``dev up`` prints its summary, then waits for Ctrl-C: whoever reads its
    output from a pipe (CI, ``| tee``, a supervisor) must see the summary while it waits,
    without PYTHONUNBUFFERED."""
    script = (
        "import time\n"
        "from neuron_dra_cli.main import line_buffered_stdout\n"
        "line_buffered_stdout()\n"
        "print('Press Ctrl-C to stop everything.')\n"
        "time.sleep(30)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL
    ) as proc:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        seen = b""
        while b"\n" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                seen += os.read(proc.stdout.fileno(), 4096)
        running = proc.poll() is None
        proc.kill()
    assert seen == b"Press Ctrl-C to stop everything.\n"
    assert running


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``neuron-dra ... | head``: once the reader has gone, the command stops without a
    traceback (the pipe's read end is closed before the command writes anything)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "neuron_dra_cli", "dev", "status", "--state-dir", str(tmp_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == b""
    assert done.returncode == 141
