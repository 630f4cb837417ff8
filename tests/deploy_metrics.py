"""Every metric name the deployment files query: Grafana dashboard, alert rules, HPA adapter rule.

``referenced_metric_names()`` is what an integration test compares with a live scrape of
Triton's metrics port; ``TRITON_METRICS`` is what the server exports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml

from contract import metrics as names
from serving.paths import REPO_ROOT

DASHBOARD = REPO_ROOT / "docker" / "grafana" / "dashboards" / "triton.json"
ALERTS = REPO_ROOT / "docker" / "prometheus" / "alerts.yml"
ADAPTER_RULES = REPO_ROOT / "k8s" / "prometheus-adapter" / "rules.yaml"
ADAPTER_VALUES = REPO_ROOT / "k8s" / "prometheus-adapter" / "values.yaml"

# Everything the server exports: Triton's own per-model families and the engine's.
TRITON_METRICS = frozenset(
    {
        names.INFERENCE_COUNT,
        names.EXEC_COUNT,
        names.REQUEST_DURATION_US,
        names.QUEUE_DURATION_US,
        names.COMPUTE_INPUT_DURATION_US,
        names.COMPUTE_INFER_DURATION_US,
        names.COMPUTE_OUTPUT_DURATION_US,
        names.REQUEST_SUCCESS,
        names.REQUEST_FAILURE,
        names.PENDING_REQUEST_COUNT,
        *names.ENGINE_METRIC_HELP,
        *names.ENGINE_GAUGE_HELP,
        *names.CALLER_METRIC_HELP,
        *names.CALLER_GAUGE_HELP,
    }
)

# PromQL words that look like identifiers but are not metric names
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_TEMPLATE = re.compile(r"<<[^>]*>>")  # prometheus-adapter's <<.LabelMatchers>> etc.
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?")
_NUMBER_SUFFIX = re.compile(r"\b\d[\d.eE+-]*[smhdwy]?\b")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, labels and keywords excluded)."""
    text = _STRING.sub(" ", expr)
    text = _TEMPLATE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    while _RANGE.search(text):
        text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER_SUFFIX.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS:
            continue  # a function call or an operator keyword
        names.add(name)
    return names


def _walk_exprs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _walk_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_exprs(item)


def dashboard_exprs(path: Path = DASHBOARD) -> list[str]:
    return list(_walk_exprs(json.loads(path.read_text())))


def alert_exprs(path: Path = ALERTS) -> list[str]:
    data = yaml.safe_load(path.read_text())
    return [rule["expr"] for group in data["groups"] for rule in group["rules"]]


def adapter_rules(path: Path = ADAPTER_RULES) -> list[dict]:
    data = yaml.safe_load(path.read_text())
    return data["rules"] if "rules" in data and isinstance(data["rules"], list) else []


def adapter_exprs(rules: Iterable[dict] | None = None) -> list[str]:
    rules = adapter_rules() if rules is None else rules
    return [rule[key] for rule in rules for key in ("seriesQuery", "metricsQuery")]


def referenced_by_source() -> dict[str, set[str]]:
    sources = {
        "dashboard": dashboard_exprs(),
        "alerts": alert_exprs(),
        "adapter": adapter_exprs(),
    }
    return {name: set().union(*(metric_names(e) for e in exprs)) for name, exprs in sources.items()}


def referenced_metric_names() -> set[str]:
    """Every metric the dashboard, the alerts and the HPA's adapter rule query."""
    return set().union(*referenced_by_source().values())
