"""``dllm serve``'s Ctrl-C acted on whatever its main thread holds when the signal lands: a handler that set
the supervisor's stopping event while the main thread held that event's lock (inside its ``wait``, which
the supervisor's watch loop spends its time in) waited for itself, and ``dllm serve`` hung on Ctrl-C (seen in
CI: a stop that never logged its next line). A real process, a real signal."""

from __future__ import annotations

import subprocess
import sys

from tests.serving_utils import WAIT_S

HOLDS_THE_LOCK_AT_THE_SIGNAL = """
import logging, os, signal
from engine_pod.serve.stopping import Stopping
from engine_pod.serve.supervisor import Supervisor

logging.basicConfig(level=logging.INFO)
supervisor = Supervisor([])
Stopping(supervisor, "redis://127.0.0.1:1/0", "s", "a data directory").install()
with supervisor.stopping._cond:  # the main thread inside the event's lock, as within stopping.wait()
    os.kill(os.getpid(), signal.SIGINT)  # a Python handler would run here, before the lock is let go
print("stopping" if supervisor.stopping.wait(60) else "not stopping", flush=True)
"""


def test_ctrl_c_while_the_main_thread_holds_the_stopping_events_lock_still_stops():
    done = subprocess.run(
        [sys.executable, "-c", HOLDS_THE_LOCK_AT_THE_SIGNAL], capture_output=True, text=True, timeout=WAIT_S
    )
    assert (done.returncode, done.stdout.strip()) == (0, "stopping"), done.stderr[-2000:]
    assert "stopping: the gateway, then the worker finishes what it holds" in done.stderr
