"""The user API, close to Ray Serve's: ``@deployment``, ``.bind()``, ``run()``,
``handle.remote(...).result()``, ``handle.scale(n)``."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, cast, overload

import attrs
import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

import rankcore as rc
from rankcore.requests import make_router

from ..base import by_value, grpc_context
from ..base.autoscale import from_ray_serve
from ..base.context import RequestContext, request_for_call
from ..base.fingerprint import stamp
from ..base.router import LONG_POLL_RETRY_S, LONG_POLL_S, Call, Router, idempotent
from ..base.routers import ensure_router, from_request_router_config
from ..control.controller import CORE_OPTIONS, controller_actor
from ..control.placement import actor_resources, static_actor_options
from ..control.placement import validate as validate_placement
from ..control.static import StaticPlacementConfig

__all__ = ["deployment", "Deployment", "Application", "run", "DeploymentHandle", "DeploymentResponse",
           "get_controller", "get_deployment_handle", "ask", "ReplicaDiedError", "RAY_ACTOR_OPTIONS",
           "validate_options", "delete", "sleep", "wake", "push_weights", "wait_serving", "weights_status", "book_memory",
           "tiers_status", "idempotent", "LONG_POLL_S", "LONG_POLL_RETRY_S", "DeploymentResponseGenerator"]

#: the keys ``ray_actor_options`` may hold: Ray Serve 2.60's list (the rest of
#: an actor's options, its name, lifetime, restarts, concurrency and placement,
#: are rankcore's to set)
RAY_ACTOR_OPTIONS = ("accelerator_type", "memory", "num_cpus", "num_gpus", "resources", "runtime_env",
                     "label_selector")


#: the core's option defaults (rankcore.base.options): the keywords of its own that spell options
#: (replica_placement, gang_*) default to them
_D = rc.options.DEFAULTS


#: Ray Serve's rule: a strategy places the bundles a deployment gives (without them there is none to place)
_STRATEGY_ALONE = "placement_group_strategy is given, so placement_group_bundles must be given too (as in Ray Serve)"


class OptionTypeError(rc.InvalidConfig, TypeError):
    """An option of the wrong type, or one no deployment takes: ``rankcore.InvalidConfig`` as every bad
    option, and the ``TypeError`` Ray Serve's decorator raises for it (an unexpected keyword argument,
    a ``ray_actor_options`` that is no dict ...), so a ported ``except TypeError`` still catches it."""


def _bad(name: Any, what: str, kind: type[rc.InvalidConfig] = rc.InvalidConfig) -> rc.InvalidConfig:
    # the core names its record ("DeploymentApplied('x').num_replicas"); here the option is the name
    what = re.sub(r"DeploymentApplied(\([^)]*\))?(\.|: )", "", what)
    return kind(f"deployment {name!r}: {what}")


def validate_options(d: Deployment) -> None:
    """Check every option of a deployment where it is written (``@deployment``,
    ``.options``), with the core's own rules: raise ``rankcore.InvalidConfig``
    naming the option and the value, instead of failing later inside ``run()``."""
    if not isinstance(d.cls, type):
        raise _bad(d.name, f"@deployment takes a class, got {d.cls!r}")
    sp = d.static_placement
    if sp is not None:
        _check_static(d, sp)
    try:  # name, num_replicas, max_replicas, static placement, gangs: exactly as the core will see them
        rc.DeploymentApplied(name=d.name, num_replicas=d.num_replicas, max_replicas=d.max_replicas,
                             static_placement=sp.to_core(None) if sp is not None else None, gang_size=d.gang_size,
                             gang_placement=d.gang_placement, gang_failure=d.gang_failure, version=d.version)
    except rc.InvalidConfig as exc:
        raise _bad(d.name, str(exc)) from None
    _check_user_config(d.name, d.user_config)
    opts = d.ray_actor_options
    if not isinstance(opts, dict):
        raise _bad(d.name, f"ray_actor_options must be a dict, got {opts!r}", OptionTypeError)
    try:  # (placement first: it explains why scheduling_strategy and placement_group are refused)
        validate_placement(opts, d.placement_group_bundles, d.placement_group_strategy, d.replica_placement)
    except rc.InvalidConfig as exc:
        raise _bad(d.name, str(exc), OptionTypeError if isinstance(exc, TypeError) else rc.InvalidConfig) from None
    except (TypeError, AttributeError):
        pass  # a malformed option: named below
    unknown = sorted(str(k) for k in opts if k not in RAY_ACTOR_OPTIONS)
    if unknown:
        raise _bad(d.name, f"ray_actor_options may not set {', '.join(map(repr, unknown))} (allowed: "
                           f"{', '.join(RAY_ACTOR_OPTIONS)})")
    from ray._common import ray_option_utils

    try:  # Ray's own checks of each option's type and value
        ray_option_utils.validate_actor_options(dict(opts), in_options=True)
    except (TypeError, ValueError) as exc:
        raise _bad(d.name, f"ray_actor_options: {exc}",
                   OptionTypeError if isinstance(exc, TypeError) else rc.InvalidConfig) from None


def _check_static(d: Deployment, sp: Any) -> None:
    """A static deployment: a ``StaticPlacementConfig`` (checked when it was
    made), its replica count the mapping's, no placement options of rankcore's
    own groups, and a replica actor that fits in each rank's first bundle."""
    if not isinstance(sp, StaticPlacementConfig):
        raise _bad(d.name, f"static_placement must be a StaticPlacementConfig(placement_group, "
                           f"replica_bundle_mapping), got {sp!r:.80}")
    if d.num_replicas != sp.num_replicas:
        raise _bad(d.name, f"num_replicas={d.num_replicas!r}, but static_placement's replica_bundle_mapping maps "
                           f"{sp.num_replicas} ranks (a static deployment's replica count is the mapping's length: "
                           f"leave num_replicas out)")
    mine = [k for k, v, default in (("placement_group_bundles", d.placement_group_bundles, None),
                                    ("placement_group_strategy", d.placement_group_strategy, "PACK"),
                                    ("replica_placement", d.replica_placement, "spread")) if v != default]
    if mine:
        raise _bad(d.name, f"{', '.join(mine)} cannot be set with static_placement: its replicas run on the "
                           f"bundles of your placement group that replica_bundle_mapping names")
    if d.gang_size != 1:
        raise _bad(d.name, f"static_placement and gang_size={d.gang_size!r} do not mix (a static mapping already "
                           f"fixes where every rank runs)")
    if isinstance(d.ray_actor_options, dict):
        try:
            need = actor_resources(static_actor_options(d.ray_actor_options))
        except (TypeError, ValueError):
            return  # a malformed option: named by the checks of ray_actor_options
        try:
            sp.check_actor_fits(need)
        except rc.InvalidConfig as exc:
            raise _bad(d.name, str(exc)) from None


def _check_user_config(name: str, config: Any) -> None:
    """user_config travels to the controller, to its KV store and to every
    replica pickled, and a restarted controller compares the copy a replica
    reports with the deployment's to find replicas that missed an update: it
    must pickle, and its copy must equal it."""
    if config is None:
        return
    from ray import cloudpickle

    try:
        copy = cloudpickle.loads(cloudpickle.dumps(config))
    except Exception as exc:
        raise _bad(name, f"user_config cannot be serialised ({type(exc).__name__}: {exc}): "
                         f"got {config!r:.80}") from None
    try:
        same = bool(copy == config)
    except Exception:
        same = False
    if not same:
        raise _bad(name, f"user_config must equal a pickled copy of itself (use plain data: dicts, lists, "
                         f"strings, numbers), got {config!r:.80}")


@attrs.frozen
class Deployment:
    cls: type
    name: str
    num_replicas: int = 1
    user_config: Any = attrs.field(default=None, eq=False)
    ray_actor_options: dict = attrs.field(factory=dict, eq=False)
    placement_group_bundles: Any = attrs.field(default=None, eq=False)
    placement_group_strategy: str = "PACK"
    replica_placement: str = _D.placement
    max_replicas: int = rc.DEFAULT_MAX_REPLICAS
    static_placement: Any = attrs.field(default=None, eq=False)
    gang_size: int = _D.gang_size
    gang_placement: str = _D.gang_placement
    gang_failure: str = _D.gang_failure
    #: the code's version (``rankcore.base.options.RolloutOptions``): a new one rolls every replica,
    #: the same one rolls nothing; None: ``run()`` gives a fingerprint of what the replicas run (the
    #: class, the project modules loaded, the bind arguments: ``fingerprint.stamp``; docs/rollouts.md)
    version: str | None = _D.version
    #: the options Ray takes as is (``CORE_OPTIONS``: ``rankcore.base.options.as_is("ray")``, Ray
    #: Serve's names and defaults: health checks, graceful shutdown, timeouts, restart backoff,
    #: spare processes), only those given: ``DeploymentApplied`` has the defaults
    core_options: dict = attrs.field(factory=dict, eq=False)

    def __attrs_post_init__(self) -> None:
        validate_options(self)
        try:  # checked by the core's own record, where they are written
            applied = rc.DeploymentApplied(name="x", num_replicas=0, **self.core_options)
            if applied.config.request_router:  # (the router named must exist and take its keywords)
                ensure_router(applied.config.request_router)
                make_router(applied.config.request_router, dict(applied.config.request_router_kwargs))
        except rc.InvalidConfig as exc:
            raise _bad(self.name, str(exc)) from None

    @property
    def max_ongoing_requests(self) -> int:
        """(declared once, in ``rankcore.base.options.RequestOptions``: given in ``core_options``)"""
        return int(self.core_options.get("max_ongoing_requests", rc.options.DEFAULTS.max_ongoing_requests))

    @property
    def max_queued_requests(self) -> int:
        return int(self.core_options.get("max_queued_requests", rc.options.DEFAULTS.max_queued_requests))

    @property
    def placement(self) -> dict:
        return {"placement_group_bundles": self.placement_group_bundles,
                "placement_group_strategy": self.placement_group_strategy,
                "replica_placement": self.replica_placement, "static": self.static_placement,
                "gang_size": self.gang_size, "gang_placement": self.gang_placement,
                "gang_failure": self.gang_failure}

    def options(self, **changes: Any) -> Deployment:
        """A copy with some options changed (checked as ``@deployment`` checks them).
        A new ``static_placement`` (or ``_placement_info``) brings its mapping's
        replica count unless ``num_replicas`` is given too; ``autoscaling_config`` (or
        ``num_replicas="auto"``) as ``@deployment`` takes it; ``request_router`` given without
        ``request_router_kwargs`` starts the new router from its own defaults (as Serve's
        ``request_router_config``, which names both)."""
        if "_placement_info" in changes:
            if "static_placement" in changes:
                raise _bad(self.name, ".options() takes static_placement or its alias _placement_info, not both")
            changes["static_placement"] = changes.pop("_placement_info")
        if "request_router_config" in changes:  # (Ray Serve's spelling of the core's request_router options)
            changes.update(from_request_router_config(changes.pop("request_router_config"),
                                                      f"deployment {self.name!r}"))
        auto = _autoscaled(self.name, changes.get("num_replicas"), changes.pop("autoscaling_config", None),
                           changes.get("max_replicas"))
        if auto is not None:  # (as @deployment takes them: an option given beside the config wins)
            changes = {**auto, **changes, "num_replicas": auto["num_replicas"], "max_replicas": auto["max_replicas"]}
        core = {k: changes.pop(k) for k in list(changes) if k in CORE_OPTIONS}
        if "request_router" in core and self.core_options.get("request_router_kwargs"):
            core.setdefault("request_router_kwargs", {})  # (a router named anew starts from its own keywords)
        if core:
            changes["core_options"] = {**self.core_options, **core}
        known = ({f.name for f in attrs.fields(Deployment)} - {"cls", "core_options"}) | set(CORE_OPTIONS) \
            | {"autoscaling_config", "request_router_config"}
        bad = sorted(set(changes) - known - {"core_options"})
        if bad:
            raise _bad(self.name, f".options() does not take {', '.join(bad)} (options: {', '.join(sorted(known))})")
        if changes.get("placement_group_strategy") is not None and \
                changes.get("placement_group_bundles", self.placement_group_bundles) is None:
            raise _bad(self.name, _STRATEGY_ALONE)
        sp = changes.get("static_placement")
        if isinstance(sp, StaticPlacementConfig) and "num_replicas" not in changes:
            changes["num_replicas"] = sp.num_replicas
        return attrs.evolve(self, **changes)

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        return Application(self, args, kwargs)


@attrs.frozen
class Application:
    deployment: Deployment
    args: tuple
    kwargs: dict = attrs.field(eq=False)

    def graph(self) -> list[Deployment]:
        """The deployments of this application's graph (bound ones among its arguments, at any
        depth, inside any object: ``map_bound``), each once by name, its ingress first."""
        out: dict[str, Deployment] = {}

        def walk(a: Application) -> Application:
            if a.deployment.name not in out:
                out[a.deployment.name] = a.deployment
                map_bound((a.args, a.kwargs), walk)
            return a

        walk(self)
        return list(out.values())


_PLAIN = (str, bytes, int, float, bool, type(None))
_scan_table = threading.local()


def _bound_at(i: int) -> Any:
    """(unpickling ``map_bound``'s copy) what replaces the ``i``-th bound deployment found."""
    return _scan_table.replacements[i]


def map_bound(x: Any, fn: Callable[[Application], Any]) -> Any:
    """``x`` with each bound deployment (``Application``) in it replaced by ``fn(it)``, at any depth:
    in lists, tuples, dicts and any other object, as Serve's ``_PyObjScanner`` finds them (an object
    is pickled to find them and, when one is there, rebuilt with the replacements; else ``x`` itself
    is returned, not a copy). An object that does not pickle holds none that could be sent: as is."""
    if isinstance(x, Application):
        return fn(x)
    if isinstance(x, (*_PLAIN, DeploymentHandle)):
        return x
    if type(x) in (list, tuple):
        items = [map_bound(i, fn) for i in x]
        return x if all(a is b for a, b in zip(items, x)) else type(x)(items)
    if type(x) is dict:
        values = {k: map_bound(v, fn) for k, v in x.items()}
        return x if all(values[k] is v for k, v in x.items()) else values
    import io
    import pickle

    from ray import cloudpickle

    found: list[Application] = []

    class Scanner(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, Application):
                found.append(obj)
                return _bound_at, (len(found) - 1,)
            return super().reducer_override(obj)

    buf = io.BytesIO()
    try:
        Scanner(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(x)
    except Exception:
        return x
    if not found:
        return x
    _scan_table.replacements = [fn(a) for a in found]
    try:
        return pickle.loads(buf.getvalue())
    finally:
        _scan_table.replacements = None


@overload
def deployment(cls: type, *, name: str | None = ..., num_replicas: int | str | None = ..., user_config: Any = ...,
               ray_actor_options: dict | None = ...,
               placement_group_bundles: list[dict] | None = ..., placement_group_strategy: str | None = ...,
               replica_placement: str = ..., max_replicas: int = ...,
               static_placement: StaticPlacementConfig | None = ..., _placement_info: StaticPlacementConfig | None = ...,
               gang_size: int = ..., gang_placement: str = ..., gang_failure: str = ...,
               autoscaling_config: dict | None = ..., version: str | None = ...,
               request_router_config: Any = ..., **core_options: Any) -> Deployment: ...
@overload
def deployment(cls: None = None, *, name: str | None = ..., num_replicas: int | str | None = ..., user_config: Any = ...,
               ray_actor_options: dict | None = ...,
               placement_group_bundles: list[dict] | None = ..., placement_group_strategy: str | None = ...,
               replica_placement: str = ..., max_replicas: int = ...,
               static_placement: StaticPlacementConfig | None = ..., _placement_info: StaticPlacementConfig | None = ...,
               gang_size: int = ..., gang_placement: str = ..., gang_failure: str = ...,
               autoscaling_config: dict | None = ..., version: str | None = ...,
               request_router_config: Any = ..., **core_options: Any) -> Callable[[type], Deployment]:
    ...
def deployment(cls: type | None = None, *, name: str | None = None, num_replicas: int | str | None = None,
               user_config: Any = None, ray_actor_options: dict | None = None,
               placement_group_bundles: list[dict] | None = None, placement_group_strategy: str | None = None,
               replica_placement: str = _D.placement, max_replicas: int = rc.DEFAULT_MAX_REPLICAS,
               static_placement: StaticPlacementConfig | None = None,
               _placement_info: StaticPlacementConfig | None = None, gang_size: int = _D.gang_size,
               gang_placement: str = _D.gang_placement,
               gang_failure: str = _D.gang_failure, autoscaling_config: dict | None = None,
               version: str | None = _D.version, request_router_config: Any = None,
               **core_options: Any) -> Deployment | Callable[[type], Deployment]:
    """Turn a class into a deployment (``@deployment`` or ``@deployment(num_replicas=4, ...)``).

    Each replica reserves its resources in its own placement group and runs in
    its first bundle: by default one bundle of what ``ray_actor_options`` asks
    for (``num_cpus`` defaults to 1); ``placement_group_bundles`` (with
    ``placement_group_strategy``) adds bundles for the replica's own workers.
    ``replica_placement`` spreads replicas over nodes (default) or packs them.
    ``max_replicas`` caps ``num_replicas`` and every later ``handle.scale``.

    ``static_placement`` (alias ``_placement_info``, the RFC's name): a
    ``StaticPlacementConfig`` of your placement group and
    ``replica_bundle_mapping``; rank N runs on the first of its bundles, the
    replica count is the mapping's length (``num_replicas`` defaults to it)
    and ``handle.scale`` refuses. ``gang_size`` k: gangs of k replicas on
    consecutive ranks, placed all or nothing (``gang_placement``: ``pack`` or
    ``spread``), failing whole (``gang_failure="restart_gang"``) or member by
    member (``"restart_replica"``); ``num_replicas`` a multiple of k.
    ``core_options``: the core's options Ray takes as is (``CORE_OPTIONS``,
    declared once in ``rankcore.base.options`` with Ray Serve's names and defaults:
    health checks, graceful shutdown, ``start_timeout_s``, ``placement_timeout_s``,
    restart backoff, ``spare_processes``; the table in docs/ray.md is generated
    from there). Every option is checked here (``rankcore.InvalidConfig``
    naming it; an unknown one is refused, listing the options).
    ``autoscaling_config`` (and ``num_replicas="auto"``), as Ray Serve takes them: the core's
    autoscaling options (``autoscale.from_ray_serve``; the routers feed it: docs/autoscaling.md).
    ``version`` (Ray Serve's): a new one makes ``run()`` replace every replica, each by one on its
    ranks (a rolling update); the same one replaces nothing, even if the code changed. Left out,
    ``run()`` uses a fingerprint of what the replicas run (``fingerprint.stamp``; docs/rollouts.md).
    ``request_router_config`` (Ray Serve's: a dict or a ``RequestRouterConfig``): the deployment's
    router, the core's ``request_router`` options (``routers.from_request_router_config``; docs/routing.md).
    """
    unknown = sorted(set(core_options) - set(CORE_OPTIONS))
    if unknown:
        where = f"deployment {name!r}" if name else "@deployment(...)"
        raise OptionTypeError(f"{where}: unknown option(s) {', '.join(unknown)} (the core's options: "
                              f"{', '.join(CORE_OPTIONS)})")
    routed = from_request_router_config(request_router_config, f"deployment {name!r}" if name else "@deployment(...)")
    core_options = {**routed, **core_options}
    auto = _autoscaled(name, num_replicas, autoscaling_config,
                       None if max_replicas == rc.DEFAULT_MAX_REPLICAS else max_replicas)
    if auto is not None:
        num_replicas, max_replicas = auto.pop("num_replicas"), auto.pop("max_replicas")
        core_options = {**auto, **core_options}
    if cls is not None and not isinstance(cls, type):
        raise _bad(name or getattr(cls, "__name__", cls), f"@deployment takes a class, got {cls!r}")
    if static_placement is not None and _placement_info is not None:
        raise _bad(name or "@deployment(...)", "give static_placement or its alias _placement_info, not both")
    static = static_placement if static_placement is not None else _placement_info
    if placement_group_strategy is not None and placement_group_bundles is None:
        raise rc.InvalidConfig(f"{f'deployment {name!r}' if name else '@deployment(...)'}: {_STRATEGY_ALONE}")
    strategy = "PACK" if placement_group_strategy is None else placement_group_strategy
    count = cast(int, num_replicas) if num_replicas is not None else \
        static.num_replicas if isinstance(static, StaticPlacementConfig) else 1

    def wrap(c: type) -> Deployment:
        opts = dict(ray_actor_options) if isinstance(ray_actor_options, dict) else \
            ray_actor_options if ray_actor_options is not None else {}
        c = grpc_context.attach(c)  # (a method taking grpc_context gets Serve's context over gRPC)
        return Deployment(cls=c, name=name if name is not None else getattr(c, "__name__", ""),
                          num_replicas=count, user_config=user_config, ray_actor_options=opts,
                          placement_group_bundles=placement_group_bundles,
                          placement_group_strategy=strategy, replica_placement=replica_placement,
                          max_replicas=max_replicas, static_placement=static, gang_size=gang_size,
                          gang_placement=gang_placement, gang_failure=gang_failure, version=version,
                          core_options=dict(core_options))

    if cls is None:  # @deployment(...): check the options now, before a class is given
        if isinstance(name, str) and name:
            wrap(type(name, (), {}))
            return wrap
        try:
            wrap(type("decorated_class", (), {}))
        except rc.InvalidConfig as exc:  # no name yet: say where the option was written
            raise type(exc)(str(exc).replace("deployment 'decorated_class': ", "@deployment(...): ", 1)) from None
        return wrap
    return wrap(cls)


def _autoscaled(name: Any, num_replicas: Any, config: Any, max_replicas: int | None) -> dict | None:
    """Ray Serve's ``autoscaling_config`` / ``num_replicas="auto"`` as the fields ``@deployment`` and
    ``.options()`` set (``autoscale.from_ray_serve``: ``num_replicas``, ``max_replicas``, the core's
    flat autoscaling options), or None when not autoscaled. ``max_replicas``: the one given beside
    it, if any; the config's own wins, else Ray Serve's default."""
    count, auto = from_ray_serve(name, num_replicas, config)
    if count is None:
        return None
    if max_replicas is not None and "max_replicas" not in (config or {}):
        auto["max_replicas"] = max_replicas
    return {**auto, "num_replicas": count}


def get_controller() -> Any:
    """The controller actor, started (detached, restartable) if it is not running
    (``control.controller.controller_actor``: on the head node, as Ray Serve's)."""
    return controller_actor()


def get_deployment_handle(name: str) -> DeploymentHandle:
    """A handle to deployment ``name`` (from any process of the cluster: a
    trainer actor pushing weights to its inference replicas, say)."""
    return DeploymentHandle(name, get_controller())


def ask(controller: Any, method: str, *args: Any, timeout: float = 60.0) -> Any:
    """Call the controller, waiting out a restart (Ray restarts it after a crash)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(getattr(controller, method).remote(*args), timeout=timeout)
        except RayTaskError as exc:
            if isinstance(exc.cause, rc.RankcoreError):  # the core's own typed error, as raised there
                raise exc.cause from None
            raise
        except (ActorUnavailableError, RayActorError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            controller = get_controller()


def run(app: Application, *, timeout: float = 120.0, route_prefix: str | None = None, http: bool = False,
        port: int | None = None) -> DeploymentHandle:
    """Deploy (or update in place) and wait until every replica serves.

    HTTP (``http=True``, or a ``route_prefix`` or ``port`` given): the ingress
    (started if need be, ``port`` default 8000) routes ``route_prefix`` (default
    ``/<name>``) to ``app``'s deployment (executors/ray_gpu/ingress/http.py).

    Composition: a bound deployment among ``app``'s arguments
    (``Ingress.bind(Model.bind())``) is deployed first, and the constructor
    gets a ``DeploymentHandle`` to it in its place (calls between deployments
    take the same request path). Two different deployments of one name in an
    application are refused (``rankcore.InvalidConfig``)."""
    ctl = get_controller()
    seen: dict[str, Deployment] = {}
    _deploy(app, ctl, timeout, seen)
    handle = DeploymentHandle(app.deployment.name, ctl)
    from ..ingress.http import expose, refresh_methods

    if http or route_prefix is not None or port is not None:
        expose(handle, route_prefix, port)
    refresh_methods(seen)  # (new code under a route it keeps: the methods HTTP and gRPC may call)
    return handle


def _deploy(app: Application, ctl: Any, timeout: float, seen: dict[str, Deployment],
            wait: bool = True) -> DeploymentHandle:
    """Apply ``app``'s deployments, those it binds first; ``wait``: each healthy before the next
    (``run``); else applied only (``api.apps.apply_config``, as Ray Serve's deploy returns at once)."""
    d = app.deployment
    if d.name in seen:
        if seen[d.name] is not d:
            raise rc.InvalidConfig(f"run(): two different deployments named {d.name!r} in one application")
        return DeploymentHandle(d.name, ctl)
    seen[d.name] = d

    def inner(a: Application) -> DeploymentHandle:  # (a bound deployment at any depth: deployed, its handle there)
        return _deploy(a, ctl, timeout, seen, wait)

    args, kwargs = map_bound(app.args, inner), map_bound(app.kwargs, inner)
    ask(ctl, "apply", d.name, d.num_replicas, d.user_config, d.cls, args, kwargs,
        d.ray_actor_options, d.max_ongoing_requests, d.placement, d.max_replicas, d.core_options,
        *stamp(d.version, d.cls, args, kwargs))  # (here, where the code was imported: not the controller)
    if wait and not ask(ctl, "wait_healthy", d.name, timeout, timeout=timeout + 30):
        raise TimeoutError(f"deployment {d.name!r} not healthy after {timeout:g}s")
    return DeploymentHandle(d.name, ctl)


# ------------------------------------------------------ sleep, wake, weights (issue 21)
def _weights_ref(state_dict: Any, name: str = "", version: int = 0) -> list | None:
    """``[ray.put(state_dict)]`` (in a list: the controller passes the reference on unresolved);
    for a ``WeightsShare`` (``shared_weights``), ``[its handle]``: no bytes travel."""
    if state_dict is None:
        return None
    shared = sys.modules.get("executors.ray_gpu.weights.shared")  # (not imported: it cannot be a share)
    if shared is not None and isinstance(state_dict, shared.WeightsShare):
        return [_share_handle(state_dict, name, version)]
    if not hasattr(state_dict, "items"):
        raise TypeError(f"weights must be a state_dict (a mapping of names to tensors), got {type(state_dict).__name__}")
    return [ray.put(dict(state_dict))]


def _share_handle(share: Any, name: str, version: int) -> Any:
    """The handle of a share holding ``version``; with a CPU copy in the object store (``fallback``)
    when a replica of ``name`` runs on another node than the share's."""
    held = share.version
    if held != version:
        raise rc.InvalidEvent(f"push of version {version} to {name!r} by a share that holds "
                              f"{'a write under way' if held < 0 else f'version {held}'}: "
                              f"share.write(state_dict, {version}) first")
    handle = share.handle
    elsewhere = [n for n in ask(get_controller(), "replica_nodes", name) if n != handle.node_id]
    if elsewhere:
        handle = attrs.evolve(handle, fallback=ray.put(share.cpu_state_dict()))
    return handle


def delete(name: str, *, wait: bool = True, timeout: float = 60.0) -> None:
    """Delete deployment ``name`` and leave the others be (Ray Serve's ``serve.delete``): its
    replicas finish what they hold and stop, requests still waiting for it fail with
    ``Unavailable`` (503), its HTTP route goes at once (404). ``wait``: return once the core
    has forgotten it (else TimeoutError). An unknown name raises ``InvalidEvent``."""
    from ..ingress.http import unexpose

    ctl = get_controller()
    ask(ctl, "delete", name)
    unexpose(name)  # (a request for it is a 404 from now on, as after serve.delete)
    if wait and not ask(ctl, "wait_deleted", name, timeout, timeout=timeout + 30):
        raise TimeoutError(f"deployment {name!r} not deleted after {timeout:g}s (its replicas still stopping)")


def sleep(name: str, *, wait: bool = True, timeout: float = 120.0) -> None:
    """Put deployment ``name`` to sleep (RL: the trainer needs the GPUs): each replica's weights
    go to CPU memory; its process, ranks, bundle and world_size are kept, and it serves no
    call until it wakes. ``wait``: return once every replica is asleep (else TimeoutError)."""
    ctl = get_controller()
    ask(ctl, "sleep", name)
    if wait and not ask(ctl, "wait_asleep", name, timeout, timeout=timeout + 30):
        raise TimeoutError(f"deployment {name!r} not asleep after {timeout:g}s")


def push_weights(name: str, state_dict: Any, version: int, *, wait: bool = False, timeout: float = 120.0) -> None:
    """New weights ``state_dict`` (same names, shapes and dtypes as the class's own) as
    ``version`` (above every earlier one) for every replica of ``name``: written in place
    wherever each one's weights are (on its device, or in CPU memory while asleep); a replica
    starting meanwhile gets them once ready, one started later loads them at start. None for a
    class that holds no weights (the version only). A ``WeightsShare`` (``share_weights``,
    holding ``version``: ``share.write`` first) sends only its handle: the replicas on its node
    copy from its memory (opened once), others from a copy in the object store.
    ``wait``: return once every replica serves them (a sleeping deployment never does: wake it)."""
    ctl = get_controller()
    ask(ctl, "push_weights", name, version, _weights_ref(state_dict, name, version))
    if wait:
        wait_serving(name, timeout)


def wake(name: str, *, weights_version: int | None = None, state_dict: Any = None, wait: bool = True,
         timeout: float = 120.0) -> None:
    """Wake deployment ``name``: each sleeper's weights back on its device. With
    ``weights_version`` newer than the last pushed, wake with those weights (``state_dict``,
    as ``push_weights`` takes them). ``wait``: return once every replica serves."""
    if state_dict is not None and weights_version is None:
        raise rc.InvalidEvent(f"wake({name!r}): a state_dict needs its weights_version")
    ctl = get_controller()
    ask(ctl, "wake", name, weights_version, _weights_ref(state_dict, name, weights_version or 0))
    if wait:
        wait_serving(name, timeout)


def wait_serving(name: str, timeout: float = 120.0) -> None:
    """Return once ``name`` is healthy, awake and every replica serves the last weights pushed."""
    if not ask(get_controller(), "wait_serving", name, timeout, timeout=timeout + 30):
        raise TimeoutError(f"deployment {name!r} not serving after {timeout:g}s")


def weights_status(name: str) -> dict:
    """Per replica: its weights' tier, version and bytes as the replica says, and what the core holds."""
    return ask(get_controller(), "weights_status", name)


def book_memory(gpu_memory: Any = "cuda", cpu_cache: Any = 0, *, cold_dir: str | None = None,
                timeout: float = 120.0) -> list:
    """Memory-booked placement (issue 21; docs/ray.md, "GPU memory, eviction and the warm cache"):
    from now on each node with GPUs tells the core each GPU's memory (``gpu_memory``: ``"cuda"``,
    read on the node; bytes per GPU; a list, one per GPU; or a mapping per node id or node name
    label, ``"*"`` for the rest) and the CPU memory it keeps WARM copies in (``cpu_cache``: bytes,
    or such a mapping). Deployments with ``model_bytes`` are then booked on GPUs by memory,
    evicting others. ``cold_dir``: each node's directory for COLD files. Call it before the first
    ``run()`` (or after a reset); ``book_memory(None)`` turns it off. Returns each node as
    declared: (node id, devices, cpu cache bytes)."""
    from ..control.memory import MemoryBooking

    booking = None if gpu_memory is None else MemoryBooking.make(gpu_memory, cpu_cache, cold_dir)
    return ask(get_controller(), "book_memory", booking, timeout=timeout)


def tiers_status() -> dict:
    """The tier moves the controller carried out (evictions, starts from WARM or COLD, dropped
    copies: ``log``) and each node's WARM cache (``caches``)."""
    return ask(get_controller(), "tiers_status")


_ROUTERS: dict[tuple[str, str], Router] = {}
_ROUTERS_LOCK = threading.Lock()


def router_for(name: str, controller: Any) -> Router:
    """The one router of deployment ``name`` under this controller in this
    process: every handle made for it (``get_deployment_handle``, an unpickled
    handle) shares its request machine, its replicas and its one long poll, so
    a caller making a handle per request does not leave a poll per handle open
    on the controller (whose concurrency is bounded)."""
    actor_id = getattr(controller, "_actor_id", None)
    key = (actor_id.hex() if actor_id is not None else str(id(controller)), name)
    with _ROUTERS_LOCK:
        router = _ROUTERS.get(key)
        if router is None:
            router = _ROUTERS[key] = Router(name, controller, ask)
        return router


class DeploymentHandle:
    """Sends calls through the deployment's request path (``router.Router``: a
    ``rankcore.requests.RequestMachine``): at most ``max_ongoing_requests`` in
    flight per replica, queued beyond that up to ``max_queued_requests``
    (``rankcore.Overloaded`` past it), a call whose replica died runs again
    only if its method is ``@idempotent``. The handles ``handle.method`` makes
    share this one's router."""

    def __init__(self, name: str, controller: Any, method: str = "__call__", router: Router | None = None,
                 stream: bool = False, progress: bool = False, multiplexed_model_id: str = "",
                 by_reference: bool | None = None, routing_key: str = "") -> None:
        self.name, self.controller, self.method, self.stream = name, controller, method, stream
        self.routing_key = routing_key  # (its calls' session key: the consistent_hash router's)
        self.progress = progress
        self.multiplexed_model_id = multiplexed_model_id
        #: False: its plain calls go over the replica's gRPC server (``by_value``); None: the process's
        #: default (``by_value.HANDLE_BY_REFERENCE``, from ``RAY_SERVE_USE_GRPC_BY_DEFAULT``)
        self.by_reference = by_reference
        self._router = router if router is not None else router_for(name, controller)

    def __getattr__(self, method: str) -> DeploymentHandle:
        if method.startswith("_"):
            raise AttributeError(method)
        return DeploymentHandle(self.name, self.controller, method, self._router, self.stream, self.progress,
                                self.multiplexed_model_id, self.by_reference, self.routing_key)

    def __reduce__(self) -> tuple:
        # sent to another process (a trainer actor, an ingress deployment): it routes on its own
        return DeploymentHandle, (self.name, self.controller, self.method, None, self.stream, self.progress,
                                  self.multiplexed_model_id, self.by_reference, self.routing_key)

    def _by_reference(self) -> bool:
        return by_value.HANDLE_BY_REFERENCE if self.by_reference is None else self.by_reference

    def knows_pool(self) -> bool:
        """Whether the router has had the controller's pool once (``remote`` and ``is_stream`` then
        never block: the HTTP ingress calls them on its event loop)."""
        return self._router.version is not None

    def replicas_populated(self) -> bool:
        """Whether the controller has named a serving replica of the deployment to this handle's router
        once (Serve's ``running_replicas_populated``: a worker's proxy is ready for traffic once one of
        its handles is). May ask the controller the first time."""
        self._router.refresh()
        return self._router.populated

    def is_stream(self, method: str | None = None) -> bool:
        """Whether ``method`` (this handle's by default) is a generator method of the deployment's class
        (call it with ``options(stream=True)``). May ask the controller the first time."""
        self._router.refresh()
        return (method or self.method) in self._router.streams

    def options(self, *, stream: bool | None = None, method_name: str | None = None,
                progress: bool | None = None, multiplexed_model_id: str | None = None,
                _by_reference: bool | None = None, routing_key: str | None = None) -> DeploymentHandle:
        """A handle with other call options: ``stream=True`` for a generator method (its calls return
        a ``DeploymentResponseGenerator``), ``method_name`` (as Ray Serve's), ``progress=True`` for
        calls whose ``status()`` says ``running`` while the replica runs them (plain calls never do:
        the replica does not report their start; router.py), ``multiplexed_model_id`` (Serve's): the
        model its calls name, routed to a replica that holds it ("" none; a bad one raises
        ``rankcore.InvalidConfig``), ``_by_reference`` (Serve's): False sends its plain calls over the
        replica's gRPC server instead of a Ray actor call, True as a Ray call (``base.by_value``; default
        True, or False where ``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``), ``routing_key`` (ours): its calls'
        session key, which the ``consistent_hash`` router keeps on one replica (docs/routing.md)."""
        if _by_reference is not None and type(_by_reference) is not bool:
            raise rc.InvalidConfig(f"handle.options(_by_reference=...) of {self.name!r} must be a bool, "
                                   f"got {type(_by_reference).__name__} {_by_reference!r}")
        if multiplexed_model_id is not None and type(multiplexed_model_id) is not str:
            raise rc.InvalidConfig(f"handle.options(multiplexed_model_id=...) of {self.name!r} must be a str, "
                                   f"got {type(multiplexed_model_id).__name__} {multiplexed_model_id!r}")
        if routing_key is not None and type(routing_key) is not str:
            raise rc.InvalidConfig(f"handle.options(routing_key=...) of {self.name!r} must be a str, "
                                   f"got {type(routing_key).__name__} {routing_key!r}")
        return DeploymentHandle(self.name, self.controller, method_name or self.method, self._router,
                                self.stream if stream is None else bool(stream),
                                self.progress if progress is None else bool(progress),
                                self.multiplexed_model_id if multiplexed_model_id is None else multiplexed_model_id,
                                self.by_reference if _by_reference is None else _by_reference,
                                self.routing_key if routing_key is None else routing_key)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Send the call; returns at once. A ``DeploymentResponse`` among the arguments is passed
        on as its result (the call waits for it, the caller does not). With ``stream=True``: a
        ``DeploymentResponseGenerator`` of the method's items.

        The replica's user code sees the call's request id (``_get_serve_request_context()``): the
        one of the request this call is made inside (a replica calling another; the HTTP ingress
        sets it), else a new one, as Ray Serve's handle (which has no option to set it either)."""
        request = request_for_call(self.name, self.multiplexed_model_id)  # (now: a chained call is sent later)
        if self.stream:
            return DeploymentResponseGenerator(self._router.submit(self.method, args, kwargs, stream=True,
                                                                   request=request, routing_key=self.routing_key))
        if any(isinstance(a, DeploymentResponse) for a in (*args, *kwargs.values())):
            return DeploymentResponse.chained(self, args, kwargs, request)
        return DeploymentResponse(self._router.submit(self.method, args, kwargs, progress=self.progress,
                                                      by_value=not self._by_reference(),
                                                      request=request, routing_key=self.routing_key))

    def scale(self, num_replicas: int, *, victims: tuple = (), timeout: float = 120.0) -> None:
        """Scale in place (survivors keep running) and wait until healthy.

        ``victims`` names replicas to stop first (else not-yet-running ones,
        then the highest ranks). A bad count (not an int >= 0, above the
        deployment's ``max_replicas``) or victim raises ``rankcore.InvalidConfig``
        / ``InvalidEvent`` here, and changes nothing."""
        try:
            victims = tuple(victims)
            rc.ScaleRequested(deployment=self.name, num_replicas=num_replicas, victims=victims)
        except rc.InvalidConfig as exc:
            raise rc.InvalidConfig(f"handle.scale({num_replicas!r}) of {self.name!r}: {exc}") from None
        except TypeError:
            raise rc.InvalidConfig(f"handle.scale(victims=...) of {self.name!r} must be replica ids, "
                                   f"got {victims!r}") from None
        try:
            ask(self.controller, "scale", self.name, num_replicas, victims)
        except rc.InvalidConfig as exc:  # a static deployment; not whole gangs
            raise rc.InvalidConfig(f"handle.scale({num_replicas!r}) of {self.name!r}: {exc}") from None
        if not ask(self.controller, "wait_healthy", self.name, timeout, timeout=timeout + 30):
            raise TimeoutError(f"deployment {self.name!r} not healthy after {timeout:g}s")
        self._router.refresh(force=True)

    def broadcast(self, *args: Any, timeout: float | None = 60.0, wait: bool = True, **kwargs: Any) -> dict:
        """Call this handle's method on every serving replica at once (weights
        pushed to every inference replica, say): ``{replica_id: result}``. Not
        counted against ``max_ongoing_requests``; an error in any raises.
        ``wait=False``: return at once, ``{replica_id: ObjectRef}`` (``ray.get`` them)."""
        self._router.refresh(force=True)
        with self._router.lock:
            actors = dict(self._router.actors)
        request = request_for_call(self.name)  # (one call: one id on every replica)
        refs = {rid: actor.handle_request.remote(self.method, args, kwargs, request) for rid, actor in actors.items()}
        if not wait:
            return refs
        values = ray.get(list(refs.values()), timeout=timeout)
        return dict(zip(refs, values))

    def status(self) -> dict:
        """The deployment as the core holds it: ``healthy``, ``target``,
        ``status`` (Ray Serve's ``HEALTHY`` / ``UPDATING`` / ``UNHEALTHY``, e.g.
        while its constructor keeps raising) and ``status_message`` (why),
        ``failed`` (replica ids), ``revision`` (what its replicas must run: docs/rollouts.md)
        and ``replicas``: per replica id its ``phase`` (``"running"``, ``"failed"``, ...),
        ``rank``, ``node_id``, ``bundles`` (static placement), ``gang`` (its gang's id),
        ``revision`` (the one it was started with) and ``multiplexed_model_ids`` (``@multiplexed``
        models it holds or loads)."""
        return ask(self.controller, "deployment_status", self.name)

    def ranks(self) -> dict:
        """replica id -> (rank, node_rank, local_rank), as the controller holds them
        ((rank, None, None) for a replica still waiting to be placed)."""
        return ask(self.controller, "ranks", self.name)

    def counters(self) -> Any:
        """This process's request counters for the deployment (``rankcore.requests.Counters``:
        submitted, answered, retried, failed, rejected, ..., and ``lost``, always 0)."""
        return self._router.counters()


#: kept for code written against the old handle: what a call whose replica died raises now
ReplicaDiedError = rc.ReplicaDied


class DeploymentResponse:
    """A call under way: ``result(timeout)``, or ``await`` it (in async code); ``status()`` says where
    it is (queued with its position, loading, dispatched, running, done); pass it to another call to
    chain them without waiting."""

    def __init__(self, call: Call | None, future: Future | None = None) -> None:
        self.call = call
        self.future: Future = call.future if call is not None else future  # type: ignore[assignment]

    @classmethod
    def chained(cls, handle: DeploymentHandle, args: tuple, kwargs: dict,
                request: RequestContext | None = None) -> DeploymentResponse:
        """A call whose arguments hold responses: sent once they are in (on a thread: the caller does
        not wait); its future follows the call's, or the first argument's error."""
        out: Future = Future()
        resp = cls(None, out)

        def send() -> None:
            try:
                a = tuple(x.result() if isinstance(x, DeploymentResponse) else x for x in args)
                kw = {k: (v.result() if isinstance(v, DeploymentResponse) else v) for k, v in kwargs.items()}
                inner = handle._router.submit(handle.method, a, kw, progress=handle.progress, request=request,
                                              by_value=not handle._by_reference(), routing_key=handle.routing_key)
            except BaseException as exc:
                out.set_exception(exc)
                return
            resp.call = inner
            inner.future.add_done_callback(lambda f: _copy_outcome(f, out))

        threading.Thread(target=send, daemon=True).start()
        return resp

    def result(self, timeout: float | None = None) -> Any:
        """The call's result; the application's exception (with its remote traceback) if it raised;
        a ``rankcore.RequestError`` if it ended without an answer (``Overloaded``, ``Unavailable``,
        ``ReplicaDied`` naming the replica, ...); ``TimeoutError`` if none came within ``timeout``."""
        try:
            return self.future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer within {timeout:g}s") from None

    def __await__(self) -> Any:
        return asyncio.wrap_future(self.future).__await__()

    def status(self) -> Any:
        """``rankcore.requests.RequestStatus`` (None before a chained call is sent)."""
        return self.call.status() if self.call is not None else None

    def cancel(self) -> None:
        if self.call is not None:
            self.call.cancel()


class DeploymentResponseGenerator:
    """A streaming call's items (``handle.options(stream=True).method.remote(...)``): iterate it
    (``for item in gen``) or, in async code, ``async for item in gen``. A replica that dies mid-stream
    raises ``rankcore.ReplicaDied`` after the items already given; ``Overloaded`` / ``Unavailable``
    come before the first item. A stream is never retried: its items may already be used."""

    def __init__(self, call: Call) -> None:
        self.call = call

    def __iter__(self) -> Any:
        return self.call.router.stream_items(self.call)

    def __aiter__(self) -> Any:
        return self.call.router.stream_items_async(self.call)

    def status(self) -> Any:
        return self.call.status()

    def cancel(self) -> None:
        self.call.cancel()


def _copy_outcome(src: Future, dst: Future) -> None:
    if dst.done():
        return
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())
