"""Ray Serve's ``request_router_config`` read as a deployment's router (issue 68; docs/routing.md).

The router is the core's (``rankcore.requests.routing``): a deployment names one by
``request_router`` (with ``request_router_kwargs``), options declared once in
``rankcore.base.options.RequestOptions``. This module only reads Serve's spelling into those two
options, and makes a router of the user's own choosable in every process that routes:

* ``request_router_class`` a built-in router's name, or a class path Serve ships
  (``rankcore.requests.SERVE_ROUTERS``: its power-of-two-choices and ``PrefixCacheAffinityRouter``,
  whose keywords the core's routers take by Serve's names);
* or a class of the user's (an import path ``"module:Class"`` / ``"module.Class"``, or the class
  itself, defined at a module's top level) implementing ``rankcore.requests.Router``: its import
  path becomes its name, and each process imports it when it first routes (``ensure_router``),
  as Ray Serve imports its ``request_router_class``;
* a subclass of Serve's own ``RequestRouter`` (an async ``choose_replicas`` over Serve's
  ``RunningReplica`` objects) cannot run here: refused, naming docs/routing.md's hook table;
* Serve's other keys (routing stats period and timeout, backoff) are accepted and ignored: the
  core's router reads the machine's own counts, and a request no replica can take waits in the
  machine's queue instead of backing off.

And what a call carries for a router (facts, read as Serve reads them): its prompt (``prompt_text``),
the caller's node (``node_here``), and through the proxies its session key (``ROUTING_KEY_HEADER``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import ray

import rankcore as rc
from rankcore.requests import ROUTERS, SERVE_ROUTERS, register_router, serve_router

__all__ = ["IGNORED_KEYS", "ROUTING_KEY_HEADER", "from_request_router_config", "ensure_router", "node_here",
           "prompt_text", "routing_key_of"]

#: RequestRouterConfig's keys read by nothing here (module docstring)
IGNORED_KEYS = ("request_routing_stats_period_s", "request_routing_stats_timeout_s", "initial_backoff_s",
                "backoff_multiplier", "max_backoff_s")
_KEYS = ("request_router_class", "request_router_kwargs", *IGNORED_KEYS)
#: an HTTP request's header, and a gRPC call's metadata key, naming its session key: through the
#: proxies, the handle's ``options(routing_key=...)`` (what ``consistent_hash`` keeps on one replica;
#: a custom router reads it as ``RouteRequest.routing_key``). Ours: Ray Serve has none
ROUTING_KEY_HEADER = "x-routing-key"


def _fields(config: Any) -> dict[str, Any]:
    """A dict, or an object with Serve's attribute names (Serve's own ``RequestRouterConfig`` too)."""
    if isinstance(config, Mapping):
        return dict(config)
    return {k: getattr(config, k) for k in _KEYS if hasattr(config, k)}


def _refuse_serve_style(cls: Any, where: str) -> None:
    """A subclass of Ray Serve's own ``RequestRouter`` (module docstring) cannot run here."""
    if callable(getattr(cls, "choose_replicas", None)) and not callable(getattr(cls, "choose", None)):
        raise rc.InvalidConfig(f"{where}: {cls.__qualname__} is a Ray Serve RequestRouter (choose_replicas over "
                               f"Serve's replica objects, async): it cannot run on rankcore's request machine. "
                               f"Write it as a rankcore.requests.Router (choose / dispatched / forget): "
                               f"docs/routing.md maps each of Serve's hooks to one")


def _path_of(cls: type, where: str) -> str:
    """A user's router class by its import path, its name in every process that routes."""
    _refuse_serve_style(cls, where)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        raise rc.InvalidConfig(f"{where}: router class {cls.__qualname__} must be defined at the top level of an "
                               f"importable module (every process that routes imports it by its path)")
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(path: str, where: str) -> Any:
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise rc.InvalidConfig(f"{where}: cannot import router class {path!r} ({exc})") from None
    return obj


def ensure_router(name: str, where: str = "request_router") -> None:
    """Make ``name`` choosable in this process: a built-in or registered router as is; an import path
    of a user's router class imported and registered under that path."""
    if not name or name in ROUTERS:
        return
    if ":" not in name and "." not in name:
        return  # (an unknown plain name: make_router names the routers there are)
    cls = _import(name, where)
    if not callable(cls):
        raise rc.InvalidConfig(f"{where}: {name!r} is no router class (got {cls!r:.80})")
    _refuse_serve_style(cls, where)
    register_router(name, cls)


def from_request_router_config(config: Any, where: str) -> dict[str, Any]:
    """Serve's ``request_router_config`` (a dict, or an object with its fields) as the core's options
    ``request_router`` and ``request_router_kwargs``; ``InvalidConfig`` naming what is wrong (an
    unknown key, a class that is no router or cannot be imported). None: no options."""
    if config is None:
        return {}
    given = _fields(config)
    unknown = sorted(str(k) for k in given if k not in _KEYS)
    if unknown:
        raise rc.InvalidConfig(f"{where}: request_router_config has no key(s) {', '.join(unknown)} "
                               f"(keys: {', '.join(_KEYS)})")
    cls = given.get("request_router_class", next(iter(SERVE_ROUTERS)))
    kwargs = given.get("request_router_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise rc.InvalidConfig(f"{where}: request_router_config.request_router_kwargs must be a dict, got {kwargs!r:.80}")
    if isinstance(cls, type):
        name = _path_of(cls, where)
        if name not in ROUTERS:
            register_router(name, cls)
    else:
        if isinstance(cls, str) and cls not in SERVE_ROUTERS:
            ensure_router(cls, where)  # (a user's import path: imported and registered)
        try:
            name, kwargs = serve_router(cls, kwargs)
        except rc.InvalidConfig as exc:
            raise rc.InvalidConfig(f"{where}: {exc}") from None
    # (whether the router takes these keywords: the Deployment record checks it, as for request_router)
    return {"request_router": name, "request_router_kwargs": dict(kwargs)}


def routing_key_of(note: Mapping[str, Any] | None) -> str:
    """The session key a proxy read from a request's ``ROUTING_KEY_HEADER`` ("" none), from its note."""
    return "" if note is None else note.get("routing_key", "")


def node_here() -> str:
    """This process's Ray node id ("" outside Ray): a call's ``caller_node``."""
    try:
        return str(ray.get_runtime_context().get_node_id() or "")
    except Exception:  # (not connected: no locality to prefer)
        return ""


def _text(value: Any) -> str:
    """Ray Serve's ``PrefixCacheAffinityRouter._coerce_to_text``: a message's text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return value["text"]
        if "content" in value:
            return _text(value["content"])
    return ""


def prompt_text(args: tuple, kwargs: dict) -> str:
    """The prompt a call carries, as Ray Serve's ``PrefixCacheAffinityRouter`` reads it: the first
    argument with a ``prompt`` or ``messages`` attribute (a request object), or here also a dict with
    such a key or a ``prompt=`` / ``messages=`` keyword; its text (a string as is, a list of strings or
    of chat messages joined). "" when none: the router then has no prefix to match."""
    for arg in (*args, kwargs):
        for key in ("prompt", "messages"):
            got = arg.get(key) if isinstance(arg, dict) else getattr(arg, key, None)
            if got is not None:
                if isinstance(got, str):
                    return got
                return "".join(_text(m.get("content") if isinstance(m, dict) else m) for m in got) \
                    if isinstance(got, list) else ""
    return ""
