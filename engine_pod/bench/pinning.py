"""``dllm bench --pin``: the engine on one core, the serving path (gateway, Redis, the client) on the
others, so that the serving path's figure is not decided by how a host shares its cores.

On a GPU host the forwards run on the device and the gateway's CPU does not compete with them; on a CPU
host they share the cores and the ratio of the serving path to the engine measures the host. Pinned, the
engine alone and the worker behind the gateway both get one core (torch with one thread), and everything
else of the serving path the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine_pod.cpu_threads import PINNED, set_torch_threads


@dataclass(frozen=True)
class Pinning:
    engine_core: int
    serving_cores: tuple[int, ...]

    @classmethod
    def for_this_machine(cls) -> Pinning:
        """The first core this process may use for the engine, the others for the serving path."""
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            raise ValueError(f"--pin needs at least 2 cores to use; this process may use {len(cores)}")
        return cls(cores[0], tuple(cores[1:]))

    def pin_engine(self) -> None:
        """This thread, and the threads it starts, on the engine's core; torch with one thread."""
        os.sched_setaffinity(0, {self.engine_core})
        set_torch_threads(PINNED.threads)

    def pin_serving_thread(self) -> None:
        """This thread (a client driving the gateway) on the serving cores."""
        os.sched_setaffinity(0, set(self.serving_cores))

    def serving_process_options(self) -> dict:
        """Popen options that start a process (the gateway, redis-server) on the serving cores."""
        cores = set(self.serving_cores)
        return {"preexec_fn": lambda: os.sched_setaffinity(0, cores)}
