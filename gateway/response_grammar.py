"""A chat request's ``response_format``, ``tools`` and ``tool_choice`` as the one grammar its answer is
generated in (dllm_contracts/structured_output.py), checked here: every refusal is a 400 naming the field
(a schema's keyword, a tool, the function ``tool_choice`` names). The grammar is compiled once here with
llguidance (torch-free; the worker compiles it again for its tokenizer): what does not compile is refused
before it is queued. Checked grammars are remembered (a service's requests repeat their schemas)."""

from __future__ import annotations

import functools
import re
from typing import Any

from dllm_contracts.structured_output import ResponseGrammar, json_grammar, tool_calls_grammar
from gateway.errors import ApiError
from gateway.json_schemas import SchemaProblem, check_schema

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
CHECKED_GRAMMARS = 1024


def response_grammar(body) -> ResponseGrammar | None:
    """The grammar of a chat request's answer (None: free text); ApiError 400 for what cannot be served."""
    calls = tool_choice_of(body)
    structured = body.response_format is not None and body.response_format.type != "text"
    if structured and calls != "none":
        raise ApiError(
            400,
            "response_format and tools cannot be used together here: leave one out (or tool_choice: none)",
            param="response_format",
            code="unsupported_value",
        )
    grammar = None
    if structured:
        grammar = _format_grammar(body.response_format)
    elif calls != "none":
        grammar = _tools_grammar(body, calls)
    if grammar is not None and body.logprobs:
        raise ApiError(
            400,
            "logprobs are not recorded for structured outputs or tool calls: leave logprobs out",
            param="logprobs",
            code="unsupported_value",
        )
    if grammar is not None:
        _compile_check(grammar.grammar, "response_format" if structured else "tools")
    return grammar


def tool_choice_of(body) -> str:
    """``none``, ``auto``, ``required`` or the name of the one function to call (OpenAI's defaults:
    ``auto`` with tools, ``none`` without)."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs tools", param="tool_choice", code="invalid_value")
        return "none"
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    return choice.function.name


def _format_grammar(response_format) -> ResponseGrammar:
    if response_format.type == "json_object":
        return ResponseGrammar(json_grammar({"type": "object"}), "json_object")
    spec = response_format.json_schema
    if spec is None:
        raise ApiError(
            400, "response_format json_schema needs its json_schema", param="response_format", code="missing"
        )
    if not FUNCTION_NAME.match(spec.name):
        raise ApiError(
            400,
            f"response_format.json_schema.name {spec.name!r} must be 1 to 64 letters, digits, _ or -",
            param="response_format.json_schema.name",
            code="invalid_value",
        )
    schema = spec.schema_ if spec.schema_ is not None else {}
    _checked(schema, f"response_format {spec.name!r}'s schema", "response_format.json_schema.schema")
    return ResponseGrammar(json_grammar(schema), "json_schema")


def _tools_grammar(body, calls: str) -> ResponseGrammar:
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(body.tools):
        function, param = tool.function, f"tools[{i}].function"
        if not FUNCTION_NAME.match(function.name):
            raise ApiError(
                400,
                f"{param}.name {function.name!r} must be 1 to 64 letters, digits, _ or -",
                param=f"{param}.name",
                code="invalid_value",
            )
        if function.name in functions:
            raise ApiError(
                400, f"two tools are named {function.name!r}", param=f"{param}.name", code="invalid_value"
            )
        if function.parameters is None:
            raise ApiError(
                400,
                f"{param} {function.name!r} has no parameters schema: give one (an object schema; "
                '{"type": "object", "properties": {}} for a function without arguments)',
                param=f"{param}.parameters",
                code="missing",
            )
        _checked(function.parameters, f"function {function.name!r}'s parameters", f"{param}.parameters")
        if function.parameters.get("type") != "object":
            raise ApiError(
                400,
                f"function {function.name!r}'s parameters must be an object schema (type: object)",
                param=f"{param}.parameters",
                code="invalid_value",
            )
        functions[function.name] = function.parameters
    parallel = body.parallel_tool_calls is not False
    if calls in ("auto", "required"):
        return ResponseGrammar(tool_calls_grammar(functions, calls, parallel), "tool_calls")
    if calls not in functions:
        raise ApiError(
            400,
            f"tool_choice names the function {calls!r}, which is not among the tools "
            f"({', '.join(sorted(functions))})",
            param="tool_choice",
            code="invalid_value",
        )
    return ResponseGrammar(tool_calls_grammar({calls: functions[calls]}, "required", False), "tool_calls")


def _checked(schema: Any, what: str, param: str) -> None:
    try:
        check_schema(schema, what)
    except SchemaProblem as exc:
        raise ApiError(400, str(exc), param=param, code=exc.code) from None


def _compile_check(grammar: str, param: str) -> None:
    problem = _grammar_problem(grammar)
    if problem:
        raise ApiError(400, problem, param=param, code="invalid_value")


@functools.lru_cache(maxsize=CHECKED_GRAMMARS)
def _grammar_problem(grammar: str) -> str:
    """Why ``grammar`` does not compile ("": it does); llguidance is imported on first use."""
    from llguidance import LLMatcher

    problem = LLMatcher.validate_grammar(grammar)
    return f"the schema cannot be compiled: {problem.splitlines()[0]}" if problem else ""
