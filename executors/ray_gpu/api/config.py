"""The config file of ``rankcore deploy`` (and the body of ``PUT /api/serve/applications/``):
Ray Serve's schema and names (``ServeDeploySchema``), read into attrs records with cattrs.

Why cattrs: the project's records are attrs classes already; cattrs structures plain data
into them and reports every bad value with its path, with no second record kind (pydantic
models) beside them.

A file is read in two passes. ``_walk`` goes over the YAML (or JSON) keeping each key's line
(PyYAML's ``compose`` keeps node marks): a key Ray Serve has and we do not support is refused
naming why, a key that Ray Serve itself treats as a no-op here is accepted with a warning, any
other unknown key is refused listing the keys there. Then cattrs structures the data with strict
scalar hooks (``"3"`` is not an int, ``3.7`` is not truncated). Each deployment's options are then
checked by the ``@deployment`` decorator's own checks (``deployments.deployment``, ``validate_options``):
declared once. Every error is a ``ConfigError`` naming the file, the key path
(``applications[0].deployments[1].num_replicas``) and the line.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union

import attrs
import cattrs
import yaml

import rankcore as rc

__all__ = ["ConfigError", "ServeConfig", "ApplicationConfig", "DeploymentConfig", "HTTPOptions", "GRPCOptions",
           "PROXY_LOCATIONS", "load", "parse", "dump", "to_plain", "build_config", "max_surge_of_percent"]

#: Ray Serve's ``ProxyLocation`` values: where the core runs proxies (rankcore/control/proxies.py);
#: ``Disabled`` exposes no route.
PROXY_LOCATIONS = rc.PROXY_LOCATIONS  # (declared once: rankcore.ProxyLocation)
#: Ray Serve's default application name
DEFAULT_APP_NAME = "default"


class ConfigError(rc.InvalidConfig):
    """A config file (or request body) refused: ``source`` (the file), ``path`` (the key path),
    ``line`` (1-based; None where the input had no lines, JSON over REST)."""

    def __init__(self, source: str, path: str, line: int | None, message: str) -> None:
        self.source, self.path, self.line, self.message = source, path, line, message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(" ".join(f"{where}: {path + ': ' if path else ''}{message}".splitlines()))


# ------------------------------------------------------------------ the records
#: a deployment's ``num_replicas``: a count, or Ray Serve's ``"auto"`` (autoscaled)
NumReplicas = Union[int, Literal["auto"], None]


@attrs.frozen(kw_only=True)
class HTTPOptions:
    """Ray Serve's ``http_options`` we act on: the ingress's ``host`` and ``port`` (None: the
    ingress's defaults, 127.0.0.1:8000) and ``request_timeout_s``."""

    host: str | None = None
    port: int | None = None
    request_timeout_s: float | None = None
    #: Ray Serve's; only "" (no root path) is supported
    root_path: str = ""


@attrs.frozen(kw_only=True)
class GRPCOptions:
    """Ray Serve's ``grpc_options``: with servicer functions every proxy serves gRPC on ``port``
    beside HTTP (base/grpc_proxy.py); without, no gRPC, as in Serve."""

    port: int = 9000
    grpc_servicer_functions: tuple[str, ...] = ()
    request_timeout_s: float | None = None
    enable_reflection: bool = False


#: Ray Serve's names for the pace of a rolling update (``DeploymentConfig.to_options`` translates them)
_SERVE_PACE = ("rolling_update_percentage", "max_surge_percent")


def max_surge_of_percent(percent: int) -> int | float:
    """Ray Serve's ``max_surge_percent`` as our ``max_surge``: its fraction of the target (25 is
    0.25), and 0 as the count 0 (no surge: a fraction must be above 0)."""
    return percent / 100 if percent else 0


@attrs.frozen(kw_only=True)
class DeploymentConfig:
    """One entry of an application's ``deployments:``: options that override the code's for the
    deployment ``name`` (only those given: None is "not given"). Ray Serve's names; ``options``
    holds the keys of ours (any other ``.options()`` keyword: ``version``, ``max_unavailable``,
    ``replica_placement``, ``health_check_failure_threshold``, ...)."""

    name: str
    num_replicas: NumReplicas = None
    max_ongoing_requests: int | None = None
    max_queued_requests: int | None = None
    user_config: dict | None = None
    autoscaling_config: dict | None = None
    #: Ray Serve's keys (request_router_class, request_router_kwargs, ...): the core's request_router options
    request_router_config: dict | None = None
    graceful_shutdown_wait_loop_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    ray_actor_options: dict | None = None
    placement_group_bundles: list[dict] | None = None
    placement_group_strategy: str | None = None
    #: Ray Serve's pace of a rolling update, a fraction in (0, 1]: our ``max_unavailable``
    rolling_update_percentage: float | None = None
    #: Ray Serve's surge of a rolling update, a percent of the target in [0, 100]: our ``max_surge``
    #: (its fraction; docs/rollouts.md, "Surge", says where the two differ)
    max_surge_percent: int | None = None
    version: str | None = None
    options: dict = attrs.Factory(dict)

    def to_options(self) -> dict[str, Any]:
        """The ``.options()`` keywords this entry sets (``rolling_update_percentage`` as ``max_unavailable``,
        ``max_surge_percent`` as ``max_surge``: 25 is 0.25, 0 is none)."""
        out = {f.name: getattr(self, f.name) for f in attrs.fields(DeploymentConfig)
               if f.name not in ("name", "options", *_SERVE_PACE) and getattr(self, f.name) is not None}
        if self.rolling_update_percentage is not None:
            out["max_unavailable"] = self.rolling_update_percentage
        if self.max_surge_percent is not None:
            out["max_surge"] = max_surge_of_percent(self.max_surge_percent)  # (range checked with the file)
        return {**out, **self.options}


@attrs.frozen(kw_only=True)
class ApplicationConfig:
    """One application: ``import_path`` (``module:attr`` or ``module.attr``: an ``Application``,
    a deployment, or a builder function taking ``args``), its ``route_prefix`` (None: not exposed
    over HTTP), the ``runtime_env`` its deployments inherit, and option overrides per deployment."""

    import_path: str
    name: str = DEFAULT_APP_NAME
    route_prefix: str | None = "/"
    args: dict = attrs.Factory(dict)
    runtime_env: dict = attrs.Factory(dict)
    deployments: tuple[DeploymentConfig, ...] = ()


@attrs.frozen(kw_only=True)
class ServeConfig:
    """The whole file (Ray Serve's ``ServeDeploySchema``)."""

    applications: tuple[ApplicationConfig, ...] = ()
    proxy_location: str = "EveryNode"
    http_options: HTTPOptions = attrs.Factory(HTTPOptions)
    grpc_options: GRPCOptions = attrs.Factory(GRPCOptions)
    #: the warnings loading gave (keys accepted and ignored); not part of the file
    warnings: tuple[str, ...] = attrs.field(default=(), eq=False)
    #: where it was read from, and each key path's line: errors found when it is applied name them too
    source: str = attrs.field(default="<config>", eq=False)
    lines: Any = attrs.field(default=None, eq=False, repr=False)

    def error(self, path: str, message: str) -> ConfigError:
        """A ``ConfigError`` about key ``path`` of this config (its file and line)."""
        return ConfigError(self.source, path, self.lines.line(path) if self.lines else None, message)


# ------------------------------------------------------------------ what is accepted where
_LOGGING = "logging_config is accepted and ignored: rankcore logs through Python's logging as configured"
#: per record: keys Ray Serve has that are accepted and ignored (with a warning), and keys it has
#: that we refuse (with why). A key in neither, and not a field, is unknown.
_IGNORED: dict[type, dict[str, str]] = {
    ServeConfig: {"logging_config": _LOGGING,
                  "target_capacity": "target_capacity is accepted and ignored (null or 100 only: "
                                     "_check_target_capacity refuses the rest)"},
    ApplicationConfig: {"logging_config": _LOGGING},
    DeploymentConfig: {"logging_config": _LOGGING},
    HTTPOptions: {"keep_alive_timeout_s": "keep_alive_timeout_s is accepted and ignored (the ingress keeps "
                                          "connections alive 30 s)"},
    GRPCOptions: {},
}
_REFUSED: dict[type, dict[str, str]] = {
    ServeConfig: {"controller_options": "no controller options", "tracing_config": "no tracing"},
    ApplicationConfig: {"host": "set host in http_options (as Ray Serve's multi-application config requires)",
                        "port": "set port in http_options (as Ray Serve's multi-application config requires)",
                        "autoscaling_policy": "no application-level autoscaling policy",
                        "external_scaler_enabled": "no external scaler"},
    DeploymentConfig: {k: "not supported by rankcore's Ray executor" for k in (
        "max_replicas_per_node", "placement_group_bundle_label_selector",
        "backpressure_config", "gang_scheduling_config", "deployment_actors")}
    | {"static_placement": "needs a placement group object: use .options(static_placement=...) in code",
       "_placement_info": "needs a placement group object: use .options(static_placement=...) in code"},
    HTTPOptions: {k: "no TLS in the ingress" for k in ("ssl_keyfile", "ssl_certfile", "ssl_keyfile_password",
                                                        "ssl_ca_certs")},
    GRPCOptions: {},
}


def _ours() -> tuple[str, ...]:
    """The ``.options()`` keywords of ours a deployment entry may also set (beside the typed Serve
    names): read from the Deployment record and the core's options, declared once there."""
    from ..control.controller import CORE_OPTIONS
    from .deployments import Deployment

    typed = {f.name for f in attrs.fields(DeploymentConfig)}
    names = ({f.name for f in attrs.fields(Deployment)} - {"cls", "core_options"}) | set(CORE_OPTIONS)
    return tuple(sorted(names - typed - set(_REFUSED[DeploymentConfig])))


# ------------------------------------------------------------------ reading
class _Lines:
    """Key path -> line, from the YAML nodes (empty for JSON)."""

    def __init__(self) -> None:
        self.at: dict[str, int] = {}

    def line(self, path: str) -> int | None:
        while True:  # the nearest enclosing key that has a line
            if path in self.at:
                return self.at[path]
            outer = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path)
            if outer == path:  # (a top-level key without a line: JSON)
                return self.at.get("")
            path = outer


def _plain(node: yaml.Node, path: str, lines: _Lines, source: str) -> Any:
    """A composed YAML node as plain data, each key's line noted under its path."""
    lines.at.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):  # (``? [a, b]: x``: no key path names it)
                raise ConfigError(source, path, k.start_mark.line + 1, "a key must be a plain value, not a "
                                                                       "list or a mapping")
            key = _scalar(k)
            sub = f"{path}.{key}" if path else str(key)
            lines.at[sub] = k.start_mark.line + 1
            if key in out:
                raise ConfigError(source, sub, k.start_mark.line + 1, "duplicate key")
            out[key] = _plain(v, sub, lines, source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(v, f"{path}[{i}]", lines, source) for i, v in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _read(text: str, source: str) -> tuple[Any, _Lines]:
    """The file's data and each key path's line. Hostile YAML is refused first, as scenario files
    are (``check_yaml_bounds``: size, nesting, aliases expanded; ``_plain`` walks every alias again)."""
    from ...scenarios.format import YamlTooBig, check_yaml_bounds

    lines = _Lines()
    try:
        check_yaml_bounds(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return {}, lines
        return _plain(node, "", lines, source), lines
    except YamlTooBig as exc:
        raise ConfigError(source, "", exc.mark[0] if exc.mark else None, f"refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(source, "", mark.line + 1 if mark is not None else None,
                          f"not valid YAML: {problem}") from None
    except (ValueError, RecursionError) as exc:  # (an int of more than 4,300 digits; a depth the bound missed)
        raise ConfigError(source, "", None, f"not valid YAML: {type(exc).__name__}: {exc}") from None


def _check_target_capacity(value: Any, err: Any) -> None:
    """Ray Serve's rule (a number from 0 to 100, or null), then ours: only the values that change
    nothing (null, 100) are accepted, as rankcore does not scale by it; anything else is refused
    rather than taken and ignored."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise err(f"must be a number from 0 to 100 or null, got {type(value).__name__} {value!r:.40}")
    if not 0 <= value <= 100:
        raise err(f"must be from 0 to 100 (Ray Serve's range), got {value!r}")
    if value != 100:
        raise err(f"not supported: rankcore does not scale applications by target_capacity (only null or "
                  f"100 are accepted, and change nothing), got {value!r}")


def options_from(cls: type, data: dict, where: str) -> Any:
    """``HTTPOptions`` or ``GRPCOptions`` from the keywords of a dict given in code (``serve.start``'s
    ``http_options={...}``) by the config file's rules, declared once (``_IGNORED``, ``_REFUSED``): a
    key Serve has that rankcore ignores is dropped with a warning, one it refuses or does not know
    is a ``ConfigError`` (an ``InvalidConfig``) naming it."""
    import warnings

    notes: list[str] = []
    walked = _walk(data, cls, "", _Lines(), where, notes)
    for note in notes:
        warnings.warn(note.replace(f"{where}:None: ", f"{where}: "), stacklevel=3)
    return cls(**walked)


def _walk(data: Any, cls: type, path: str, lines: _Lines, source: str, notes: list[str]) -> Any:
    """Check ``data``'s keys against ``cls`` (fields, ignored, refused, unknown); return the data
    ``cattrs`` structures (a deployment's keys of ours moved to its ``options``)."""
    def err(p: str, msg: str) -> ConfigError:
        return ConfigError(source, p, lines.line(p), msg)

    if not isinstance(data, dict):
        raise err(path, f"must be a mapping, got {type(data).__name__} {data!r:.60}")
    names = {f.name for f in attrs.fields(cls)} - {"warnings", "options", "source", "lines"}
    ours = _ours() if cls is DeploymentConfig else ()
    out: dict = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key in names:
            out[key] = value
        elif key in ours:
            out.setdefault("options", {})[key] = value
        elif key in _IGNORED[cls]:
            if cls is ServeConfig and key == "target_capacity":
                _check_target_capacity(value, lambda msg, p=sub: err(p, msg))
            notes.append(f"{source}:{lines.line(sub)}: {sub}: {_IGNORED[cls][key]}")
        elif key in _REFUSED[cls]:
            raise err(sub, f"not supported: {_REFUSED[cls][key]}")
        else:
            known = sorted(names | set(ours))
            raise err(sub, f"unknown key {key!r} (keys here: {', '.join(known)})")
    nested = {"http_options": HTTPOptions, "grpc_options": GRPCOptions}
    for key, sub_cls in nested.items():
        if cls is ServeConfig and key in out:
            out[key] = _walk(out[key], sub_cls, key, lines, source, notes)
    if cls is ServeConfig and "applications" in out:
        apps = out["applications"]
        if not isinstance(apps, list):
            raise err("applications", f"must be a list, got {type(apps).__name__}")
        out["applications"] = [_walk(a, ApplicationConfig, f"applications[{i}]", lines, source, notes)
                               for i, a in enumerate(apps)]
    if cls is ApplicationConfig and "deployments" in out:
        deps = out["deployments"]
        if not isinstance(deps, list):
            raise err(f"{path}.deployments", f"must be a list, got {type(deps).__name__}")
        out["deployments"] = [_walk(d, DeploymentConfig, f"{path}.deployments[{i}]", lines, source, notes)
                              for i, d in enumerate(deps)]
    return out


def _strict(t: type, name: str) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        ok = isinstance(value, t) and not (t is not bool and isinstance(value, bool))
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            raise TypeError(f"expected {name}, got {type(value).__name__} {value!r:.60}")
        return value
    return hook


def _converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    for t, name in ((int, "an int"), (float, "a number"), (str, "a string"), (bool, "true or false"),
                    (dict, "a mapping")):
        conv.register_structure_hook(t, _strict(t, name))
    conv.register_structure_hook_func(lambda t: t == NumReplicas, _num_replicas)
    return conv


def _num_replicas(v: Any, _: Any) -> Any:
    if v is None or v == "auto" or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise TypeError(f"expected an int or \"auto\", got {type(v).__name__} {v!r:.60}")


_CONVERTER = _converter()


def _cattrs_errors(exc: BaseException) -> list[tuple[str, str]]:
    """(key path, message) of each leaf error of a cattrs exception group."""
    out: list[tuple[str, str]] = []

    def fmt(e: BaseException, _type: Any) -> str:
        if isinstance(e, KeyError):
            return "required key missing"
        if isinstance(e, cattrs.errors.ForbiddenExtraKeysError):
            return f"unknown key(s) {', '.join(sorted(e.extra_fields))}"
        return str(e) if isinstance(e, TypeError) and str(e).startswith("expected") else \
            cattrs.v.format_exception(e, _type)

    for msg in cattrs.transform_error(exc, path="$", format_exception=fmt):
        text, _, where = msg.rpartition(" @ ")
        out.append((where.removeprefix("$").removeprefix("."), text))
    return out


def parse(data: Any, source: str = "<config>", lines: _Lines | None = None) -> ServeConfig:
    """Plain data (a parsed YAML file, a JSON request body) as a ``ServeConfig``, every key
    checked, every deployment's options checked by ``@deployment``'s own checks."""
    lines = lines or _Lines()
    notes: list[str] = []
    shaped = _walk(data if data is not None else {}, ServeConfig, "", lines, source, notes)
    try:
        cfg = _CONVERTER.structure(shaped, ServeConfig)
    except Exception as exc:  # cattrs' ClassValidationError / IterableValidationError
        errors = _cattrs_errors(exc)
        path, msg = errors[0] if errors else ("", str(exc))
        raise ConfigError(source, path, lines.line(path), msg) from None
    _check(cfg, source, lines)
    if not isinstance(data, dict) or "applications" not in data:
        # (Serve's schema requires it too: an empty file or body would delete every application)
        raise ConfigError(source, "applications", None,
                          "missing: a config lists its applications (`applications: []` deletes every one)")
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return attrs.evolve(cfg, warnings=tuple(notes), source=source, lines=lines)


def load(path: str | Path) -> ServeConfig:
    """Read a YAML (or JSON) config file; ``ConfigError`` names the file, key path and line."""
    from ...scenarios.format import read_text

    p = Path(path)
    try:
        text = read_text(p)
    except OSError as exc:
        raise ConfigError(str(p), "", None, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # (not UTF-8)
        raise ConfigError(str(p), "", None, str(exc)) from None
    data, lines = _read(text, str(p))
    return parse(data, str(p), lines)


def _check(cfg: ServeConfig, source: str, lines: _Lines) -> None:
    """What the types do not say: Ray Serve's rules across keys, and each deployment's options
    as ``@deployment`` checks them."""
    from ..ingress.http import check_route_prefix
    from .deployments import deployment

    def err(p: str, msg: str) -> ConfigError:
        return ConfigError(source, p, lines.line(p), msg)

    if cfg.proxy_location not in PROXY_LOCATIONS:
        raise err("proxy_location", f"must be one of {', '.join(PROXY_LOCATIONS)}, got {cfg.proxy_location!r}")
    if cfg.http_options.root_path:
        raise err("http_options.root_path", "not supported: only \"\" (no root path)")
    bad = [f for f in cfg.grpc_options.grpc_servicer_functions if not isinstance(f, str) or "." not in f.strip(".")]
    if bad:  # (imported where the proxies start: base/grpc_proxy.py)
        raise err("grpc_options.grpc_servicer_functions",
                  f"{bad[0]!r} is not an import path of a generated add_XServicer_to_server (module.function)")
    port = cfg.http_options.port
    if port is not None and not 0 <= port <= 65535:
        raise err("http_options.port", f"must be in 0..65535, got {port}")
    t = cfg.http_options.request_timeout_s
    if t is not None and t <= 0:
        raise err("http_options.request_timeout_s", f"must be > 0, got {t}")
    names: dict[str, int] = {}
    routes: dict[str, int] = {}
    for i, app in enumerate(cfg.applications):
        here = f"applications[{i}]"
        if not app.name:
            raise err(f"{here}.name", "an application's name must not be empty")
        _check_runtime_env(app.runtime_env, f"{here}.runtime_env", err)
        if app.name in names:
            raise err(f"{here}.name", f"application {app.name!r} is also applications[{names[app.name]}]")
        names[app.name] = i
        mod, attr = split_import_path(app.import_path)
        if not mod or not attr:
            raise err(f"{here}.import_path", f"expected module:attr or module.attr, got {app.import_path!r}")
        if app.route_prefix is not None:
            try:
                check_route_prefix(app.route_prefix)
            except rc.InvalidConfig as exc:
                raise err(f"{here}.route_prefix", str(exc)) from None
            if app.route_prefix in routes:
                raise err(f"{here}.route_prefix", f"{app.route_prefix!r} is also applications[{routes[app.route_prefix]}]'s")
            routes[app.route_prefix] = i
        seen: dict[str, int] = {}
        for j, d in enumerate(app.deployments):
            dp = f"{here}.deployments[{j}]"
            if d.name in seen:
                raise err(f"{dp}.name", f"deployment {d.name!r} is also {here}.deployments[{seen[d.name]}]")
            seen[d.name] = j
            p = d.max_surge_percent
            if p is not None and (type(p) is not int or not 0 <= p <= 100):
                raise err(f"{dp}.max_surge_percent", f"must be a percent of the target, an int in [0, 100] "
                                                     f"(Ray Serve's range), got {p!r}")
            if d.ray_actor_options:
                _check_runtime_env(d.ray_actor_options.get("runtime_env"), f"{dp}.ray_actor_options.runtime_env", err)
            opts = d.to_options()
            try:
                deployment(name=d.name, **opts)
            except rc.InvalidConfig as exc:
                raise option_error(source, lines, dp, opts, exc) from None


def _check_runtime_env(env: Any, path: str, err: Callable[[str, str], ConfigError]) -> None:
    """A config's ``runtime_env`` names its ``working_dir`` and ``py_modules`` by remote URIs (or
    ``local://`` ones, a folder on every node), as Serve's schema requires: a path of the machine that
    deploys means nothing on the cluster's nodes. Parsed by Ray's own ``parse_uri``, as Serve's."""
    if not isinstance(env, dict):
        return
    uris = list(env.get("py_modules") or [])
    if "working_dir" in env:
        uris.append(env["working_dir"])
    from ray._common.runtime_env_uri import parse_uri

    for uri in uris:
        if uri is None:
            continue
        try:
            parse_uri(uri)
        except (ValueError, TypeError) as exc:
            raise err(path, f"runtime_envs in the Serve config support only remote URIs in working_dir and "
                            f"py_modules, or \"local://\" URIs for directories that already exist on every node "
                            f"(Serve's rule): {exc}") from None


def split_import_path(path: str) -> tuple[str, str]:
    """``module:attr`` or ``module.attr`` (Ray Serve takes both) as (module, attr); ("", "") if neither."""
    if ":" in path:
        mod, _, attr = path.partition(":")
        return ("", "") if ":" in attr else (mod, attr)
    mod, _, attr = path.rpartition(".")
    return mod, attr


def option_error(source: str, lines: _Lines | None, path: str, opts: dict, exc: Exception) -> ConfigError:
    """A deployment entry's option refused by ``@deployment``'s checks: pointed at the key its
    message names (the first of the entry's keys it mentions), else at the entry."""
    msg = str(exc)
    msg = re.sub(r"^(deployment '[^']*'|@deployment\(\.\.\.\)): ", "", msg)
    named = sorted((k for k in opts if re.search(rf"\b{re.escape(k)}\b", str(exc))),
                   key=lambda k: str(exc).find(k))
    key = {"max_unavailable": "rolling_update_percentage", "max_surge": "max_surge_percent"}.get(named[0], named[0]) \
        if named else None
    p = f"{path}.{key}" if key else path
    lines = lines or _Lines()
    if key and p not in lines.at and f"{path}.{named[0]}" in lines.at:
        p = f"{path}.{named[0]}"
    return ConfigError(source, p, lines.line(p), msg)


# ------------------------------------------------------------------ writing
def to_plain(cfg: ServeConfig) -> dict:
    """The config as plain data in the file's shape (unset options left out)."""
    def dep(d: DeploymentConfig) -> dict:
        out: dict[str, Any] = {"name": d.name}
        for f in attrs.fields(DeploymentConfig):
            v = getattr(d, f.name)
            if f.name not in ("name", "options") and v is not None:
                out[f.name] = v
        return {**out, **d.options}

    return {"proxy_location": cfg.proxy_location,
            "http_options": {k: v for k, v in attrs.asdict(cfg.http_options).items() if v not in (None, "")},
            "grpc_options": {"port": cfg.grpc_options.port,
                             "grpc_servicer_functions": list(cfg.grpc_options.grpc_servicer_functions)},
            "applications": [{"name": a.name, "route_prefix": a.route_prefix, "import_path": a.import_path,
                              **({"args": a.args} if a.args else {}),
                              **({"runtime_env": a.runtime_env} if a.runtime_env else {}),
                              "deployments": [dep(d) for d in a.deployments]} for a in cfg.applications]}


def dump(cfg: ServeConfig) -> str:
    return yaml.safe_dump(to_plain(cfg), sort_keys=False)


def build_config(built: list[tuple[str, Any]], grpc_servicer_functions: tuple[str, ...] = ()) -> ServeConfig:
    """``rankcore build MODULE:APP...``: the config that deploys each ``(import path, Application)`` as
    its code says, one application each, named by its ingress deployment and routed at ``/<name>``,
    every deployment of its graph listed with the options its code sets (Ray Serve's ``serve build``;
    ``grpc_servicer_functions`` as its ``--grpc-servicer-functions``): edit it, then ``rankcore deploy``
    it. Two applications of one name are refused (rename one's ingress deployment, or edit the file)."""
    apps: list[tuple[str, ApplicationConfig]] = []
    for target, app in built:
        name = app.deployment.name
        twice = next((t for t, a in apps if a.name == name), None)
        if twice is not None:
            raise rc.InvalidConfig(f"{twice} and {target} are both application {name!r} (named by their ingress "
                                   f"deployment): build them into two files, or give one another deployment name")
        apps.append((target, ApplicationConfig(name=name, route_prefix=f"/{name}", import_path=target,
                                               deployments=tuple(_entry(d) for d in app.graph()))))
    return ServeConfig(proxy_location="HeadOnly", http_options=HTTPOptions(host="127.0.0.1", port=8000),
                       grpc_options=GRPCOptions(grpc_servicer_functions=tuple(grpc_servicer_functions)),
                       applications=tuple(a for _, a in apps))


def _entry(d: Any) -> DeploymentConfig:
    """A deployment's options as its code sets them (those that differ from the defaults)."""
    from .deployments import Deployment

    typed = {f.name for f in attrs.fields(DeploymentConfig)} - {"name", "options"}
    given: dict[str, Any] = {}
    for f in attrs.fields(Deployment):
        if f.name in ("cls", "name", "core_options", "static_placement"):
            continue
        v = getattr(d, f.name)
        factory = getattr(f.default, "factory", None)  # (an attrs.Factory default)
        default = factory() if factory is not None else f.default
        if v != default:
            given[f.name] = v
    core = dict(d.core_options)
    if core.get("autoscaling"):  # (autoscaled: num_replicas is no target; the code's config is flattened)
        given.pop("num_replicas", None)
    given.update(core)
    kwargs = {k: v for k, v in given.items() if k in typed}
    return DeploymentConfig(name=d.name, **kwargs, options={k: v for k, v in given.items() if k not in typed})
