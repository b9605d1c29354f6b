"""Applications from a config file (``rankcore deploy``, ``PUT /api/serve/applications/``): apply
one, read what runs as Ray Serve's ``ServeInstanceDetails`` and as ``rankcore status`` shows it,
delete one, shut down.

Applying is declarative, as Ray Serve's is: every application the file names is imported
(``import_path``), its deployments get the file's option overrides and are applied through the
controller, its route prefix is exposed on the ingress; the deployments of applications the
file no longer names are deleted. Whether an applied deployment changes anything is the core's
rule (``rankcore.step`` on ``DeploymentApplied``: the same options issue no command, a
``user_config`` change reconfigures in place, a new ``version``, resources or placement roll;
docs/rollouts.md), so applying the same file twice changes nothing.

What was applied (per application: its deployments, route, the file's entry, when) is kept in
Ray's KV store under ``rankcore/apps``, so another process (the CLI, the REST server) sees it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import typing
from typing import Any

import attrs
import ray
from ray import cloudpickle
from ray.experimental import internal_kv

import rankcore as rc

from ..base import appnames, persist
from ..base.replicas import NAMESPACE, actor_name
from ..ingress import http as ingress
from . import config as cf
from .deployments import Application, Deployment, DeploymentHandle, _deploy, ask, get_controller, map_bound
from .deployments import delete as delete_deployment

__all__ = ["AppliedApp", "apply_config", "start_proxies", "import_app", "applied_apps", "delete_app", "delete_all", "details",
           "status", "unhealthy", "FAULTS_SHOWN"]


_KV_APPS = b"rankcore/apps"
#: the statuses (Ray Serve's words) that make ``status`` unhealthy (exit status 1)
_BAD = ("UNHEALTHY", "DEPLOY_FAILED")
#: how many recent faults ``status`` shows
FAULTS_SHOWN = 10
#: Ray Serve's ``ReplicaState`` for each of the core's phases
_REPLICA_STATE = {"pending": "STARTING", "starting": "STARTING", "running": "RUNNING",
                  "reconfiguring": "UPDATING", "stopping": "STOPPING", "failed": "RECOVERING"}


@attrs.frozen(kw_only=True)
class AppliedApp:
    """One application as applied: its ingress deployment (first) and the others of its graph,
    its route prefix (None: not exposed), the file's entry (``deployed_app_config``) and when."""

    name: str
    deployments: tuple[str, ...]
    route_prefix: str | None
    config: dict
    deployed_at: float


@attrs.frozen(kw_only=True)
class _Applied:
    apps: dict[str, AppliedApp] = attrs.Factory(dict)
    http_options: dict = attrs.Factory(dict)
    proxy_location: str = "EveryNode"


def _load() -> _Applied:
    raw = internal_kv._internal_kv_get(_KV_APPS)
    return cloudpickle.loads(raw) if raw else _Applied()


def _save(applied: _Applied) -> None:
    internal_kv._internal_kv_put(_KV_APPS, cloudpickle.dumps(applied), overwrite=True)


def applied_apps() -> dict[str, AppliedApp]:
    """The applications applied and not deleted, by name."""
    return dict(_load().apps)


# ------------------------------------------------------------------ import
def import_app(import_path: str, args: dict) -> Application:
    """``module:attr`` (or ``module.attr``) as an ``Application``: one as is, a deployment bound with
    no arguments, or a builder function called with ``args`` (Ray Serve's application builders).
    The current directory is importable; the module's classes travel to the replicas by value.
    ``rankcore.InvalidConfig`` says what was wrong."""
    mod_name, attr = cf.split_import_path(import_path)
    if not mod_name or not attr:
        raise rc.InvalidConfig(f"expected module:attr or module.attr, got {import_path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    before = set(sys.modules)
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:
        raise rc.InvalidConfig(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, attr):
        raise rc.InvalidConfig(f"module {mod_name!r} has no {attr!r}")
    app = getattr(module, attr)
    if isinstance(app, Deployment):
        app = app.bind()
    if not isinstance(app, Application):
        if not callable(app) or isinstance(app, type):
            raise rc.InvalidConfig(f"{import_path} is a {type(app).__name__}, not an application "
                                   f"(Model.bind(...)), a deployment or a builder function")
        try:
            takes = len(inspect.signature(app).parameters)
            app = app(_builder_args(app, args)) if takes else app()
        except Exception as exc:
            raise rc.InvalidConfig(f"the builder {import_path} raised {type(exc).__name__}: {exc}") from None
        if isinstance(app, Deployment):
            app = app.bind()
        if not isinstance(app, Application):
            raise rc.InvalidConfig(f"the builder {import_path} returned a {type(app).__name__}, "
                                   f"not an application")
    elif args:
        raise rc.InvalidConfig(f"args are for a builder function; {import_path} is an application")
    if mod_name not in ("__main__",):
        cloudpickle.register_pickle_by_value(module)
        for sibling in _siblings(module, set(sys.modules) - before):
            cloudpickle.register_pickle_by_value(sibling)
    return app


def _siblings(module: Any, new: set[str]) -> list[Any]:
    """The modules the import of ``module`` imported from its own folder (``utils.py`` beside ``app.py``):
    sent by value with it, as ``module`` is, since the cluster's processes may not have that folder
    on their path (a module deployed from the current directory that imports a sibling)."""
    if not getattr(module, "__file__", None):
        return []
    home = os.path.dirname(os.path.abspath(module.__file__))
    out = []
    for name in sorted(new):
        m = sys.modules.get(name)
        f = getattr(m, "__file__", None)
        if m is not None and m is not module and f and os.path.dirname(os.path.abspath(f)) == home:
            out.append(m)
    return out


def _builder_args(builder: Any, args: dict) -> Any:
    """What a builder gets, by Ray Serve's rule: ``args`` as they are, or, when its parameter is typed
    with a pydantic model (v2's, or v1's through ``pydantic.v1``), the model built from them (a bad value
    raises the model's error, which the caller names)."""
    params = list(inspect.signature(builder).parameters.values())
    if not params:
        return args
    try:  # (a string annotation, ``from __future__ import annotations``: resolved where the builder was written,
        # its module's names and those its body closes over: a model class made in a function)
        local = dict(inspect.getclosurevars(builder).nonlocals)
        hint = typing.get_type_hints(builder, localns=local).get(params[0].name, params[0].annotation)
    except Exception:  # (a hint that does not resolve: not a model)
        hint = params[0].annotation
    if not isinstance(hint, type):
        return args
    try:
        import pydantic
        from pydantic import v1 as pydantic_v1
    except ImportError:  # pragma: no cover - (pydantic comes with Ray)
        return args
    if issubclass(hint, pydantic.BaseModel):
        return hint.model_validate(args)
    if issubclass(hint, pydantic_v1.BaseModel):
        return hint.parse_obj(args)
    return args


def _override(app: Application, entry: cf.ApplicationConfig, i: int, cfg: cf.ServeConfig) -> Application:
    """``app`` with the file's options for each deployment named in ``entry.deployments`` (checked
    with the code's options by ``.options()``), and the application's ``runtime_env`` where a
    deployment has none of its own (Ray Serve's inheritance)."""
    names = {d.name for d in app.graph()}
    for j, d in enumerate(entry.deployments):
        if d.name not in names:
            raise cfg.error(f"applications[{i}].deployments[{j}].name", f"application {entry.name!r} has no deployment {d.name!r} "
                                 f"(its deployments: {', '.join(sorted(names))})")
    by_name = {d.name: (j, d) for j, d in enumerate(entry.deployments)}
    done: dict[int, Deployment] = {}  # (one deployment bound twice in the graph stays one)

    def rebuild(a: Any) -> Any:
        if not isinstance(a, Application):
            return a
        if id(a.deployment) not in done:
            done[id(a.deployment)] = _overridden(a.deployment)
        # (a bound deployment at any depth of its arguments: rebuilt too)
        return Application(done[id(a.deployment)], map_bound(a.args, rebuild), map_bound(a.kwargs, rebuild))

    def _overridden(dep: Deployment) -> Deployment:
        """``dep`` with the file's options for it and the application's ``runtime_env``."""
        opts: dict[str, Any] = {}
        if entry.runtime_env and "runtime_env" not in dep.ray_actor_options:
            opts["ray_actor_options"] = {**dep.ray_actor_options, "runtime_env": entry.runtime_env}
        here = by_name.get(dep.name)
        if here is not None:
            opts.update(here[1].to_options())
        if opts:
            try:
                dep = dep.options(**opts)
            except rc.InvalidConfig as exc:
                path = f"applications[{i}].deployments[{here[0]}]" if here else f"applications[{i}].runtime_env"
                raise cf.option_error(cfg.source, cfg.lines, path, opts, exc) from None
        return dep

    return rebuild(app)


# ------------------------------------------------------------------ apply
def start_proxies(http: cf.HTTPOptions, grpc: cf.GRPCOptions, proxy_location: str | None) -> None:
    """Start (or configure) the proxies from Ray Serve's ``http_options`` and ``grpc_options``: HTTP
    on their host and port, gRPC only when servicer functions are named (as Serve); the config
    file's path (``apply_config``) and ``serve.start``."""
    ingress.start_ingress(http.host, http.port, proxy_location=proxy_location,
                          request_timeout_s=http.request_timeout_s if http.request_timeout_s else "keep",
                          grpc_port=grpc.port if grpc.grpc_servicer_functions else None,
                          grpc_servicer_functions=tuple(grpc.grpc_servicer_functions))


def apply_config(cfg: cf.ServeConfig, *, wait_s: float | None = None,
                 timeout: float = 120.0) -> dict[str, AppliedApp]:
    """Apply ``cfg`` (a ``ServeConfig``, checked): import every application and give its
    deployments the file's options (all before anything is applied: a bad import or option
    changes nothing), apply them through the controller, expose each route prefix, delete the
    deployments of applications (and of graphs) the file no longer names. ``wait_s``: then wait
    up to that long for every deployment to be healthy (``TimeoutError``). Returns what was applied."""
    built: list[tuple[cf.ApplicationConfig, Application]] = []
    owner: dict[str, str] = {}
    for i, entry in enumerate(cfg.applications):
        try:
            app = import_app(entry.import_path, entry.args)
        except rc.InvalidConfig as exc:
            raise cfg.error(f"applications[{i}].import_path", str(exc)) from None
        app = _override(app, entry, i, cfg)
        for d in app.graph():
            if d.name in owner:
                raise cfg.error(f"applications[{i}].import_path", f"deployment {d.name!r} is in applications {owner[d.name]!r} and "
                                     f"{entry.name!r} (deployment names are global in rankcore)")
            owner[d.name] = entry.name
        built.append((entry, app))
    before = _load()
    ctl = get_controller()
    http = cfg.http_options
    exposed = rc.ProxyLocation(cfg.proxy_location) is not rc.ProxyLocation.Disabled and \
        any(e.route_prefix is not None for e, _ in built)
    if exposed:
        start_proxies(http, cfg.grpc_options, cfg.proxy_location)
    now = time.time()
    apps: dict[str, AppliedApp] = {}
    for entry, app in built:
        seen: dict[str, Deployment] = {}
        appnames.assign(entry.name, tuple(d.name for d in app.graph()))  # (before: the first metrics name it)
        _deploy(app, ctl, timeout, seen, wait=False)
        name = app.deployment.name
        if exposed and entry.route_prefix is not None:
            ingress.expose(DeploymentHandle(name, ctl), entry.route_prefix, http.port, http.host)
        else:
            ingress.unexpose(name)
        plain = cf.to_plain(attrs.evolve(cfg, applications=(entry,)))["applications"][0]
        old = before.apps.get(entry.name)
        apps[entry.name] = AppliedApp(
            name=entry.name, deployments=tuple(d.name for d in app.graph()), route_prefix=entry.route_prefix,
            config=plain, deployed_at=old.deployed_at if old is not None and old.config == plain else now)
    kept = {d for a in apps.values() for d in a.deployments}
    gone = [d for a in before.apps.values() for d in a.deployments if d not in kept]
    _save(_Applied(apps=apps, http_options=attrs.asdict(http), proxy_location=cfg.proxy_location))
    for left in set(before.apps) - set(apps):
        appnames.forget(left)
    for name in gone:  # (as Ray Serve deletes the applications a new config leaves out)
        try:
            delete_deployment(name, wait=False)
        except rc.InvalidEvent:
            pass  # (deleted already, by hand)
    if wait_s is not None:
        for name in sorted(kept):
            if not ask(ctl, "wait_healthy", name, wait_s, timeout=wait_s + 30):
                raise TimeoutError(f"deployment {name!r} not healthy after {wait_s:g}s")
    return apps


def delete_app(name: str, *, wait: bool = True, timeout: float = 60.0) -> None:
    """Delete application ``name`` (its deployments and route: Ray Serve's ``serve.delete``);
    ``rankcore.InvalidEvent`` for an unknown one."""
    applied = _load()
    app = applied.apps.get(name)
    if app is None:
        raise rc.InvalidEvent(f"unknown application {name!r} (applied: {', '.join(sorted(applied.apps)) or 'none'})")
    _save(attrs.evolve(applied, apps={k: v for k, v in applied.apps.items() if k != name}))
    appnames.forget(name)
    for d in app.deployments:
        try:
            delete_deployment(d, wait=False)
        except rc.InvalidEvent:
            pass
    if wait:
        ctl = get_controller()
        for d in app.deployments:
            if not ask(ctl, "wait_deleted", d, timeout, timeout=timeout + 30):
                raise TimeoutError(f"deployment {d!r} not deleted after {timeout:g}s")


def delete_all(timeout: float = 60.0) -> None:
    """Every application deleted, every deployment stopped, the ingress gone and the controller
    reset (Ray Serve's ``serve shutdown``, but for the REST server: ``rest.stop_rest``); the Ray
    cluster keeps running."""
    internal_kv._internal_kv_del(_KV_APPS)
    appnames.forget_all()
    ask(get_controller(), "reset", timeout, timeout=timeout + 30)


# ------------------------------------------------------------------ what runs
def _facts() -> dict[str, Any]:
    """One reading of everything the views below show."""
    ctl = get_controller()
    state: rc.State = cloudpickle.loads(ask(ctl, "state"))
    try:
        actor = ray.get_actor(ingress.INGRESS_NAME, namespace=NAMESPACE)
        address = tuple(ray.get(actor.ready.remote(), timeout=10))
        proxy = {"status": "HEALTHY", "address": address, "actor_id": actor._actor_id.hex()}
    except ValueError:
        proxy = None
    except Exception as exc:  # (there, but not answering)
        proxy = {"status": "UNHEALTHY", "address": None, "actor_id": None, "error": repr(exc)}
    try:
        routes = persist.load_http_routes()[0]
    except Exception:  # (a route table this process cannot read: no routes shown for serve.run's apps)
        routes = {}
    return {"state": state, "applied": _load(), "faults": ask(ctl, "recent_faults"),
            "controller": ctl._actor_id.hex(), "proxy": proxy, "head": _head(), "proxies": ask(ctl, "proxies"),
            "replicas": ask(ctl, "replica_details"), "app_names": appnames.table(0.0), "routes": routes}


#: the core's proxy phases in Ray Serve's ``ProxyStatus`` words
_PROXY_STATUS = {"starting": "STARTING", "healthy": "HEALTHY", "draining": "DRAINING", "backoff": "UNHEALTHY"}


def _head() -> str | None:
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in (n.get("Resources") or {}):
            return n["NodeID"]
    return None


#: what each replica says of itself (``ReplicaActor.identity``; None until its actor has answered),
#: Ray Serve's ``ReplicaDetails`` fields
_IDENTITY = ("pid", "actor_id", "actor_name", "worker_id", "node_ip", "start_time_s", "log_file_path")


def _replicas(name: str, dep: Any, known: dict) -> list[dict]:
    out = []
    for rid, rep in dep.replicas.items():
        rank = rc.query.shown_ranks(dep, rid)
        said = known.get(rid) or {"actor_name": actor_name(name, rid)}
        out.append({"replica_id": rid, "state": _REPLICA_STATE.get(rep.phase.value, rep.phase.value.upper()),
                    "phase": rep.phase.value, "rank": rank[0], "node_rank": rank[1], "local_rank": rank[2],
                    "node_id": rep.node_id, "tier": rep.residency.value, "version": rep.revision,
                    "blue_green": rc.query.blue_green_role(dep, rep), **{k: said.get(k) for k in _IDENTITY}})
    return sorted(out, key=lambda r: (r["rank"], r["replica_id"]))


def _deployment(name: str, dep: Any, seen: dict | None = None) -> dict:
    """One deployment as ``status`` shows it (None: the core does not hold it); ``seen``: the
    controller's ``replica_details``."""
    seen = seen or {}
    if dep is None:
        return {"name": name, "status": "DEPLOY_FAILED", "message": "not held by the controller", "target": 0,
                "revision": None, "autoscaling": None, "replicas": [], "recent_dead_replicas": []}
    auto = dep.config.autoscaler
    status, message = ("DELETING" if dep.deleting else dep.status), dep.status_message
    gone = [{k: r.get(k) for k in ("replica_id", "state", "node_id", *_IDENTITY)}
            for r in seen.get("gone", {}).get(name, [])]
    return {"name": name, "status": status, "message": message, "target": dep.target,
            # (Ray Serve's status trigger: a serving replica died, rankcore.base.unhealthy)
            "replica_died": bool(dep.health_failed) and status == "UNHEALTHY" and not dep.failing_to_start,
            "revision": dep.revision,
            "autoscaling": {"min_replicas": auto.min_replicas, "max_replicas": dep.max_replicas,
                            "target_ongoing_requests": auto.target_ongoing_requests, "target": dep.target}
            if auto.autoscaling else None,
            "replicas": _replicas(name, dep, seen.get("replicas", {})), "recent_dead_replicas": gone}


def _app_status(deps: list[dict]) -> tuple[str, str]:
    """Ray Serve's ApplicationStatus from its deployments'."""
    statuses = {d["status"] for d in deps}
    if statuses & {"UNHEALTHY", "DEPLOY_FAILED"}:
        bad = [d for d in deps if d["status"] in ("UNHEALTHY", "DEPLOY_FAILED")]
        return "UNHEALTHY" if "UNHEALTHY" in statuses else "DEPLOY_FAILED", \
            "; ".join(f"{d['name']}: {d['message']}" for d in bad)
    if statuses == {"HEALTHY"}:
        return "RUNNING", ""
    if "DELETING" in statuses:
        return "DELETING", ""
    return "DEPLOYING", "; ".join(f"{d['name']}: {d['message']}" for d in deps if d["message"])


def status(facts: dict | None = None) -> dict:
    """What ``rankcore status --json`` prints: applications with their deployments and replicas
    (ranks, node, tier, state, version, and what each said of itself when it started: pid, actor
    id, log file, ...; each deployment's ``recent_dead_replicas`` too), the proxy, autoscaling
    targets, recent faults, and
    ``healthy`` (false when an application or a deployment is UNHEALTHY or DEPLOY_FAILED, or the
    proxy is not healthy; one still DEPLOYING, or DELETING, is on its way, not unhealthy)."""
    facts = facts or _facts()
    state = facts["state"]
    seen = facts.get("replicas") or {}
    apps = {}
    named: set[str] = set()
    for name, app in sorted(facts["applied"].apps.items()):
        deps = [_deployment(d, state.deployments.get(d), seen) for d in app.deployments]
        named.update(app.deployments)
        st, msg = _app_status(deps)
        apps[name] = {"name": name, "status": st, "message": msg, "route_prefix": app.route_prefix,
                      "last_deployed_time_s": app.deployed_at, "deployments": {d["name"]: d for d in deps}}
    # the applications serve.run made (appnames: not in the config's record), their routed deployment first
    ran: dict[str, list[str]] = {}
    for d in sorted(state.deployments):
        app_name = (facts.get("app_names") or {}).get(d)
        if d not in named and app_name is not None and app_name not in apps:
            ran.setdefault(app_name, []).append(d)
    routes = facts.get("routes") or {}
    for name, members in sorted(ran.items()):
        prefix = next((p for p, d in sorted(routes.items()) if d in members), None)
        members.sort(key=lambda d: (routes.get(prefix) != d, d))
        deps = [_deployment(d, state.deployments.get(d), seen) for d in members]
        named.update(members)
        st, msg = _app_status(deps)
        apps[name] = {"name": name, "status": st, "message": msg, "route_prefix": prefix,
                      "last_deployed_time_s": None, "deployments": {d["name"]: d for d in deps}}
    others = {n: _deployment(n, d, seen) for n, d in sorted(state.deployments.items()) if n not in named}
    # each proxy the core runs, by node (Serve's ProxyStatus; a draining one is on its way out, not unhealthy)
    proxies = {p["node_id"]: {"status": _PROXY_STATUS[p["phase"]], "proxy_id": pid, "actor_name": p["actor_name"],
                              "address": f"{p['address'][0]}:{p['address'][1]}" if p["address"] else None}
               for pid, p in sorted(facts.get("proxies", {}).items())}
    faults = facts["faults"][-FAULTS_SHOWN:]
    healthy = not any(a["status"] in _BAD for a in apps.values()) and \
        all(p["status"] != "UNHEALTHY" for p in proxies.values()) and \
        not any(d["status"] in _BAD for d in others.values())
    return {"healthy": healthy, "applications": apps, "other_deployments": others, "proxies": proxies,
            "recent_faults": faults}


def unhealthy(view: dict) -> list[str]:
    """What is wrong, one line each ([] when ``view["healthy"]``)."""
    out = [f"application {a['name']}: {a['status']} {a['message']}".rstrip()
           for a in view["applications"].values() if a["status"] in _BAD]
    out += [f"deployment {d['name']}: {d['status']} {d['message']}".rstrip()
            for d in view["other_deployments"].values() if d["status"] in _BAD]
    out += [f"proxy on {n}: {p['status']}" for n, p in view["proxies"].items() if p["status"] == "UNHEALTHY"]
    return out


def _serve_replica(r: dict) -> dict:
    """A replica as Ray Serve's ``ReplicaDetails`` (its ``start_time_s`` 0 until it has said)."""
    return {"replica_id": r["replica_id"], "state": r["state"], "node_id": r["node_id"],
            "node_ip": r["node_ip"], "actor_id": r["actor_id"], "actor_name": r["actor_name"],
            "worker_id": r["worker_id"], "pid": r["pid"], "log_file_path": r["log_file_path"],
            "start_time_s": r["start_time_s"] or 0.0}


def details() -> dict:
    """``GET /api/serve/applications/``: Ray Serve's ``ServeInstanceDetails`` shape (the fields we
    have facts for; each replica also carries ``rank``, ``node_rank``, ``local_rank``, ``tier``
    and ``version``, extra fields Ray Serve's ``ReplicaDetails`` ignores)."""
    facts = _facts()
    view = status(facts)
    applied = facts["applied"]
    apps = {}
    for name, a in view["applications"].items():
        deps = {}
        record = applied.apps.get(name)  # (None: an application serve.run made)
        for dname, d in a["deployments"].items():
            conf = next((x for x in (record.config if record else {}).get("deployments", []) if x["name"] == dname),
                        {"name": dname})
            deps[dname] = {
                "name": dname,
                "status": d["status"] if d["status"] in ("HEALTHY", "UPDATING", "UNHEALTHY", "DEPLOY_FAILED")
                else "UPDATING",
                "status_trigger": "HEALTH_CHECK_FAILED" if d.get("replica_died") else "UNSPECIFIED",
                "message": d["message"], "deployment_config": _serve_names(conf),
                "target_num_replicas": d["target"], "required_resources": {},
                "replicas": [{**_serve_replica(r), "rank": r["rank"], "node_rank": r["node_rank"],
                              "local_rank": r["local_rank"], "tier": r["tier"], "version": r["version"],
                              "blue_green": r["blue_green"]}
                             for r in d["replicas"]],
                "recent_dead_replicas": [_serve_replica(r) for r in d["recent_dead_replicas"]]}
        apps[name] = {"name": name, "route_prefix": a["route_prefix"], "docs_path": None, "status": a["status"],
                      "message": a["message"], "last_deployed_time_s": a["last_deployed_time_s"],
                      "deployed_app_config": _serve_app(record.config) if record else None,
                      "source": "declarative" if record else "imperative",
                      "deployments": deps, "external_scaler_enabled": False}
    http = {k: v for k, v in applied.http_options.items() if k in ("host", "port", "request_timeout_s")}
    proxy = facts["proxy"]
    if proxy is not None and proxy["address"]:
        http.update(host=proxy["address"][0], port=proxy["address"][1])
    return {"controller_info": {"node_id": facts["head"], "actor_id": facts["controller"],
                                "actor_name": "rankcore-controller"},
            "proxy_location": applied.proxy_location,
            "http_options": http,
            "proxies": {n: {"node_id": n, "status": p["status"], "actor_name": p["actor_name"],
                            "actor_id": proxy["actor_id"] if proxy and p["actor_name"] == ingress.INGRESS_NAME
                            else None}
                        for n, p in view["proxies"].items()},
            "applications": apps, "target_capacity": None}


def _serve_names(conf: dict) -> dict:
    """A deployment entry with Ray Serve's keys only (ours, e.g. ``version``, left out: Ray Serve's
    ``DeploymentSchema`` refuses them)."""
    serve = {f.name for f in attrs.fields(cf.DeploymentConfig)} - {"options", "version"}
    return {k: v for k, v in conf.items() if k in serve}


def _serve_app(conf: dict) -> dict:
    return {**{k: v for k, v in conf.items() if k != "deployments"},
            "deployments": [_serve_names(d) for d in conf.get("deployments", [])]}
