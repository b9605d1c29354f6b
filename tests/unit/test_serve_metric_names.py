"""docs/metrics.md's "Ray Serve's metrics, one by one" (issue 64) held to what it describes, so it
cannot drift: every metric the table calls exported is declared in ``base/metrics.py`` under
Serve's name, with the type and label names the row states; no metric the table calls not
exported is declared; every Serve name ``metrics.py`` declares has its row; the counts the
section states are the table's; and the table lists exactly the metrics Ray Serve's source
declares, with their types and labels (read from the installed Ray's files, not imported). A
row that lies fails (``test_a_lying_row_fails`` edits rows and checks each edit is caught)."""

from __future__ import annotations

import ast
import pathlib
import re

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

import rankcore as rc
from executors.ray_gpu.base.metrics import ALL_METRICS, ControllerMetrics, MetricSpec, ReplicaMetrics, merged
from tests.unit.test_metrics import _Observed

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
SECTION = "## Ray Serve's metrics, one by one"
#: what Ray adds to a Serve metric's name
RAY_PREFIX = "ray_"
#: Serve's files whose ``ray.serve.metrics`` run inside a replica: Ray Serve adds these labels first
REPLICA_CONTEXT = {"_private/replica.py": ("deployment", "replica", "application"),
                   "batching.py": ("deployment", "replica", "application"),
                   "multiplex.py": ("deployment", "replica", "application")}
#: ``RequestProtocol``'s values, lower-cased: the protocols Serve's ingress metrics are made for
PROTOCOLS = ("http", "grpc")


@attrs.frozen
class Row:
    name: str  # Serve's, as declared (no ``ray_``)
    kind: str
    labels: tuple[str, ...]  # Serve's
    source: str
    rankcore: str


def _labels(cell: str) -> tuple[str, ...]:
    cell = re.sub(r"\(.*?\)", "", cell).strip()  # (a note in brackets is not a label)
    if cell in ("—", "-", ""):
        return ()
    return tuple(x.strip() for x in cell.split(","))


def section(text: str) -> str:
    assert text.count(SECTION + "\n") == 1, f"docs/metrics.md has no (or two) {SECTION!r}"
    return text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]


def rows(text: str) -> list[Row]:
    out = []
    for line in section(text).splitlines():
        if not line.startswith("| `serve_"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, line
        out.append(Row(name=cells[0].strip("`"), kind=cells[1], labels=_labels(cells[2]), source=cells[3].strip("`"),
                       rankcore=cells[4]))
    return out


def claimed(row: Row) -> tuple[str, ...] | None:
    """The label names the row says rankcore exports the metric with (None: not exported)."""
    said = row.rankcore
    if said.startswith("not exported: "):
        assert said.removeprefix("not exported: ").strip(), f"{row.name}: not exported, but no reason"
        return None
    m = re.match(r"exported with labels `([^`]*)`", said)
    if m:
        return _labels(m.group(1))
    assert re.match(r"exported\b", said), f"{row.name}: the rankcore cell says neither exported nor not: {said!r}"
    return row.labels


def problems(table: list[Row], specs: tuple[MetricSpec, ...]) -> list[str]:
    """What the table says that ``specs`` (metrics.py's declarations) do not bear out."""
    out = []
    names = [r.name for r in table]
    out += [f"{n}: two rows" for n in sorted({n for n in names if names.count(n) > 1})]
    by_serve = {s.serve: s for s in specs if s.serve}
    for r in table:
        spec = by_serve.get(RAY_PREFIX + r.name)
        labels = claimed(r)
        if labels is None:
            if spec is not None:
                out.append(f"{r.name}: the table says not exported, metrics.py declares it ({spec.name})")
            continue
        if spec is None:
            out.append(f"{r.name}: the table says exported, metrics.py declares no metric with Serve's name")
            continue
        if spec.kind != r.kind:
            out.append(f"{r.name}: the table says {r.kind}, metrics.py declares a {spec.kind}")
        if sorted(spec.labels) != sorted(labels):
            out.append(f"{r.name}: the table says labels {sorted(labels)}, metrics.py declares {sorted(spec.labels)}")
    for s in specs:
        serve = s.serve or (s.name if s.name.startswith(RAY_PREFIX + "serve_") else None)
        if serve is not None and serve.removeprefix(RAY_PREFIX) not in names:
            out.append(f"{serve}: declared in metrics.py, no row in the table")
    return out


# ------------------------------------------------------------------ the table and metrics.py
def test_the_table_is_read():
    table = rows(DOC.read_text())
    stated = re.search(r"There are \*\*(\d+)\*\*", section(DOC.read_text()))
    assert stated and int(stated.group(1)) == len(table) > 0
    for r in table:
        assert r.kind in ("counter", "gauge", "histogram"), r
        assert all(re.fullmatch(r"[a-z_]+", lab) for lab in r.labels), r
        claimed(r)  # (each rankcore cell says exported or not exported: why)


def test_every_row_agrees_with_metrics_py():
    assert problems(rows(DOC.read_text()), ALL_METRICS) == []


def test_the_stated_counts_are_the_tables():
    text = section(DOC.read_text())
    table = rows(DOC.read_text())
    exported = sum(claimed(r) is not None for r in table)
    assert f"**{exported} exported**" in text
    assert f"**{len(table) - exported} not**" in text
    concept = sum(r.rankcore.startswith("not exported: no such concept") for r in table)
    yet = sum(r.rankcore.startswith("not exported: not yet") for r in table)
    assert concept + yet == len(table) - exported  # (every reason is one of the two)
    assert f"{concept} for want of the concept" in text and f"{yet} not yet" in text


def _edit(text: str, name: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new`` in ``name``'s row only."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.startswith(f"| `{name}` |")]
    assert len(hits) == 1, name
    assert old in lines[hits[0]], (name, old)
    lines[hits[0]] = lines[hits[0]].replace(old, new, 1)
    return "".join(lines)


def test_a_lying_row_fails():
    """Each edit makes a row lie about metrics.py; the check names it."""
    text = DOC.read_text()
    lies = {
        # a label rankcore does not have
        "serve_num_http_requests": _edit(text, "serve_num_http_requests", "application, status_code |",
                                         "application, status_code, handle |"),
        # a label dropped
        "serve_deployment_request_counter": _edit(text, "serve_deployment_request_counter", ", route |", " |"),
        # another type
        "serve_deployment_status": _edit(text, "serve_deployment_status", "| gauge |", "| counter |"),
        # exported, says the row: metrics.py has no such metric
        "serve_router_args_resolution_latency_ms": _edit(text, "serve_router_args_resolution_latency_ms",
                                                         "| not exported: not yet;", "| exported;"),
        # not exported, says the row: metrics.py declares it
        "serve_health_check_failures_total": _edit(text, "serve_health_check_failures_total", "| exported (",
                                                   "| not exported: not yet (", ),
        # labels other than metrics.py's, said outright
        "serve_batches_processed": _edit(text, "serve_batches_processed", "| exported |",
                                         "| exported with labels `deployment, replica` |", ),
    }
    for name, lying in lies.items():
        found = problems(rows(lying), ALL_METRICS)
        assert found and all(p.startswith(name) for p in found), (name, found)
    # a row taken out: metrics.py declares a Serve name the table does not list
    line = next(x for x in text.splitlines(keepends=True) if x.startswith("| `serve_deployment_replica_starts` |"))
    found = problems(rows(text.replace(line, "")), ALL_METRICS)
    assert found == ["ray_serve_deployment_replica_starts: declared in metrics.py, no row in the table"]
    # a row twice
    found = problems(rows(text.replace(line, line + line)), ALL_METRICS)
    assert found == ["serve_deployment_replica_starts: two rows"]


# ------------------------------------------------------------------ the four added for issue 64
def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(text.decode()) for x in fam.samples}


def test_the_added_metrics_count_what_the_table_says():
    """A replica's start (1 per replica process), a failed health check (HealthChecked fed to the
    core, healthy=False; a healthy one is not counted), the deployment's status in Serve's numbers
    and an autoscaled deployment's target ongoing requests, from real core steps."""
    s = _samples(merged(ReplicaMetrics("d", "d#1").families()))
    assert s[("ray_serve_deployment_replica_starts_total",
              (("application", "d"), ("deployment", "d"), ("replica", "d#1")))] == 1
    m = ControllerMetrics("actor")
    d = _Observed(m, nodes=["n0"])
    d.run(rc.DeploymentApplied(name="plain", num_replicas=2))
    d.run(rc.DeploymentApplied(name="auto", num_replicas=1, autoscaling=True, max_replicas=4,
                               target_ongoing_requests=3))
    rid = sorted(d.state.deployments["plain"].replicas)[0]
    d.run(rc.HealthChecked(replica_id=rid, healthy=False, detail="timed out", now=1.0))
    d.run(rc.HealthChecked(replica_id=rid, healthy=True, detail="", now=2.0))
    s = _samples(m.exposition(d.state))
    failures = {k: v for k, v in s.items() if k[0] == "ray_serve_health_check_failures_total"}
    assert failures == {("ray_serve_health_check_failures_total",
                         (("application", "plain"), ("deployment", "plain"), ("replica", rid))): 1}
    status = {dict(k[1])["deployment"]: v for k, v in s.items() if k[0] == "ray_serve_deployment_status"}
    assert status == {"plain": 6, "auto": 6}  # (HEALTHY)
    ongoing = {dict(k[1])["deployment"]: v for k, v in s.items()
               if k[0] == "ray_serve_autoscaling_target_ongoing_requests"}
    assert ongoing == {"auto": 3}  # (none for a deployment not autoscaled)


# ------------------------------------------------------------------ the table and Ray Serve's source
def _names(node: ast.expr) -> list[str]:
    """A metric's name: a string, or Serve's per-protocol f-string (one name per protocol)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        parts = [str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values]
        holes = [v for v in node.values if isinstance(v, ast.FormattedValue)]
        assert len(holes) == 1 and ast.unparse(holes[0].value) == "protocol_name", ast.unparse(node)
        return ["".join(parts).replace("{}", p) for p in PROTOCOLS]
    return []


def _tag_keys(node: ast.expr | None, scope: ast.AST) -> tuple[str, ...] | None:
    """Literal tag keys (None when Serve computes them at run time)."""
    if node is None:
        return ()
    if isinstance(node, ast.Name):  # (Serve's ``replica_lifecycle_metric_tag_keys``: assigned above)
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
                value = n.value
                # a flag's choice: its first branch (RAY_SERVE_CONTROLLER_METRICS_INCLUDE_HIGH_CARDINALITY_TAGS, on)
                return _tag_keys(value.body if isinstance(value, ast.IfExp) else value, scope)
        return None
    try:
        keys = ast.literal_eval(node)
    except ValueError:
        return None
    return tuple(keys)


def serve_source_metrics(serve: pathlib.Path) -> dict[str, tuple[str, str, tuple[str, ...] | None]]:
    """``{name: (kind, its file under ray/serve, labels or None)}`` for every ``serve_*`` metric
    Serve's source makes (``Counter``/``Gauge``/``Histogram``, Ray's or Serve's), tests left out."""
    out: dict[str, tuple[str, str, tuple[str, ...] | None]] = {}
    for path in sorted(serve.rglob("*.py")):
        rel = path.relative_to(serve).as_posix()
        if "tests" in path.relative_to(serve).parts:
            continue
        tree = ast.parse(path.read_text())
        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            f = call.func
            kind = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if kind not in ("Counter", "Gauge", "Histogram"):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            name_node = call.args[0] if call.args else kw.get("name")
            names = [n for n in _names(name_node) if n.startswith("serve_")] if name_node is not None else []
            if not names:
                continue
            labels = _tag_keys(kw.get("tag_keys"), tree)
            if labels is not None and rel in REPLICA_CONTEXT:
                labels = REPLICA_CONTEXT[rel] + labels
            for n in names:
                assert n not in out, f"{n} declared twice ({out[n][1]}, {rel})"
                out[n] = (kind.lower(), rel, labels)
    return out


def test_the_table_is_ray_serves_own_list():
    """The rows are exactly the metrics the installed Ray Serve declares: names, types, files, and
    labels where Serve's source spells them out (the event loops' are built at run time)."""
    ray = pytest.importorskip("ray")
    serve = pathlib.Path(ray.__file__).parent / "serve"
    for rel in REPLICA_CONTEXT:  # (the labels Serve adds come from ``ray.serve.metrics``: these files use it)
        src = (serve / rel).read_text()
        assert "from ray.serve import metrics" in src or "from ray.serve.metrics import" in src, rel
    source = serve_source_metrics(serve)
    table = {r.name: r for r in rows(DOC.read_text())}
    note = f"(Ray {ray.__version__}; the table is of Ray 2.60.0)"
    assert sorted(set(source) - set(table)) == [], f"Serve declares these, the table lacks them {note}"
    assert sorted(set(table) - set(source)) == [], f"the table lists these, Serve does not declare them {note}"
    for name, (kind, rel, labels) in source.items():
        r = table[name]
        assert (r.kind, r.source) == (kind, rel), (name, note)
        if labels is not None:
            assert sorted(r.labels) == sorted(labels), (name, labels, note)
