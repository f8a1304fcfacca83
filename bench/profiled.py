"""``python -m bench.profiled OUT -m MODULE [ARGS...]``: run a module under cProfile, timed by
the main thread's CPU clock, and write the stats to ``OUT`` when it ends.

The CPU clock rather than the wall clock: on a loaded machine a wall-clock profile charges
to whatever function was running when the process lost its core. The threads grpcio's C
core runs are not in it (the benchmark prints the whole process's CPU beside it).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "-m":
        raise SystemExit(__doc__)
    out, module, rest = argv[0], argv[2], argv[3:]
    sys.argv = [module, *rest]
    profile = cProfile.Profile(time.thread_time)
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    main(sys.argv[1:])
