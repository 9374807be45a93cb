"""Loaded into a ``dllm worker`` subprocess by a test (PYTHONPATH): the model load waits until the file
named by $DLLM_TEST_LOAD_GATE exists, standing in for a long checkpoint download."""

import os
import time

_gate = os.environ.get("DLLM_TEST_LOAD_GATE")
if _gate:
    import engine_pod.loading.loader as _loader

    _real_load = _loader.load_model

    def _gated_load(*args, **kwargs):
        while not os.path.exists(_gate):
            time.sleep(0.05)
        return _real_load(*args, **kwargs)

    _loader.load_model = _gated_load
