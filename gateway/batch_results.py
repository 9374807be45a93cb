"""A batch's results as the lines of its output and error files: each line recorded once (by request id,
or by input line for a line that never ran), in the order of the input file."""

from __future__ import annotations

import json

from dllm_contracts.queue.messages import DoneEvent, decode_event
from gateway.batch_ingest import LINE_META, SKIPPED, STOP_META
from gateway.chat_answers import TOOLS_META, chat_message
from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.submission import apply_stop, finish_reason, tokens_shown


def _response_body(done: DoneEvent, request_id: str, endpoint: str, state) -> dict:
    """The line's response as the endpoint answers it: text cut at the line's stop strings (its
    finish_reason then ``stop``), log probabilities where the line asked."""
    text, stopped = apply_stop(state.tokenizer.decode(done.token_ids), done.meta.get(STOP_META) or [])
    reason = finish_reason(done, stopped)  # error lines never get here (see output_lines)
    shown = tokens_shown(done, state.tokenizer, text, stopped)
    usage = {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": shown,
        "total_tokens": done.prompt_tokens + shown,
    }
    model = done.meta.get("model", state.settings.served_model)
    asked, cut = done.logprobs is not None, len(text) if stopped else None
    if endpoint == "/v1/chat/completions":
        message, reason = chat_message(text, reason, bool(done.meta.get(TOOLS_META)), request_id)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": reason,
            "logprobs": chat_logprobs(done, state.tokenizer, cut) if asked else None,
        }
        kind = "chat.completion"
    else:
        logprobs = completion_logprobs(done, state.tokenizer, text_len=cut) if asked else None
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        kind = "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "model": model,
        "system_fingerprint": state.settings.system_fingerprint,
        "choices": [choice],
        "usage": usage,
    }


ENDED_EARLY = {  # a line's finish reason when it did not run to its end -> its error line's code, message
    "cancelled": ("batch_cancelled", "the batch was cancelled before this line finished"),
    "expired": SKIPPED["expired"],
    "error": ("invalid_request", "the request could not run"),
}


def result_lines(entries: list, endpoint: str, state) -> tuple[list[dict], list[dict]]:
    """The batch's results as the lines of its output file (answered lines) and of its error file (lines
    that could not run, were cancelled or expired), each keeping its ``custom_id``, in input order."""
    output, errors = [], []
    for entry in sorted((json.loads(raw) for raw in entries), key=_input_index):
        if entry.get("line") is not None:
            errors.append(entry["line"])
            continue
        done = decode_event(entry["done"])
        line = {"id": f"batch_req_{entry['id']}", "custom_id": done.meta.get("custom_id")}
        if done.error or done.finish_reason in ENDED_EARLY:
            code, message = ENDED_EARLY.get(done.finish_reason, ENDED_EARLY["error"])
            errors.append(
                line | {"response": None, "error": {"code": code, "message": done.error or message}}
            )
            continue
        body = _response_body(done, entry["id"], endpoint, state)
        response = {"status_code": 200, "request_id": entry["id"], "body": body}
        output.append(line | {"response": response, "error": None})
    return output, errors


def _input_index(entry: dict) -> int:
    """Where a result's line stood in the input file (results of an older gateway, without it: last)."""
    if entry.get("line") is not None:
        return int(entry.get("index", 1 << 62))
    return int(decode_event(entry["done"]).meta.get(LINE_META, 1 << 62))
