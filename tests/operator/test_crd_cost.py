"""Every CEL rule of the CRD stays within the API server's cost budget, computed from the schema.

The emulator the operator tests run against checks no CEL, and an API server refuses a CRD whose rules it
estimates too costly. This reproduces the API server's estimate (cel-go's checker cost model with the
Kubernetes size estimator) for the constructs the CRD uses: a comprehension over a map or a list costs its
size times its body, so everything a rule iterates needs maxProperties or maxItems, and a string a rule
matches with a regular expression needs maxLength (a map's keys have no declared bound: the request size
bounds them, 3 MiB). Limits: 10,000,000 per rule, 100,000,000 for the whole CRD (each rule's cost times how
many times it can run, the maxItems of the lists around it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import celpy
import pytest
from lark import Token, Tree

from tests.operator.crd_utils import load_crd, spec_schema

PER_RULE_LIMIT = 10_000_000  # apiextensions: StaticEstimatedCostLimit
PER_CRD_LIMIT = 100_000_000  # apiextensions: StaticEstimatedCRDCostLimit
UNBOUNDED = 3 * 1024 * 1024  # what the estimator assumes for a size no schema bound limits
TRAVERSAL, REGEX = 0.1, 0.25  # cel-go's StringTraversalCostFactor, RegexStringLengthCostFactor
LIST_LITERAL = 10  # cel-go's createListBaseCost
MACROS = {"all", "exists", "exists_one", "map", "filter"}


@dataclass(frozen=True)
class Value:
    """What the estimate knows of a value: its schema (if it is part of the object) and its largest size
    (characters of a string, entries of a list or map, 1 for a scalar)."""

    schema: dict | None
    size: int


def _size_of(schema: dict | None) -> int:
    if schema is None:
        return UNBOUNDED
    kind = schema.get("type")
    bound = {"string": "maxLength", "array": "maxItems", "object": "maxProperties"}.get(kind)
    return schema.get(bound, UNBOUNDED) if bound else 1


def _value(schema: dict | None) -> Value:
    return Value(schema, _size_of(schema))


def _key_of(schema: dict | None) -> Value:
    """The loop variable of a comprehension over ``schema``: a map's key, or a list's item."""
    if schema and schema.get("type") == "array":
        return _value(schema.get("items"))
    return Value({"type": "string"}, UNBOUNDED)  # a key's length has no schema bound


def _ceil(value: float) -> int:
    return math.ceil(value)


class Estimator:
    def __init__(self, variables: dict[str, Value]) -> None:
        self.variables = variables

    def cost(self, node) -> tuple[int, Value]:
        if isinstance(node, Token):
            return self._token(node)
        handler = getattr(self, f"_{node.data}", None)
        if handler is not None:
            return handler(node)
        children = [c for c in node.children if c is not None]
        if len(children) == 1:
            return self.cost(children[0])
        total = sum(self.cost(c)[0] for c in children)  # && and ||: both sides, worst case
        return total, Value(None, 1)

    def _token(self, token: Token) -> tuple[int, Value]:
        if token.type == "STRING_LIT":
            return 0, Value(None, len(token.value) - 2)
        return 0, Value(None, 1)

    def _literal(self, node: Tree) -> tuple[int, Value]:
        return self._token(node.children[0])

    def _ident(self, node: Tree) -> tuple[int, Value]:
        name = node.children[0].value
        if name not in self.variables:
            raise ValueError(f"unknown variable {name}")
        return 1, self.variables[name]

    def _list_lit(self, node: Tree) -> tuple[int, Value]:
        items = node.children[0].children if node.children else []
        return sum(self.cost(i)[0] for i in items) + LIST_LITERAL, Value(None, len(items))

    def _member_dot(self, node: Tree) -> tuple[int, Value]:
        target, field = node.children
        cost, value = self.cost(target)
        properties = (value.schema or {}).get("properties", {})
        return cost + 1, _value(properties.get(field.value))

    def _ident_arg(self, node: Tree) -> tuple[int, Value]:  # size(x), has(x.y), ...
        _name, arguments = node.children[0].value, node.children[1].children
        return 1 + sum(self.cost(a)[0] for a in arguments), Value(None, 1)

    def _member_dot_arg(self, node: Tree) -> tuple[int, Value]:
        target, method, arguments = node.children[0], node.children[1].value, node.children[2].children
        target_cost, value = self.cost(target)
        if method in MACROS:
            variable = _plain_ident(arguments[0])
            body_cost, _ = Estimator(self.variables | {variable: _key_of(value.schema)}).cost(arguments[1])
            # per entry: the body, the accumulator's update and the loop condition
            return target_cost + 2 + value.size * (body_cost + 2), Value(None, 1)
        argument_costs = [self.cost(a) for a in arguments]
        if method == "matches":
            string_cost = _ceil((value.size + 1) * TRAVERSAL)
            regex_cost = _ceil(argument_costs[0][1].size * REGEX)
            return target_cost + string_cost * regex_cost + argument_costs[0][0], Value(None, 1)
        return target_cost + 1 + sum(c for c, _ in argument_costs), Value(None, 1)

    def _relation(self, node: Tree) -> tuple[int, Value]:
        if len(node.children) == 1:
            return self.cost(node.children[0])
        operator, right = node.children
        left_cost, left = self.cost(operator.children[0])
        right_cost, right_value = self.cost(right)
        if operator.data == "relation_in":
            return left_cost + right_cost + right_value.size, Value(None, 1)
        smallest = min(left.size, right_value.size)
        return left_cost + right_cost + max(1, _ceil(smallest * TRAVERSAL)), Value(None, 1)

    def _unary(self, node: Tree) -> tuple[int, Value]:
        if len(node.children) == 1:
            return self.cost(node.children[0])
        return 1 + self.cost(node.children[-1])[0], Value(None, 1)


def _plain_ident(expr) -> str:
    tokens = [t for t in expr.scan_values(lambda v: isinstance(v, Token))]
    return tokens[0].value


def rule_cost(rule: str, schema: dict) -> int:
    return Estimator({"self": _value(schema)}).cost(celpy.CELParser().parse(rule))[0]


def _rules(schema: dict, cardinality: int = 1, path: str = ""):
    """(path, rule, the schema it applies to, how many times it can run) for every rule below."""
    for item in schema.get("x-kubernetes-validations", []):
        yield path or "spec", item["rule"], schema, cardinality
    for name, child in schema.get("properties", {}).items():
        yield from _rules(child, cardinality, f"{path}.{name}" if path else name)
    if "items" in schema:
        yield from _rules(schema["items"], cardinality * schema.get("maxItems", UNBOUNDED), f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        count = cardinality * schema.get("maxProperties", UNBOUNDED)
        yield from _rules(schema["additionalProperties"], count, f"{path}{{}}")


RULES = list(_rules(spec_schema(load_crd())))


@pytest.mark.parametrize(
    "path, rule, schema, cardinality", RULES, ids=[f"{p}: {r[:40]}" for p, r, _, _ in RULES]
)
def test_every_rule_is_within_the_per_rule_budget(path, rule, schema, cardinality):
    assert rule_cost(rule, schema) <= PER_RULE_LIMIT


def test_the_whole_crd_is_within_its_budget():
    total = sum(rule_cost(rule, schema) * cardinality for _, rule, schema, cardinality in RULES)
    assert total <= PER_CRD_LIMIT, total


def test_the_estimate_sees_an_unbounded_iteration_and_a_costly_match():
    """The check itself: a rule over a map without maxProperties, or a regular expression over map keys
    (no length bound), is over the budget; the same rules with bounds are not."""
    unbounded_map = {"type": "object", "additionalProperties": {"type": "string"}}
    assert rule_cost("self.all(k, k in ['a', 'b'])", unbounded_map) > PER_RULE_LIMIT
    assert rule_cost("self.all(k, k in ['a', 'b'])", unbounded_map | {"maxProperties": 16}) < 1000
    label_keys = "self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))"
    assert rule_cost(label_keys, unbounded_map | {"maxProperties": 32}) > PER_RULE_LIMIT
    bounded_string = {"type": "string", "maxLength": 32}
    assert rule_cost("!self.matches('^[+]?[0.]+$')", bounded_string) < 100
