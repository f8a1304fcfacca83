"""The command's output reaches a pipe or a file line by line, as it is printed."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time


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
