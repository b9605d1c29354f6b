"""No import circles (issue 9): the modules of rankcore/ and executors/ form a
DAG, counting every import (inside functions and ``TYPE_CHECKING`` blocks
too), so each module can be read, tested and replaced on top of the ones
beneath it."""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph(package: str) -> dict[str, set[str]]:
    files = {_module(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [stem] + [f"{stem}.{a.name}" for a in node.names]
            for t in targets:
                # the module itself or, for "from pkg import name", a submodule
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):  # a package's own __init__ is not a circle
                    graph[mod].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", ["rankcore", "executors"])
def test_no_import_circles(package):
    assert _cycles(_graph(package)) == []


def test_the_check_sees_a_circle_inside_a_function(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from .a import y\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycles(_graph("pkg")) == [["pkg.a", "pkg.b"]]


def test_the_executors_share_scenarios_but_not_each_other():
    """The Ray executor and the simulator both stand on executors.scenarios; neither imports the other."""
    graph = _graph("executors")
    crossing = sorted((a, b) for a, bs in graph.items() for b in bs
                      if (a.startswith("executors.ray_gpu") and b.startswith("executors.sim"))
                      or (a.startswith("executors.sim") and b.startswith("executors.ray_gpu")))
    assert crossing == []
    assert any(b.startswith("executors.scenarios") for b in graph["executors.ray_gpu.scenario"])


#: what an embedder (and every executor, benchmark and tool here) may import
#: of rankcore: docs/embedding.md, "What you may import"
PUBLIC_MODULES = {"rankcore", "rankcore.testing", "rankcore.invariants", "rankcore.protocol", "rankcore.base.records",
                  "rankcore.requests"}
#: the namespaces rankcore's own __all__ names (rc.placement.POLICIES, ...) and the module each is
NAMESPACES = {"query": "rankcore.query", "options": "rankcore.base.options", "placement": "rankcore.placement", "gangs": "rankcore.placement.gangs",
              "static": "rankcore.placement.static", "cluster": "rankcore.base.cluster",
              "health": "rankcore.control.health", "restarts": "rankcore.placement.restarts",
              "spares": "rankcore.placement.spares", "tiers": "rankcore.tiers",
              "autoscaling": "rankcore.control.autoscaling"}


def test_executors_benchmarks_and_tools_use_only_the_public_surface():
    import rankcore

    assert set(rankcore.__all__) >= set(NAMESPACES)
    # + the lifecycle declaration the CLI renders as a diagram (rankcore diagram)
    allowed = PUBLIC_MODULES | set(NAMESPACES.values()) | {"rankcore.base.lifecycle"}
    bad = []
    for package in ("executors", "benchmarks", "tools"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                       for a in node.names if a.name == "rankcore"}
            for node in ast.walk(tree):
                mods = []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # from a plane's folder: the submodules named (from rankcore.base import lifecycle)
                    mods = ([f"{node.module}.{a.name}" for a in node.names] if _layer(node.module) != ""
                            and node.module not in allowed else [node.module])
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {m}" for m in mods
                        if m.split(".")[0] == "rankcore" and m not in allowed]
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in aliases and node.attr not in rankcore.__all__
                        and f"rankcore.{node.attr}" not in PUBLIC_MODULES and not node.attr.startswith("__")):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses rankcore.{node.attr}")
    assert bad == []


def test_internal_modules_say_they_are_internal():
    import rankcore

    public = PUBLIC_MODULES | set(NAMESPACES.values()) | {"rankcore.tiers.choice", "rankcore.placement.policies",
                                                           "rankcore.requests.machine"}
    seen = 0
    for path in (ROOT / "rankcore").rglob("*.py"):
        if _module(path) in public or path.stem == "__init__":
            continue
        seen += 1
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "Internal" in doc, f"{path.relative_to(ROOT)}: its docstring does not say it is internal"
    assert seen > 25
    assert rankcore.__doc__ is not None and "public surface" in rankcore.__doc__


#: rankcore's folders, bottom to top (docs/architecture.md, "The planes"): a module may import its own
#: folder and the folders beneath it, never a sibling: placement and tiers stand side by side on the
#: floor (what both need is on the floor; the walk that needs both, ``control.placing``, is above
#: them). The request plane stands on the floor alone, and only the top (the step, the public
#: modules) imports it.
LAYERS = {"base": 0, "tiers": 1, "placement": 1, "control": 2, "requests": 1, "": 3}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else ""  # rankcore.core, rankcore.testing: the top


def _crossings(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for a, targets in graph.items():
        for b in targets:
            la, lb = _layer(a), _layer(b)
            if b == "rankcore" or la == lb or not b.startswith("rankcore."):
                continue
            if LAYERS[lb] >= LAYERS[la] or (lb == "requests" and la != "") or (la == "requests" and lb != "base"):
                bad.append(f"{a} -> {b}")
    return sorted(bad)


def test_the_planes_import_one_way():
    """base (the floor: records, events, the step's transaction and the cluster's books) <- tiers and
    placement, side by side <- control <- the step (core, fast paths) and the public modules; requests
    <- base only, imported by the top only. A crash enters at ``control.moves.fail`` and walks down."""
    graph = _graph("rankcore")
    assert {_layer(m) for m in graph} == set(LAYERS)
    assert _crossings(graph) == []


def test_the_layer_check_sees_a_base_module_importing_a_plane():
    graph = {"rankcore.base.state": {"rankcore.placement.policies"}, "rankcore.requests.machine": {"rankcore.control.pool"},
             "rankcore.control.moves": {"rankcore.core"}, "rankcore.core": {"rankcore.control.moves"},
             "rankcore.placement.gangs": {"rankcore.control.moves", "rankcore.tiers.devices"},
             "rankcore.tiers.devices": {"rankcore.placement.scheduling", "rankcore.base.cluster"},
             "rankcore.placement.scheduling": {"rankcore.tiers.choice", "rankcore.base.books"},
             "rankcore.control.pool": {"rankcore.requests.records"}, "rankcore.requests.queue": {"rankcore.tiers.choice"}}
    assert _crossings(graph) == ["rankcore.base.state -> rankcore.placement.policies",
                                 "rankcore.control.moves -> rankcore.core",
                                 "rankcore.control.pool -> rankcore.requests.records",
                                 "rankcore.placement.gangs -> rankcore.control.moves",
                                 "rankcore.placement.gangs -> rankcore.tiers.devices",
                                 "rankcore.placement.scheduling -> rankcore.tiers.choice",
                                 "rankcore.requests.machine -> rankcore.control.pool",
                                 "rankcore.requests.queue -> rankcore.tiers.choice",
                                 "rankcore.tiers.devices -> rankcore.placement.scheduling"]


#: the Ray executor's folders, bottom to top: the floor (names, the KV store, the words of HTTP and
#: gRPC, a request's context, the router), the weights, the replica actor, the controller, the
#: ingress, and the user's front doors (api: deployments, the config file, apps, REST) at the top;
#: ``executors.ray_gpu`` itself, ``serve``, ``scenario`` and ``subject`` stand above them all
RAY_LAYERS = {"base": 0, "weights": 1, "replica": 2, "control": 3, "ingress": 4, "api": 5, "": 6}


def _ray_layer(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in RAY_LAYERS else ""


def _ray_crossings(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if a.startswith("executors.ray_gpu")
                  for b in targets if b.startswith("executors.ray_gpu.")
                  and RAY_LAYERS[_ray_layer(b)] > RAY_LAYERS[_ray_layer(a)])


def test_the_ray_executor_s_planes_import_one_way():
    """base <- weights <- replica <- control <- ingress <- api <- the package's own modules (issue 66:
    the controller imported the user's API and the API the controller, 14 and 5 module pairs)."""
    graph = _graph("executors")
    assert {_ray_layer(m) for m in graph if m.startswith("executors.ray_gpu")} == set(RAY_LAYERS)
    assert _ray_crossings(graph) == []


def test_the_ray_layer_check_sees_an_upward_import():
    graph = {"executors.ray_gpu.base.context": {"executors.ray_gpu.control.controller", "executors.driver"},
             "executors.ray_gpu.control.carry": {"executors.ray_gpu.replica.actor", "executors.ray_gpu.api.apps"},
             "executors.ray_gpu.api.apps": {"executors.ray_gpu.control.controller"},
             "executors.ray_gpu.serve": {"executors.ray_gpu.api.apps"}}
    assert _ray_crossings(graph) == ["executors.ray_gpu.base.context -> executors.ray_gpu.control.controller",
                                     "executors.ray_gpu.control.carry -> executors.ray_gpu.api.apps"]


def _dotted_strings() -> list[tuple[str, str]]:
    out = []
    for package in ("rankcore", "executors", "benchmarks", "tools", "tests"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and re.fullmatch(r"(rankcore|executors)(\.\w+)+", node.value)):
                    out.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.value))
    return out


def test_module_paths_written_as_strings_exist():
    """A module named in a string (sys.modules.get, importlib, mock.patch) is not followed by an
    import check: after the plane move one such string named a module that no longer existed
    and a shared-weights push was refused as not a state_dict."""
    import importlib

    not_modules = {"rankcore.ray.controller",  # the Ray executor's logger name
                   "rankcore.access",  # the ingress's access-log logger name
                   "rankcore.weights_version",  # a safetensors metadata key
                   "rankcore.RankcoreAPIService",  # the proxies' gRPC service's name (base/grpc_proxy.py)
                   "rankcore.test.Echo", "rankcore.test.Shout"}  # the gRPC tests' services (tests/integration/protos/echo.proto)
    seen, missing = 0, []
    for where, dotted in _dotted_strings():
        if dotted in not_modules:
            continue
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj: object = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                missing.append(f"{where}: {dotted}")
            break
        else:
            missing.append(f"{where}: {dotted}")
        seen += 1
    assert seen > 5 and missing == []
