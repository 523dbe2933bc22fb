"""The Grafana dashboard in ``deploy/grafana/rallypoint.json`` is a dashboard model Grafana
loads, and cannot drift from the metrics: every series its PromQL names is one a member
exports, with the labels the expression selects or groups by. The table of series in
docs/operations.md is the registry's too."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from rallypoint.coordinator.metrics import NodeMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "rallypoint.json"
# The series docs/operations.md names in prose, before its table of the others.
RAFT_SERIES = {
    "rallypoint_raft_term",
    "rallypoint_is_leader",
    "rallypoint_commit_index",
    "rallypoint_applied_index",
    "rallypoint_sessions",
    "rallypoint_leases",
    "rallypoint_leader_changes_total",
    "rallypoint_proposal_seconds",
    "rallypoint_wal_write_seconds",
}
_NAME = re.compile(r"\brallypoint_[a-z0-9_]+\b")
_SELECTOR = re.compile(r"\b(rallypoint_[a-z0-9_]+)\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Labels Prometheus adds at scrape time, and a histogram's bucket bound.
_ADDED_LABELS = {"instance", "le"}
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and template queries."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["definition"]


def exported_names(families: Iterable[Metric]) -> dict[str, set[str]]:
    """Sample name -> its labels, for metric families as a registry or a scrape gives them
    (a labelled family with no series yet still has its name and type)."""
    names: dict[str, set[str]] = {}
    for family in families:
        labels = {label for sample in family.samples for label in sample.labels}
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = labels
    return names


def registry_names() -> dict[str, set[str]]:
    """What a member exports, read from the registry (no cluster needed)."""
    metrics = NodeMetrics(1)
    # One series of each labelled family, so that its label names show. prometheus_client
    # has no public accessor for a metric's label names.
    for collector in vars(metrics).values():
        if isinstance(collector, (Counter, Gauge, Histogram)) and collector._labelnames:
            collector.labels(*("x" for _ in collector._labelnames))
    return exported_names(metrics.registry.collect())


def used_names(dashboard: dict[str, Any]) -> set[str]:
    return {name for expr in expressions(dashboard) for name in _NAME.findall(expr)}


def drift(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> list[str]:
    """What the dashboard's expressions name that ``exported`` lacks."""
    problems = []
    for expr in expressions(dashboard):
        used = set(_NAME.findall(expr))
        problems += [f"{expr}: no series {name}" for name in sorted(used - set(exported))]
        for name, matchers in _SELECTOR.findall(expr):
            for label in re.findall(r"(\w+)\s*=~?", matchers):
                if label not in exported.get(name, set()):
                    problems.append(f"{expr}: {name} has no label {label}")
        have = set().union(*(exported.get(name, set()) for name in used)) | _ADDED_LABELS
        for grouping in _GROUPING.findall(expr):
            for label in (part.strip() for part in grouping.split(",")):
                if label not in have:
                    problems.append(f"{expr}: grouped by {label}, which its series lack")
    return problems


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def test_the_dashboard_is_a_grafana_dashboard_model() -> None:
    dashboard = load()
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
    names = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "job"} <= names


def test_every_series_the_dashboard_uses_is_exported() -> None:
    dashboard = load()
    used = used_names(dashboard)
    # The rendezvous series are all on it, beside the Raft ones.
    for family in (
        "rallypoint_participants",
        "rallypoint_heartbeats_received_total",
        "rallypoint_rounds_opened_total",
        "rallypoint_rounds_closed_total",
        "rallypoint_rounds_ended_total",
        "rallypoint_round_close_seconds_bucket",
        "rallypoint_detection_seconds_bucket",
        "rallypoint_phi_bucket",
        "rallypoint_suspicion_guards_total",
        "rallypoint_store_operations_total",
        "rallypoint_checkpoint_operations_total",
        "rallypoint_raft_term",
    ):
        assert family in used, family
    assert drift(dashboard, registry_names()) == []


def test_a_renamed_series_or_label_is_caught() -> None:
    exported = registry_names()
    renamed = dict(exported)
    renamed["rallypoint_rounds_begun_total"] = renamed.pop("rallypoint_rounds_opened_total")
    assert drift(load(), renamed)
    relabelled = dict(exported, rallypoint_participants={"job", "phase"})
    assert drift(load(), relabelled)


def test_the_documented_table_lists_every_other_series_with_its_labels() -> None:
    rows = {}
    for line in (ROOT / "docs" / "operations.md").read_text().splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if line.strip().startswith("| `rallypoint_"):
            rows[cells[0]] = {label.strip() for label in cells[1].split(",") if label.strip()}
    exported = registry_names()
    families = {}
    for family in NodeMetrics(1).registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = exported[name] if name in exported else exported[f"{name}_count"]
        families[name] = labels - {"le"}
    assert set(rows) == set(families) - RAFT_SERIES
    for name, labels in rows.items():
        assert labels == families[name], name
