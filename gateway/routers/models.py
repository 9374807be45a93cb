"""GET /v1/models."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from gateway.schemas import ModelCard, ModelList
from gateway.state import State, require_api_key

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
_STARTED = int(time.time())


@router.get("/models", response_model=ModelList)
async def list_models(state: State) -> ModelList:
    s = state.settings
    card = ModelCard(
        id=s.served_model,
        created=_STARTED,
        block_length=s.block_length,
        steps_per_block=s.steps_per_block,
        threshold=s.threshold,
        max_prompt_tokens=s.max_prompt_tokens,
        max_tokens=s.max_tokens_limit,
    )
    return ModelList(data=[card])
