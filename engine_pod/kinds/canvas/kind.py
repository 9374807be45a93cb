"""The canvas kind's object, which its families' records name."""

from __future__ import annotations

from dllm_contracts.run_rules import CANVAS_NAME
from engine_pod.kinds.canvas.model_interface import CanvasModel
from engine_pod.kinds.canvas.stepper import CanvasStepper
from engine_pod.runner.kind import CacheKind

CANVAS = CacheKind(name=CANVAS_NAME, stepper=CanvasStepper, model_interface=CanvasModel, canvas_rows=True)
