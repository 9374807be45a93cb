"""Fixtures of the engine's tests: groups of real rank processes shared within a test module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from engine_pod.group_processes import ModelArgs, tensor_parallel_group
from engine_pod.loading.loader import LoadedModel
from engine_pod.parallel.place import GroupPlace


class SharedGroup:
    """A tensor- or expert-parallel group kept open from one test to the next of a module while they ask
    for the same place and model: each spawned rank pays a process start and a torch import (seconds of
    CPU), and a test that only runs requests on the loaded model needs no group of its own. A process
    holds one group at a time (torch.distributed's), so asking for another closes the open one first:
    parametrize the model with ``scope="module"`` and pytest runs the tests of one model together. Tests
    of a group's start, failure, refusal or memory open their own with ``tensor_parallel_group``."""

    def __init__(self) -> None:
        self._key: tuple[GroupPlace, ModelArgs] | None = None
        self._stack = contextlib.ExitStack()
        self._loaded: LoadedModel | None = None

    def __call__(self, place: GroupPlace, model: ModelArgs) -> LoadedModel:
        """Rank 0's shard of ``model`` over ``place``: the open group's, or a new group's."""
        if self._key != (place, model) or self._loaded is None:
            self.close()
            self._loaded = self._stack.enter_context(tensor_parallel_group(place, model))
            self._key = (place, model)
        return self._loaded

    def close(self) -> None:
        """Stop the open group's ranks."""
        self._key, self._loaded = None, None
        self._stack.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Each phase's report on its test, for ``shared_group`` to see whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="module")
def module_group() -> Iterator[SharedGroup]:
    """The module's shared group, closed (its ranks stopped) at the module's end."""
    group = SharedGroup()
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def shared_group(request: pytest.FixtureRequest, module_group: SharedGroup) -> Iterator[SharedGroup]:
    """The module's shared group; a test that fails closes it (an error in closing is that test's), so the
    next test starts a group of its own rather than one a failure left behind."""
    yield module_group
    report = getattr(request.node, "report_call", None)
    if report is None or report.failed:
        module_group.close()
