"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from gateway.errors import model_not_found
from gateway.prompt_limits import context_of, longest_prompt
from gateway.schemas import ModelCard, ModelList
from gateway.state import State, require_api_key

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
_STARTED = int(time.time())


def _card(state) -> ModelCard:
    s = state.settings
    return ModelCard(
        id=s.served_model,
        created=_STARTED,
        block_length=s.block_length,
        steps_per_block=s.steps_per_block,
        threshold=s.threshold,
        max_prompt_tokens=longest_prompt(state),
        context_length=context_of(state),
        max_tokens=s.max_tokens_limit,
    )


@router.get("/models", response_model=ModelList)
async def list_models(state: State) -> ModelList:
    return ModelList(data=[_card(state)])


@router.get("/models/{model_id:path}", response_model=ModelCard)
async def get_model(model_id: str, state: State) -> ModelCard:
    card = _card(state)
    if model_id != card.id:
        raise model_not_found(model_id, card.id)
    return card
