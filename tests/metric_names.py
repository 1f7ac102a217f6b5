"""The metric names the pinned exporters expose, and the metric names a PromQL expression uses.

`known_metrics()` reads tests/fixtures/metrics/ (its README says where each file comes
from) and returns every series name a scrape of the pinned releases can hold:

- `*.tsv` (written by extract_wheel_metrics.py from the vLLM and Ray wheels): a
  `gauge` as declared; a `counter` as prometheus_client exposes it, `<name>_total`
  (the declared name with any `_total` taken off first, prometheus_client
  metrics.py Counter); a `histogram` as `<name>_bucket`, `_sum` and `_count`; an
  `exposed` name (what Ray's own panels query) as it is.
- `*default-counters.csv` (dcgm-exporter): the first field of each line that is not
  a comment, stripped.
- `kube-state-metrics-*.md` (its docs/metrics/ tables): the first cell of each row
  that names a `kube_` metric.
- `node_exporter-*_linux.go` (a node_exporter collector's source, verbatim): every key
  of its `descriptions` map and every name it builds with `BuildFQName`, as
  `node_<subsystem>_<name>` (`node_collector_metrics`).
- `up`, which Prometheus writes for every target.

`metric_names(expr)` lists the metric names of a PromQL expression with a small
lexer: strings, label matchers `{...}`, range and subquery brackets `[...]`, the
label lists of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`, numbers,
durations after `offset`, keywords, and function and aggregation names are not
metric names; every other identifier is. A selector by `__name__` is refused (this
lexer cannot judge it). tests/test_alerts.py tests it on its own.
"""

from __future__ import annotations

import csv
import re
from functools import lru_cache
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "metrics"

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
            "inf", "nan", "atan2", "start", "end"}  # fmt: skip
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile", "limitk", "limit_ratio"}  # fmt: skip
GROUPINGS = ("by", "without", "on", "ignoring", "group_left", "group_right")

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(\d+(ms|[smhdwy]))+(?![A-Za-z0-9_:])|0[xX][0-9a-fA-F]+|(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_STRING = re.compile(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|`[^`]*`')


def _series_names(name: str, kind: str) -> set[str]:
    if kind == "counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "histogram":
        return {name + suffix for suffix in ("_bucket", "_sum", "_count")}
    if kind in ("gauge", "exposed"):
        return {name}
    raise ValueError(f"unknown metric type {kind!r} of {name}")


@lru_cache(maxsize=None)
def metrics_by_source() -> dict[str, frozenset[str]]:
    """File name in tests/fixtures/metrics/ -> the series names it vouches for."""
    out: dict[str, frozenset[str]] = {}
    for path in sorted(FIXTURES.glob("*.tsv")):
        names: set[str] = set()
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                name, kind, _source = line.split("\t")
                names |= _series_names(name, kind)
        out[path.name] = frozenset(names)
    for path in sorted(FIXTURES.glob("*default-counters.csv")):
        rows = csv.reader(line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
        out[path.name] = frozenset(row[0].strip() for row in rows)
    for path in sorted(FIXTURES.glob("kube-state-metrics-*.md")):
        out[path.name] = frozenset(re.findall(r"^\|\s*(kube_[a-z0-9_]+)\s*\|", path.read_text(), re.MULTILINE))
    for path in sorted(FIXTURES.glob("node_exporter-*_linux.go")):
        out[path.name] = frozenset(node_collector_metrics(path.read_text()))
    out["prometheus"] = frozenset({"up"})
    return out


NODE_EXPORTER_NAMESPACE = "node"  # node_exporter v1.12.1 collector/collector.go: `const namespace = "node"`


def node_collector_metrics(source: str) -> set[str]:
    """The metric names a node_exporter collector's Go source exports: `<namespace>_<subsystem>_<name>` for each
    key of its `descriptions` map (the per-port metrics) and each name it passes to `BuildFQName(namespace,
    c.subsystem, ...)` directly (`info`)."""
    subsystem = re.search(r'\.subsystem = "(\w+)"', source)
    block = re.search(r"descriptions := map\[string\]string\{(.*?)\n\t\}", source, re.S)
    if subsystem is None or block is None:
        raise ValueError("not a node_exporter collector with a descriptions map")
    names = re.findall(r'^\s*"(\w+)":', block.group(1), re.M)
    names += re.findall(r'BuildFQName\(namespace, c\.subsystem, "(\w+)"\)', source)
    return {f"{NODE_EXPORTER_NAMESPACE}_{subsystem.group(1)}_{n}" for n in names}


def known_metrics() -> set[str]:
    """Every series name the fixtures vouch for (module doc)."""
    return set().union(*metrics_by_source().values())


def _skip_balanced(expr: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at expr[i] (strings inside are skipped)."""
    depth = 0
    while i < len(expr):
        if m := _STRING.match(expr, i):
            i = m.end()
            continue
        if expr[i] == open_:
            depth += 1
        elif expr[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_!r} in {expr!r}")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (module doc)."""
    if "__name__" in expr:
        raise ValueError(f"selector by __name__ in {expr!r}: name the metric")
    names: set[str] = set()
    i, previous = 0, ""
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":  # a comment runs to the end of the line
            i = expr.find("\n", i) if "\n" in expr[i:] else len(expr)
        elif m := _STRING.match(expr, i):
            i, previous = m.end(), "string"
        elif c == "{":
            i, previous = _skip_balanced(expr, i, "{", "}"), "}"
        elif c == "[":
            i, previous = _skip_balanced(expr, i, "[", "]"), "]"
        elif c == "(" and previous in GROUPINGS:
            i, previous = _skip_balanced(expr, i, "(", ")"), ")"
        elif (m := _NUMBER.match(expr, i)) and not (c.isalpha() or c == "_"):
            i, previous = m.end(), "number"
        elif m := _IDENT.match(expr, i):
            word, i = m.group(), m.end()
            rest = expr[i:].lstrip()
            lowered = word.lower()
            if lowered in KEYWORDS or lowered in AGGREGATIONS:
                pass
            elif rest.startswith("("):
                pass  # a function call
            else:
                names.add(word)
            previous = lowered
        else:
            i, previous = i + 1, c
    return names
