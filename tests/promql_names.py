"""The metric names a PromQL expression reads, by a small tokenizer (enough for the chart's dashboard and
alert rules: selectors, functions, aggregations with by/without, binary operators and their modifiers),
and the PromQL expressions of a Grafana dashboard (panel targets, template variables' queries)."""

from __future__ import annotations

import re

# what is not a metric name: strings, label matchers' bodies, range/subquery durations, Grafana variables
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
    "inf", "nan", "atan2", "start", "end",
    # aggregation operators (``sum by (l) (x)``: not followed by "(" once the label list is read)
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
}  # fmt: skip
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")  # a histogram's or a counter's samples


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (a function's or an aggregation's name is followed by "(")."""
    text = _VARIABLE.sub("1", _STRING.sub('""', expr))
    text = _RANGE.sub("", _MATCHERS.sub("", text))
    text = _LABEL_LISTS.sub(lambda m: m.group(1), text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if word.lower() in KEYWORDS or rest.startswith("(") or re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def missing(names: set[str], exported: set[str]) -> set[str]:
    """Which ``names`` no exporter has: ``exported`` holds every sample name and family name seen on
    /metrics (so ``X_bucket``, ``X_count``, ``X_sum`` and ``X_total`` are found as their family's samples)."""
    return {name for name in names if name not in exported}


def dashboard_expressions(dashboard: dict) -> list[str]:
    """Every PromQL expression of a Grafana dashboard: its panels' targets (rows' nested panels too) and
    its query variables (``label_values(METRIC, label)`` reads METRIC)."""
    found = []
    panels = list(dashboard.get("panels", []))
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        found += [target["expr"] for target in panel.get("targets", []) if target.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            selector = _LABEL_VALUES.match(query)  # Grafana's label_values(SELECTOR, label)
            found.append(selector.group(1) if selector else query)
    return found
