"""Run a function in a fresh (spawned) process and get its result: peak memory of its own."""

from __future__ import annotations

import logging
import multiprocessing
import queue as queue_module
from collections.abc import Callable
from typing import Any


class ChildDied(RuntimeError):
    """The child process exited without a result (an exception, or killed for memory)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"exit status {exitcode}")
        self.exitcode = exitcode


def _call(function: Callable[..., Any], args: tuple, results, threads: int, follow, log) -> None:
    from engine_pod.allocators import tune_cpu_allocator
    from engine_pod.cpu_load import follow_load
    from engine_pod.cpu_threads import set_torch_threads

    _log_as_parent(*log)
    tune_cpu_allocator()  # a child measures peak memory: as every dllm command does, tune its allocator
    set_torch_threads(threads)  # a spawned process starts with torch's default: the parent's choice instead
    follow_load(follow, threads)  # and follows the load from there as the parent would
    results.put(function(*args))


def run_in_child(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a spawned process with this process's torch threads (following the load if
    this process does); ChildDied if it ends without returning."""
    results = _SPAWN.Queue()
    process = _start(function, args, results)
    value = _receive(results, process)
    process.join()
    return value


class ChildSession:
    """A spawned process (set up as ``run_in_child``'s) that answers calls one at a time: ``serve(calls,
    answers, *args)`` runs in it, putting an answer on ``answers`` for each value it reads from ``calls``
    until it reads None. ``ask`` raises ChildDied if the process ends before answering."""

    def __init__(self, serve: Callable[..., None], *args: Any) -> None:
        self._calls, self._answers = _SPAWN.Queue(), _SPAWN.Queue()
        self._process = _start(serve, (self._calls, self._answers, *args), self._answers)

    def __enter__(self) -> ChildSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(self, value: Any) -> Any:
        self._calls.put(value)
        return _receive(self._answers, self._process)

    def close(self) -> None:
        """Tell the process to end and wait for it (killed if it does not end within a minute)."""
        if self._process.is_alive():
            self._calls.put(None)
            self._process.join(timeout=CLOSE_WAIT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


CLOSE_WAIT_S = 60.0
_SPAWN = multiprocessing.get_context("spawn")


def _start(function: Callable[..., Any], args: tuple, results) -> multiprocessing.Process:
    """A spawned process that runs ``function(*args)`` (``_call``) and puts what it returns on ``results``."""
    import torch

    from engine_pod.cpu_load import following

    threads = torch.get_num_threads()
    process = _SPAWN.Process(
        target=_call, args=(function, args, results, threads, following(), _parent_log())
    )
    process.start()
    return process


def _receive(results, process) -> Any:
    """The next value on ``results``; ChildDied once ``process`` has ended without one."""
    while True:
        try:
            return results.get(timeout=1.0)
        except queue_module.Empty:
            if not process.is_alive():
                raise ChildDied(process.exitcode) from None


def _parent_log() -> tuple[int, logging.Formatter | None]:
    """The parent's log level and format, for the child's records (its thread changes, its warnings)."""
    root = logging.getLogger()
    # the one a dllm command sets up (a test runner's own handlers stay its own)
    handler = next((h for h in root.handlers if type(h) is logging.StreamHandler), None)
    formatter = handler.formatter if handler is not None else None
    return root.level, formatter if type(formatter) is logging.Formatter else None


def _log_as_parent(level: int, formatter: logging.Formatter | None) -> None:
    if formatter is None:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler])
