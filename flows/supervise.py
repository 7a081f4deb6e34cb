"""Run a command so that nothing it starts outlives the flow that asked for it.

``python -m flows.supervise <parent-pid> <timeout-s> <grace-s> -- cmd ...`` is started by a Prefect task. It
runs ``cmd`` (``dvc repro``) in a process group of its own, which holds everything ``cmd`` starts (the stage).
That group is terminated (SIGTERM, then SIGKILL after ``grace``) when
- the flow process dies (a worker crash, ``kill -9``, a cancellation that killed it),
- the timeout passes (exit code 124, like coreutils ``timeout``),
- this supervisor gets SIGTERM/SIGINT (the task's own cleanup).
Otherwise it exits with the command's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

EXIT_TIMEOUT = 124


def _terminate_group(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the command's process group, SIGKILL to whatever is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGTERM:
            try:
                child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.2)  # let the stage under dvc handle its SIGTERM too


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 5:
        print("usage: python -m flows.supervise <parent-pid> <timeout-s> <grace-s> -- cmd ...", file=sys.stderr)
        return 2
    sep = argv.index("--")
    parent, timeout, grace = int(argv[0]), float(argv[1]), float(argv[2])
    cmd = argv[sep + 1:]
    stop = {"why": ""}

    def on_signal(signum: int, _frame) -> None:
        stop["why"] = signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    child = subprocess.Popen(cmd, process_group=0)  # its own group: dvc and the stage it starts
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    while True:
        rc = child.poll()
        if rc is not None:
            return rc
        if stop["why"]:
            print(f"supervise: {stop['why']}: stopping {cmd[0]} and everything it started", file=sys.stderr, flush=True)
            _terminate_group(child, grace)
            return 128 + signal.SIGTERM
        if os.getppid() != parent:
            print("supervise: the flow process is gone: stopping the stage", file=sys.stderr, flush=True)
            _terminate_group(child, grace)
            return 128 + signal.SIGTERM
        if time.monotonic() > deadline:
            print(f"supervise: timeout after {timeout:.0f} s: stopping {cmd[0]} and everything it started",
                  file=sys.stderr, flush=True)
            _terminate_group(child, grace)
            return EXIT_TIMEOUT
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
