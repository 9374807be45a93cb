"""The canvas kind's context encoding (stepper.py's): every request's pending chunks of its context, in
rounds of one packed encoder forward each."""

from __future__ import annotations

from engine_pod.device_buffers import DeviceBuffers
from engine_pod.kinds.canvas.model_interface import CanvasModel
from engine_pod.kinds.canvas.request_state import CanvasRequest


def encode_pending(
    model: CanvasModel, buffers: DeviceBuffers, work: list[tuple[CanvasRequest, tuple[int, ...]]]
) -> int:
    """Encode every request's pending chunks of the context it is given (a chunk row's: its prefix up
    to its chunk's end), each request's in order: the chunks of one round (every request's first, then
    the rebuilt requests' next) in one packed encoder forward. Returns the tokens encoded."""
    queues = [(state, state.pending(prefix)) for state, prefix in work]
    for state, _ in queues:
        if not state.encoded:
            state.chunks = []  # recorded again as they are encoded
    encoded, round_ = 0, 0
    while any(round_ < len(chunks) for _, chunks in queues):
        group = [(state, chunks[round_]) for state, chunks in queues if round_ < len(chunks)]
        chunks, caches = [chunk for _, chunk in group], [state.cache for state, _ in group]
        model.encode_chunks(chunks, caches, buffers)
        for state, chunk in group:
            state.encoded += chunk
            state.chunks.append(len(chunk))
            encoded += len(chunk)
        round_ += 1
    return encoded
