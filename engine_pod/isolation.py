"""Run a function in a fresh (spawned) process and get its result: peak memory of its own."""

from __future__ import annotations

import multiprocessing
import queue as queue_module
from collections.abc import Callable
from typing import Any


class ChildDied(RuntimeError):
    """The child process exited without a result (an exception, or killed for memory)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"exit status {exitcode}")
        self.exitcode = exitcode


def _call(function: Callable[..., Any], args: tuple, results, threads: int) -> None:
    from engine_pod.allocators import tune_cpu_allocator
    from engine_pod.cpu_threads import set_torch_threads

    tune_cpu_allocator()  # a child measures peak memory: as every dllm command does, tune its allocator
    set_torch_threads(threads)  # a spawned process starts with torch's default: the parent's choice instead
    results.put(function(*args))


def run_in_child(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a spawned process with this process's torch threads; ChildDied if it ends
    without returning."""
    import torch

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_call, args=(function, args, results, torch.get_num_threads()))
    process.start()
    while True:
        try:
            value = results.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not process.is_alive():
                raise ChildDied(process.exitcode) from None
    process.join()
    return value
