"""Prometheus metrics of the Ray executor (issue 37): every metric declared once, here.

Three kinds of process export metrics, each into a ``CollectorRegistry`` of its own (never
prometheus_client's global one, so two ingresses or two tests never clash):

* the HTTP ingress (the data path, Ray Serve's proxy): requests, errors and latency per
  route and deployment, requests in flight, the deployments' queues; its gRPC calls the same
  (``IngressMetrics``);
* each replica (Serve counts these in the replica too, so a handle call made from Python is
  counted as an HTTP one is): calls answered and failed, the time in the user's method, calls
  in flight, its constructor's time (``ReplicaMetrics``); the ingress's ``/metrics`` gathers them
  (``merged``);
* the controller: replica health, target and current replicas, the controller's loop time, the
  replicas' start, reconfigure, stop and health-check times, the applications' status, and what
  only rankcore knows: rank reassignments, reconfigures by reason, tier moves and
  the bytes they moved, weights pushes (``ControllerMetrics``). It counts what the core
  decided (a driver observer reads each ``Step``'s compactions and commands); it decides
  nothing.

Where Ray Serve has a metric for the same thing, ours has Serve's exact name and labels
(read from ``ray/serve/_private``, Ray 2.60: ``request_ingress_metrics.py``, ``replica.py``,
``router.py``, ``deployment_state.py``, ``autoscaling_state.py``, ``controller.py``, ``application_state.py``;
Ray adds the
``ray_`` prefix and a counter's ``_total``), so a Serve dashboard's queries read ours. The rest are
``rankcore_*``. The label values of ``application`` are the application's name (``serve.run``'s
``name``, a config file's ``applications[].name``: ``appnames``), the deployment's own name for a
deployment no application holds, ``""`` for a request no route matched. docs/metrics.md lists them all,
and Ray Serve's every metric with what rankcore exports of it ("Ray Serve's metrics, one by one").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

import rankcore as rc

from ...scenarios.metrics import moved_levels
from .appnames import of as _app
from .appnames import table as _apps_table

__all__ = ["MetricSpec", "INGRESS_METRICS", "REPLICA_METRICS", "CONTROLLER_METRICS", "ROUTER_METRICS", "ALL_METRICS",
           "LATENCY_BUCKETS_MS", "IngressMetrics", "ReplicaMetrics", "ControllerMetrics", "build", "exported_names",
           "merged", "CONTENT_TYPE", "DEPLOYMENT_STATUS_NUMERIC", "APPLICATION_STATUS_NUMERIC",
           "REPLICA_LIFECYCLE_BUCKETS_MS", "application_status", "router_families", "PROXY_STATUS_NUMERIC"]

#: the exposition's media type (Prometheus text format 0.0.4)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Ray Serve's request latency buckets (``DEFAULT_LATENCY_BUCKET_MS``), in ms
LATENCY_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 300, 400, 500, 1000, 2000, 5000, 10000,
                                         60000, 120000, 300000, 600000)
#: Serve's replica startup, initialization and shutdown buckets (``DEFAULT_REPLICA_STARTUP_SHUTDOWN_LATENCY_BUCKETS_MS``),
#: in ms
REPLICA_LIFECYCLE_BUCKETS_MS: tuple[float, ...] = (5, 20, 50, 100, 250, 500, 1000, 2000, 5000, 10000, 20000, 30000,
                                                   60000, 120000, 240000)
#: Serve's batch utilization buckets (``DEFAULT_BATCH_UTILIZATION_BUCKETS_PERCENT``), in %
BATCH_UTILIZATION_BUCKETS: tuple[float, ...] = (5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)
#: Serve's batch size buckets (``DEFAULT_BATCH_SIZE_BUCKETS``)
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: the controller's step time (a core step is microseconds to milliseconds), in seconds
STEP_BUCKETS_S: tuple[float, ...] = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)

_KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


@attrs.frozen(kw_only=True)
class MetricSpec:
    """One metric: ``name`` is the family name as exposed (a counter's samples add ``_total``, a
    histogram's ``_bucket``/``_sum``/``_count``); ``serve`` names Ray Serve's metric it matches
    (None: rankcore's own)."""

    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(tuple(_KINDS)))
    labels: tuple[str, ...]
    doc: str
    serve: str | None = None
    buckets: tuple[float, ...] | None = None

    def samples(self) -> tuple[str, ...]:
        """The sample names a scrape shows (what a query names)."""
        if self.kind == "counter":
            return (self.name + "_total",)
        if self.kind == "histogram":
            return tuple(self.name + s for s in ("_bucket", "_sum", "_count"))
        return (self.name,)


def _serve(name: str, kind: str, labels: tuple[str, ...], doc: str, **kw: Any) -> MetricSpec:
    return MetricSpec(name=name, kind=kind, labels=labels, doc=doc, serve=name, **kw)


_DEP = ("deployment", "application")

#: one per HTTP request answered: by the ingress, or on the direct data plane by the replica's own
#: server (``base.direct``); a scrape sums the series several processes export (``merged``)
HTTP_REQUEST_METRICS: tuple[MetricSpec, ...] = (
    _serve("ray_serve_num_http_requests", "counter", ("route", "method", "application", "status_code"),
           "HTTP requests answered by the ingress (or, on the direct data plane, by the replicas' own servers)."),
    _serve("ray_serve_num_http_error_requests", "counter", ("route", "error_code", "method", "application"),
           "HTTP requests answered with a 4xx or 5xx status."),
    _serve("ray_serve_num_deployment_http_error_requests", "counter",
           ("deployment", "error_code", "method", "route", "application"),
           "HTTP requests answered with a 4xx or 5xx status, per deployment."),
    _serve("ray_serve_http_request_latency_ms", "histogram", ("method", "route", "application", "status_code"),
           "End-to-end latency of HTTP requests, measured in the ingress (on the direct data plane: in the "
           "replica's own server) (ms).", buckets=LATENCY_BUCKETS_MS),
)

#: gRPC: Serve's ``request_ingress_metrics.py`` makes the HTTP ones once more for gRPC; its proxy labels
#: a call with its full method name (``/package.Service/Method``), the application as its route, and
#: the gRPC code's name as its status (``OK``, ``NOT_FOUND``, ...). One per call: by the proxy, or on
#: the direct data plane by the replica's own gRPC server, summed as the HTTP ones are
GRPC_REQUEST_METRICS: tuple[MetricSpec, ...] = (
    _serve("ray_serve_num_grpc_requests", "counter", ("route", "method", "application", "status_code"),
           "gRPC calls answered by the proxy (or, on the direct data plane, by the replicas' own gRPC servers; "
           "status_code: the gRPC code's name)."),
    _serve("ray_serve_num_grpc_error_requests", "counter", ("route", "error_code", "method", "application"),
           "gRPC calls answered with a code other than OK."),
    _serve("ray_serve_num_deployment_grpc_error_requests", "counter",
           ("deployment", "error_code", "method", "route", "application"),
           "gRPC calls answered with a code other than OK, per deployment."),
    _serve("ray_serve_grpc_request_latency_ms", "histogram", ("method", "route", "application", "status_code"),
           "End-to-end latency of gRPC calls, measured in the proxy (on the direct data plane: in the replica's "
           "own gRPC server) (ms).", buckets=LATENCY_BUCKETS_MS),
)

INGRESS_METRICS: tuple[MetricSpec, ...] = (
    *HTTP_REQUEST_METRICS,
    _serve("ray_serve_num_ongoing_http_requests", "gauge", ("node_id", "node_ip_address"),
           "HTTP requests the ingress is answering now."),
    *GRPC_REQUEST_METRICS,
    _serve("ray_serve_num_ongoing_grpc_requests", "gauge", ("node_id", "node_ip_address"),
           "gRPC calls to an application the proxy is answering now."),
    _serve("ray_serve_deployment_queued_queries", "gauge", ("deployment", "application", "handle", "actor_id"),
           "Requests waiting in the ingress's router for a replica (at scrape time)."),
    _serve("ray_serve_num_ongoing_requests_at_replicas", "gauge", ("deployment", "application", "handle", "actor_id"),
           "Requests the ingress's router has sent to replicas and not yet seen answered (at scrape time)."),
    MetricSpec(name="rankcore_controller_metrics_up", kind="gauge", labels=(),
               doc="1 when the last /metrics scrape got the controller's metrics, else 0."),
    MetricSpec(name="rankcore_replica_metrics_up", kind="gauge", labels=("deployment", "replica", "application"),
               doc="Per serving replica: 1 when it answered the last /metrics scrape in time, else 0."),
)

_BATCH = ("deployment", "replica", "application", "function_name")

#: Serve's replica metrics (``replica.py``'s ``ReplicaMetricsManager``): Ray's default tags
#: (deployment, replica, application) and the metric's own (route, exception_type)
REPLICA_METRICS: tuple[MetricSpec, ...] = (
    *HTTP_REQUEST_METRICS,
    *GRPC_REQUEST_METRICS,
    _serve("ray_serve_deployment_request_counter", "counter", ("deployment", "replica", "route", "application"),
           "Calls the replica answered without an error (HTTP and handle calls; errors are only in the error "
           "counter, as Serve 2.60 counts them)."),
    _serve("ray_serve_deployment_error_counter", "counter",
           ("deployment", "replica", "route", "application", "exception_type"),
           "Calls the replica's user method ended with an exception (its type; CancelledError for a cancelled one)."),
    _serve("ray_serve_deployment_processing_latency_ms", "histogram", ("deployment", "replica", "route", "application"),
           "Time in the user's method (a stream: until its last item), errors included (ms).",
           buckets=LATENCY_BUCKETS_MS),
    _serve("ray_serve_replica_processing_queries", "gauge", ("deployment", "replica", "application"),
           "Calls on the replica now: arrived and not yet ended (waiting for a slot included)."),
    _serve("ray_serve_deployment_replica_starts", "counter", ("deployment", "replica", "application"),
           "Starts of this replica's process: 1 once its actor is constructed (Serve counts it in the replica's "
           "constructor too; a new process, a new series)."),
    # Serve's controller records it (``deployment_state.py``, labels deployment and application) from what
    # the replica measured; here the replica exports it itself, so each replica's series has its ``replica``
    _serve("ray_serve_replica_initialization_latency_ms", "histogram", ("deployment", "replica", "application"),
           "Time the replica's user constructor took (and its ASGI app's startup) (ms); once per replica process.",
           buckets=REPLICA_LIFECYCLE_BUCKETS_MS),
    # batching (``@batch``): Serve's ``batching.py`` names, per batched method (``function_name``)
    _serve("ray_serve_batch_wait_time_ms", "histogram", _BATCH,
           "Time a batch waited to fill: from its first request to its close (ms).", buckets=LATENCY_BUCKETS_MS),
    _serve("ray_serve_batch_execution_time_ms", "histogram", _BATCH,
           "Time the batched method took for one batch (ms).", buckets=LATENCY_BUCKETS_MS),
    _serve("ray_serve_batch_queue_length", "gauge", _BATCH, "Requests waiting in the batcher (not yet running)."),
    _serve("ray_serve_batch_utilization_percent", "histogram", _BATCH,
           "A batch's size as a share of max_batch_size (%).", buckets=BATCH_UTILIZATION_BUCKETS),
    _serve("ray_serve_actual_batch_size", "histogram", _BATCH, "The number of requests (sizes) in each batch.",
           buckets=BATCH_SIZE_BUCKETS),
    _serve("ray_serve_batches_processed", "counter", _BATCH, "Batches run."),
    # model multiplexing (``@multiplexed``): Serve's ``multiplex.py`` names
    _serve("ray_serve_num_multiplexed_models", "gauge", ("deployment", "replica", "application"),
           "Multiplexed models the replica holds or is loading."),
    _serve("ray_serve_registered_multiplexed_model_id", "gauge", ("deployment", "replica", "application", "model_id"),
           "1 for each multiplexed model the replica holds or is loading, 0 once unloaded."),
    _serve("ray_serve_multiplexed_get_model_requests_counter", "counter", ("deployment", "replica", "application"),
           "Calls of a @multiplexed loader (hits and misses)."),
    _serve("ray_serve_multiplexed_models_load_counter", "counter", ("deployment", "replica", "application"),
           "Multiplexed models loaded."),
    _serve("ray_serve_multiplexed_models_unload_counter", "counter", ("deployment", "replica", "application"),
           "Multiplexed models unloaded (least recently used beyond max_num_models_per_replica)."),
    _serve("ray_serve_multiplexed_model_load_latency_ms", "histogram", ("deployment", "replica", "application"),
           "Time a multiplexed model took to load (ms).", buckets=LATENCY_BUCKETS_MS),
    _serve("ray_serve_multiplexed_model_unload_latency_ms", "histogram", ("deployment", "replica", "application"),
           "Time a multiplexed model took to unload (its __del__) (ms).", buckets=LATENCY_BUCKETS_MS),
)

CONTROLLER_METRICS: tuple[MetricSpec, ...] = (
    _serve("ray_serve_deployment_replica_healthy", "gauge", ("deployment", "replica", "application"),
           "1 for a replica that serves (running or reconfiguring), 0 for any other live replica."),
    _serve("ray_serve_autoscaling_target_replicas", "gauge", _DEP,
           "The deployment's target number of replicas (the person's or the autoscaler's)."),
    _serve("ray_serve_autoscaling_target_ongoing_requests", "gauge", _DEP,
           "An autoscaled deployment's configured target_ongoing_requests per replica (none when not autoscaled)."),
    _serve("ray_serve_deployment_status", "gauge", _DEP,
           "The deployment's status (the one rankcore status shows) in Serve's numbers: 0 unknown, 1 DEPLOY_FAILED, "
           "2 UNHEALTHY, 3 UPDATING, 4 UPSCALING, 5 DOWNSCALING, 6 HEALTHY (rankcore's are 2, 3 and 6)."),
    # Serve's name ends in ``_total`` itself: the family is the name without it (the scrape shows Serve's)
    MetricSpec(name="ray_serve_health_check_failures", kind="counter", labels=("deployment", "replica", "application"),
               doc="Health checks a replica failed (its check raised or timed out), as the controller fed them to "
                   "the core (HealthChecked, healthy=False).", serve="ray_serve_health_check_failures_total"),
    _serve("ray_serve_health_check_latency_ms", "histogram", _DEP,
           "Time the controller's health check of a replica took: answered or timed out (ms).",
           buckets=LATENCY_BUCKETS_MS),
    _serve("ray_serve_replica_startup_latency_ms", "histogram", _DEP,
           "Time from a replica's start (StartReplica carried out) to its ready (ReplicaReady) (ms).",
           buckets=REPLICA_LIFECYCLE_BUCKETS_MS),
    _serve("ray_serve_replica_reconfigure_latency_ms", "histogram", _DEP,
           "Time from a ReconfigureReplica sent to its answer (ReplicaReconfigured) (ms).", buckets=LATENCY_BUCKETS_MS),
    _serve("ray_serve_replica_shutdown_duration_ms", "histogram", _DEP,
           "Time from a StopReplica sent to the replica stopped (ReplicaStopped) (ms).",
           buckets=REPLICA_LIFECYCLE_BUCKETS_MS),
    _serve("ray_serve_application_status", "gauge", ("application",),
           "The application's status (the one rankcore status shows) in Serve's numbers: 0 unknown, 1 DEPLOY_FAILED, "
           "2 UNHEALTHY, 3 NOT_STARTED, 4 DELETING, 5 DEPLOYING, 6 RUNNING."),
    _serve("ray_serve_proxy_status", "gauge", ("node_id", "node_ip_address"),
           "Each node's proxy's status in Serve's numbers: 1 STARTING, 2 HEALTHY, 3 UNHEALTHY (died or failed its "
           "health checks: restarting), 4 DRAINING, 5 DRAINED (drained and stopped; until a proxy starts there again)."),
    _serve("ray_serve_proxy_shutdown_duration_ms", "histogram", ("node_id", "node_ip_address"),
           "Time a proxy took to stop: from its StopProxy (or the controller's reset) to its actor gone (ms).",
           buckets=REPLICA_LIFECYCLE_BUCKETS_MS),
    MetricSpec(name="rankcore_deployment_replicas", kind="gauge", labels=(*_DEP, "phase"),
               doc="The deployment's replicas now, by lifecycle phase (Serve has no gauge of current replicas)."),
    _serve("ray_serve_controller_control_loop_duration_s", "gauge", (),
           "How long the controller's last cluster pass took (nodes, bundles, the core's Tick) (s)."),
    _serve("ray_serve_controller_num_control_loops", "gauge", ("actor_id",),
           "Cluster passes the controller has made since it started."),
    MetricSpec(name="rankcore_core_steps", kind="counter", labels=(),
               doc="Events the core has stepped in this controller."),
    MetricSpec(name="rankcore_rank_reassignments", kind="counter", labels=(*_DEP, "level"),
               doc="Ranks a compaction moved, by level (rank, node_rank, local_rank)."),
    MetricSpec(name="rankcore_compactions", kind="counter", labels=_DEP,
               doc="Compactions the core made after a downscale (each with the fewest possible moves)."),
    MetricSpec(name="rankcore_reconfigures", kind="counter", labels=(*_DEP, "reason"),
               doc="ReconfigureReplica commands, by reason (user_config, rank)."),
    MetricSpec(name="rankcore_tier_moves", kind="counter", labels=(*_DEP, "move"),
               doc="Tier moves the core ordered: offload, load, evict_warm, evict_cold, drop_warm."),
    MetricSpec(name="rankcore_tier_bytes", kind="counter", labels=(*_DEP, "move"),
               doc="Weight bytes moved by the moves carried out (offload, load, update)."),
    MetricSpec(name="rankcore_weight_pushes", kind="counter", labels=_DEP,
               doc="Weights versions pushed (WeightsPushed accepted by the core)."),
    MetricSpec(name="rankcore_weight_updates", kind="counter", labels=_DEP,
               doc="UpdateWeights commands: one per replica a pushed version must reach."),
    MetricSpec(name="rankcore_rejected_events", kind="gauge", labels=(),
               doc="Events the core has refused (a normal run has none; the controller's status lists them)."),
)

#: What a process's routers routed (``base.router.Router.routed``), made anew at each scrape of the process
#: that holds them (``router_families``): the ingress's routers and those of each replica's handles (a
#: replica calling another). A driver's handles are in no scraped process: not exported.
ROUTER_METRICS: tuple[MetricSpec, ...] = (
    _serve("ray_serve_num_router_requests", "counter", ("deployment", "route", "application", "handle", "actor_id"),
           "Calls a router sent on (Serve's: processed by the router), by the route of the request they were "
           "made in (\"\": a call made outside a request)."),
    _serve("ray_serve_handle_request_counter", "counter", ("handle", "deployment", "route", "application"),
           "handle.remote() calls made through a handle (its router: the handles of a deployment in one "
           "process share one), by the route of the request they were made in."),
)

ALL_METRICS: tuple[MetricSpec, ...] = tuple(dict.fromkeys(  # (HTTP_REQUEST_METRICS: in both the ingress's and replicas')
    INGRESS_METRICS + REPLICA_METRICS + CONTROLLER_METRICS + ROUTER_METRICS))


def build(specs: Iterable[MetricSpec]) -> tuple[CollectorRegistry, dict[str, Any]]:
    """A registry of its own holding ``specs``: ``(registry, {name: metric})``."""
    registry = CollectorRegistry(auto_describe=True)
    made: dict[str, Any] = {}
    for s in specs:
        kw: dict[str, Any] = {"labelnames": s.labels, "registry": registry}
        if s.buckets is not None:
            kw["buckets"] = s.buckets
        made[s.name] = _KINDS[s.kind](s.name, s.doc, **kw)
    return registry, made


def exported_names() -> frozenset[str]:
    """Every sample name a scrape of the ingress's ``/metrics`` can show."""
    return frozenset(n for s in ALL_METRICS for n in s.samples())


def _is_error(status: int) -> bool:
    return status >= 400


#: how many label sets a registry's per-request series keep found (``_Children``): a request's series are
#: looked up once, not at each request (prometheus_client's ``labels`` costs a few microseconds each)
CHILDREN_KEPT = 1024


class _Children(dict):
    """Label set -> the series one request moves (``http_request``, ``grpc_request``), at most
    ``CHILDREN_KEPT`` kept (more are looked up each time)."""

    def get_or(self, key: tuple, make: Any) -> tuple:
        kids = self.get(key)
        if kids is None:
            kids = make()
            if len(self) < CHILDREN_KEPT:
                self[key] = kids
        return kids


def http_request(m: dict[str, Any], *, route: str, method: str, deployment: str, app: str, status: int,
                 latency_ms: float, kept: _Children | None = None) -> None:
    """One HTTP request answered, in ``HTTP_REQUEST_METRICS`` (``m``: a registry's metrics by name;
    ``kept``: its series found before)."""
    def make() -> tuple:
        code = str(status)
        return (m["ray_serve_num_http_requests"].labels(route, method, app, code),
                m["ray_serve_http_request_latency_ms"].labels(method, route, app, code),
                *((m["ray_serve_num_http_error_requests"].labels(route, code, method, app),
                   m["ray_serve_num_deployment_http_error_requests"].labels(deployment, code, method, route, app))
                  if _is_error(status) else ()))
    _moved((kept if kept is not None else _Children()).get_or((route, method, deployment, app, status), make),
           latency_ms)


def _moved(kids: tuple, latency_ms: float) -> None:
    """One request in its series (``http_request``, ``grpc_request``): its count, its latency, and the
    error counts when it failed."""
    kids[0].inc()
    kids[1].observe(latency_ms)
    for kid in kids[2:]:
        kid.inc()


def grpc_request(m: dict[str, Any], *, method: str, deployment: str, code: str, latency_ms: float,
                 kept: _Children | None = None) -> None:
    """One gRPC call answered, in ``GRPC_REQUEST_METRICS``, as Serve's gRPC proxy records it: ``method``
    its full name (``/package.Service/Method``), ``code`` the gRPC code's name it ended with (``OK``,
    ``NOT_FOUND`` ...: any other than ``OK`` is an error; labelled as Serve's, ``StatusCode.NOT_FOUND``),
    the application both the ``route`` and the ``application`` label (``deployment`` ``""``: no
    application matched, both ``""``; ``kept``: its series found before)."""
    app = _app(deployment)

    def make() -> tuple:
        shown = f"StatusCode.{code}"  # (Serve's label: str(grpc.StatusCode.X))
        return (m["ray_serve_num_grpc_requests"].labels(app, method, app, shown),
                m["ray_serve_grpc_request_latency_ms"].labels(method, app, app, shown),
                *((m["ray_serve_num_grpc_error_requests"].labels(app, shown, method, app),
                   m["ray_serve_num_deployment_grpc_error_requests"].labels(deployment, shown, method, app, app))
                  if code != "OK" else ()))
    _moved((kept if kept is not None else _Children()).get_or((method, deployment, app, code), make), latency_ms)


class Departed:
    """Keeps counters summed over processes from dropping when one of them goes (the direct data
    plane's HTTP request counts, one share per replica, summed by ``merged``): a replica that left keeps
    adding what it counted last, so the sum never falls, which Prometheus would read as a counter reset
    (a spike in ``rate``). One that did not answer a scrape counts what it counted last too."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.last: dict[Any, list[Metric]] = {}  # process -> its families of ``names``, as it last said
        #: (family, type, help, sample name, labels) -> what the processes that left counted
        self.gone: dict[tuple[str, str, str, str, tuple], float] = {}

    def fold(self, now: dict[Any, list[Metric] | None]) -> list[Metric]:
        """``now``: every process still there, with its families (None: it did not answer this time).
        The families of ``names`` to merge: each process's last, and one of those that left."""
        for key, fams in now.items():
            if fams is not None:
                self.last[key] = [f for f in fams if f.name in self.names]
        for key in [k for k in self.last if k not in now]:
            for fam in self.last.pop(key):
                for smp in fam.samples:
                    if not smp.name.endswith("_created"):  # (a creation time is not a count)
                        k = (fam.name, fam.type, fam.documentation, smp.name, tuple(sorted(smp.labels.items())))
                        self.gone[k] = self.gone.get(k, 0.0) + smp.value
        left: dict[str, Metric] = {}
        for (name, kind, doc, sample, labels), value in self.gone.items():
            if name not in left:
                left[name] = Metric(name, doc, kind)
            left[name].add_sample(sample, dict(labels), value)
        return [f for fams in self.last.values() for f in fams] + list(left.values())


class IngressMetrics:
    """The ingress's metrics: one ``request`` per HTTP request answered, one ``grpc_request`` per gRPC
    call; the ongoing gauges move as requests come and go; the queue gauges are read from the handles
    at scrape."""

    def __init__(self, node_id: str = "", node_ip: str = "") -> None:
        self.registry, self.m = build(INGRESS_METRICS)
        self._kept = _Children()  # (its per-request series, found once: ``http_request``)
        self._ongoing = self.m["ray_serve_num_ongoing_http_requests"].labels(node_id, node_ip)
        self._grpc_ongoing = self.m["ray_serve_num_ongoing_grpc_requests"].labels(node_id, node_ip)

    def started(self) -> None:
        self._ongoing.inc()

    def ended(self) -> None:
        self._ongoing.dec()

    def request(self, *, route: str, method: str, deployment: str, status: int, latency_ms: float) -> None:
        """One request answered (``deployment`` ``""``: no route matched). The replica counts the
        call it answered (``ReplicaMetrics``): counted once, handle calls too."""
        http_request(self.m, route=route, method=method, deployment=deployment, app=_app(deployment), status=status,
                     latency_ms=latency_ms, kept=self._kept)

    def grpc_started(self) -> None:
        self._grpc_ongoing.inc()

    def grpc_ended(self) -> None:
        self._grpc_ongoing.dec()

    def grpc_request(self, *, method: str, deployment: str, code: str, latency_ms: float) -> None:
        """One gRPC call answered (module function ``grpc_request``)."""
        grpc_request(self.m, method=method, deployment=deployment, code=code, latency_ms=latency_ms, kept=self._kept)

    def queues(self, loads: dict[str, tuple[int, int]], handle: str, actor_id: str) -> None:
        """The routers' queues now: ``{deployment: (queued, in flight)}`` (gone ones dropped)."""
        queued, ongoing = self.m["ray_serve_deployment_queued_queries"], self.m["ray_serve_num_ongoing_requests_at_replicas"]
        queued.clear()
        ongoing.clear()
        for name, (q, f) in loads.items():
            queued.labels(name, _app(name), handle, actor_id).set(q)
            ongoing.labels(name, _app(name), handle, actor_id).set(f)

    def controller_up(self, up: bool) -> None:
        self.m["rankcore_controller_metrics_up"].set(1 if up else 0)

    def replicas_up(self, answered: dict[tuple[str, str], bool]) -> None:
        """The last scrape's replicas: ``{(deployment, replica): answered in time}`` (gone ones dropped)."""
        up = self.m["rankcore_replica_metrics_up"]
        up.clear()
        for (dep, rid), ok in answered.items():
            up.labels(dep, rid, _app(dep)).set(1 if ok else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class ReplicaMetrics:
    """One replica's metrics (its own registry: one per replica actor). ``began``/``ended``
    bracket a call's stay on the replica (the in-flight gauge); ``answered`` counts a call whose
    user method ended, with the time it ran and the exception type it raised (None: none)."""

    def __init__(self, deployment: str, replica: str, application: str | None = None) -> None:
        self.registry, self.m = build(REPLICA_METRICS)
        self._kept = _Children()  # (its per-request series, found once: ``http_request``)
        self.deployment, self.replica = deployment, replica
        #: the ``application`` label (``appnames``, read once: a replica belongs to one application)
        self.app = app = _app(deployment) if application is None else application
        self._ongoing = self.m["ray_serve_replica_processing_queries"].labels(deployment, replica, app)
        # (constructed once per replica process, in its actor's constructor: Serve's replica counts its start there)
        self.m["ray_serve_deployment_replica_starts"].labels(deployment, replica, app).inc()
        self._models: set[str] = set()  # (the multiplexed models last shown as registered)
        #: a @multiplexed loader's calls: counted once a request (its labelled child kept, as ``_ongoing``)
        self._lookups = self.m["ray_serve_multiplexed_get_model_requests_counter"].labels(deployment, replica, app)

    def began(self) -> None:
        self._ongoing.inc()

    def ended(self) -> None:
        self._ongoing.dec()

    def initialized(self, ms: float) -> None:
        """The user's constructor ended, after ``ms`` (once per replica process)."""
        self.m["ray_serve_replica_initialization_latency_ms"].labels(self.deployment, self.replica, self.app).observe(ms)

    def http_request(self, *, route: str, method: str, status: int, latency_ms: float) -> None:
        """One HTTP request its own server answered (the direct data plane: ``base.direct``)."""
        http_request(self.m, route=route, method=method, deployment=self.deployment, app=self.app, status=status,
                     latency_ms=latency_ms, kept=self._kept)

    def grpc_request(self, *, method: str, deployment: str, code: str, latency_ms: float) -> None:
        """One gRPC call its own gRPC server answered (the direct data plane: ``replica.direct_grpc``)."""
        grpc_request(self.m, method=method, deployment=deployment, code=code, latency_ms=latency_ms, kept=self._kept)

    def grpc_started(self) -> None:
        """(A gRPC call began on its own server: Serve's replica keeps no gauge of them.)"""

    def grpc_ended(self) -> None:
        """(See ``grpc_started``.)"""

    def answered(self, route: str, latency_ms: float, exception_type: str | None = None) -> None:
        m, dep, rid, app = self.m, self.deployment, self.replica, self.app

        def make() -> tuple:
            return (m["ray_serve_deployment_processing_latency_ms"].labels(dep, rid, route, app),
                    m["ray_serve_deployment_request_counter"].labels(dep, rid, route, app) if exception_type is None
                    else m["ray_serve_deployment_error_counter"].labels(dep, rid, route, app, exception_type))
        took, count = self._kept.get_or(("answered", route, exception_type), make)
        took.observe(latency_ms)
        count.inc()

    # -- batching (``replica.batching``)
    def batch_ran(self, function: str, wait_ms: float, run_ms: float, size: int, bound: int) -> None:
        m, lab = self.m, (self.deployment, self.replica, self.app, function)
        m["ray_serve_batch_wait_time_ms"].labels(*lab).observe(wait_ms)
        m["ray_serve_batch_execution_time_ms"].labels(*lab).observe(run_ms)
        m["ray_serve_batch_utilization_percent"].labels(*lab).observe(100.0 * size / bound)
        m["ray_serve_actual_batch_size"].labels(*lab).observe(size)
        m["ray_serve_batches_processed"].labels(*lab).inc()

    def batch_queue(self, function: str, waiting: int) -> None:
        self.m["ray_serve_batch_queue_length"].labels(self.deployment, self.replica, self.app, function).set(waiting)

    # -- model multiplexing (``replica.multiplex``)
    def models_now(self, models: tuple[str, ...]) -> None:
        m, dep, rid, app = self.m, self.deployment, self.replica, self.app
        m["ray_serve_num_multiplexed_models"].labels(dep, rid, app).set(len(models))
        reg = m["ray_serve_registered_multiplexed_model_id"]
        now = set(models)
        for model in now | self._models:
            reg.labels(dep, rid, app, model).set(1 if model in now else 0)
        self._models = now

    def model_lookup(self) -> None:
        self._lookups.inc()

    def model_loaded(self, ms: float) -> None:
        dep, rid, app = self.deployment, self.replica, self.app
        self.m["ray_serve_multiplexed_models_load_counter"].labels(dep, rid, app).inc()
        self.m["ray_serve_multiplexed_model_load_latency_ms"].labels(dep, rid, app).observe(ms)

    def model_unloaded(self, ms: float) -> None:
        dep, rid, app = self.deployment, self.replica, self.app
        self.m["ray_serve_multiplexed_models_unload_counter"].labels(dep, rid, app).inc()
        self.m["ray_serve_multiplexed_model_unload_latency_ms"].labels(dep, rid, app).observe(ms)

    def families(self) -> list[Metric]:
        """Its metric families as objects (what the ingress's scrape gathers and ``merged`` joins)."""
        return list(self.registry.collect())


def router_families(routed: Iterable[tuple[str, str, str, str, int]], actor_id: str,
                    handle: str | None = None) -> list[Metric]:
    """Serve's router and handle request counters from what a process's routers routed
    (``base.router.routed``: ``(deployment, route, application, handle id, calls)``, the application
    as it was when the calls were made), in a registry made for this scrape: a counter is the router's
    own running count. ``handle``: the ``handle`` label of every router here (the ingress's: ``http``, as
    its queue gauges); None: each router's id; the handle counter's is Serve's
    ``application#deployment#handle``."""
    registry, m = build(ROUTER_METRICS)
    for dep, route, app, hid, n in routed:
        hid = handle if handle is not None else hid
        m["ray_serve_num_router_requests"].labels(dep, route, app, hid, actor_id).inc(n)
        m["ray_serve_handle_request_counter"].labels(f"{app}#{dep}#{hid}", dep, route, app).inc(n)
    return list(registry.collect())


class _Families:
    """A collector that yields given families (``merged``)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merged(families: Iterable[Metric]) -> bytes:
    """One exposition of several processes' families: the samples of a family that several
    replicas export are put under one ``# HELP``/``# TYPE`` (a family may appear only once in a
    scrape; concatenated expositions would repeat it), and a counter's or histogram's series that
    several export with the same labels (the HTTP requests the ingress and, on the direct data plane,
    each replica counted) summed into one (a series may appear only once)."""
    out: dict[str, Metric] = {}
    index: dict[tuple[str, str, tuple], int] = {}
    for fam in families:
        into = out.get(fam.name)
        if into is None:
            into = out[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        summed = fam.type in ("counter", "histogram", "summary")
        for sample in fam.samples:
            key = (fam.name, sample.name, tuple(sorted(sample.labels.items())))
            at = index.get(key) if summed else None
            if at is None:
                index[key] = len(into.samples)
                into.samples.append(sample)
            elif not sample.name.endswith("_created"):  # (a creation time is not summed: the first kept)
                into.samples[at] = into.samples[at]._replace(value=into.samples[at].value + sample.value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(out.values())))
    return generate_latest(registry)


_SERVING = frozenset({rc.Phase.RUNNING, rc.Phase.RECONFIGURING})

#: Serve's ``DeploymentStatus.to_numeric`` (``ray/serve/_private/common.py``, Ray 2.60); another word: 0
DEPLOYMENT_STATUS_NUMERIC: dict[str, int] = {"DEPLOY_FAILED": 1, "UNHEALTHY": 2, "UPDATING": 3, "UPSCALING": 4,
                                             "DOWNSCALING": 5, "HEALTHY": 6}


#: Serve's ``ApplicationStatus.to_numeric`` (``ray/serve/schema.py``, Ray 2.60); another word: 0
APPLICATION_STATUS_NUMERIC: dict[str, int] = {"DEPLOY_FAILED": 1, "UNHEALTHY": 2, "NOT_STARTED": 3, "DELETING": 4,
                                              "DEPLOYING": 5, "RUNNING": 6}


def application_status(statuses: Iterable[str]) -> str:
    """An application's status (Serve's ``ApplicationStatus`` word) from its deployments' as ``rankcore
    status`` shows them (the core's status; ``DELETING`` for one being deleted): ``api/apps.py``'s
    rule (``_app_status``), written again here because apps.py imports the ingress, which imports this
    module; tests/unit/test_metrics_more.py holds the two to the same answers."""
    seen = set(statuses)
    if "UNHEALTHY" in seen:
        return "UNHEALTHY"
    if "DEPLOY_FAILED" in seen:
        return "DEPLOY_FAILED"
    if seen == {"HEALTHY"}:
        return "RUNNING"
    return "DELETING" if "DELETING" in seen else "DEPLOYING"


class ControllerMetrics:
    """The controller's metrics. ``observe`` is a driver observer (after every step);
    ``transferred`` is told of each weights move carried out; ``loop`` of each cluster pass;
    ``health_checked`` of each health check's time; ``refresh(state)`` sets the gauges that read the
    state, just before a scrape. ``clock`` (seconds, monotonic) times a replica's start, reconfigure
    and stop: from the step that ordered it to the step its answer was fed in."""

    def __init__(self, actor_id: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.registry, self.m = build(CONTROLLER_METRICS)
        self.actor_id = actor_id
        self.loops = 0
        self.clock = clock
        #: replica id -> (when, deployment) of its StartReplica / StopReplica, until its answer
        self._starting: dict[str, tuple[float, str]] = {}
        self._stopping: dict[str, tuple[float, str]] = {}
        #: replica id -> (when, deployment, version) of its last ReconfigureReplica, until answered
        self._reconfiguring: dict[str, tuple[float, str, int]] = {}
        #: node id -> its IP address ("": not known); the controller gives a lookup of Ray's nodes
        self.node_ip: Callable[[str], str] = lambda node_id: ""
        #: node id -> the status number of a proxy the core stopped there (5 DRAINED, 3 UNHEALTHY), kept
        #: until a proxy is in the book there again (Serve's gauge keeps its last value)
        self._proxies_gone: dict[str, int] = {}

    def observe(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        """What the core decided in one step: compactions (each rank change, by level), and its
        reconfigure, tier and weights commands; and how long a replica's start, reconfigure or stop
        took, from the step that ordered it to this one, which its answer fed (O(1) a step, but for
        the commands it gave)."""
        m = self.m
        m["rankcore_core_steps"].inc()
        kind = type(event)
        if kind in _ANSWERS:
            self._answered(kind, event, result.stale)
        for comp in result.compactions:
            m["rankcore_compactions"].labels(comp.deployment, _app(comp.deployment)).inc()
            for ch in comp.changes:
                for level in moved_levels(ch.old.as_tuple(), ch.new.as_tuple()):
                    m["rankcore_rank_reassignments"].labels(comp.deployment, _app(comp.deployment), level).inc()
        for cmd in result.commands:
            kind = type(cmd)
            move = _MOVES.get(kind)
            if kind is rc.StartReplica:
                self._starting[cmd.replica_id] = (self.clock(), cmd.deployment)
            elif kind is rc.StopReplica:
                rid = cmd.replica_id
                self._stopping[rid] = (self.clock(), cmd.deployment)
                self._starting.pop(rid, None)  # (stopped before it was ready, or while it reconfigured:
                self._reconfiguring.pop(rid, None)  # no answer to time)
            elif kind is rc.ReconfigureReplica:
                self._reconfiguring[cmd.replica_id] = (self.clock(), cmd.deployment, cmd.version)
                m["rankcore_reconfigures"].labels(cmd.deployment, _app(cmd.deployment), cmd.reason).inc()
            elif kind is rc.UpdateWeights:
                m["rankcore_weight_updates"].labels(cmd.deployment, _app(cmd.deployment)).inc()
            elif kind is rc.StopProxy:
                if cmd.reason == "node_lost":
                    self._proxies_gone.pop(cmd.node_id, None)
                else:
                    self._proxies_gone[cmd.node_id] = PROXY_STATUS_NUMERIC[
                        "DRAINED" if cmd.reason in ("drained", "not_needed") else "UNHEALTHY"]
            elif move is not None:
                name = move if kind is not rc.EvictReplica else f"evict_{cmd.to}"
                m["rankcore_tier_moves"].labels(cmd.deployment, _app(cmd.deployment), name).inc()
        if type(event) is rc.WeightsPushed and not result.stale:
            dep = event.deployment
            m["rankcore_weight_pushes"].labels(dep, _app(dep)).inc()
        elif type(event) is rc.HealthChecked and not event.healthy:
            rid = event.replica_id
            held = before.index.get(rid)
            if held is not None:  # (a replica the core does not hold: no deployment to count it under)
                m["ray_serve_health_check_failures"].labels(held, rid, _app(held)).inc()

    def _answered(self, kind: type, event: Any, stale: bool) -> None:
        """A replica's answer to a StartReplica (``ReplicaReady``), a ReconfigureReplica
        (``ReplicaReconfigured``, of that version or a later one) or a StopReplica (``ReplicaStopped``):
        its time observed (not for news the core found stale); a crash ends the wait for any."""
        rid = event.replica_id
        if kind is rc.ReplicaCrashed:
            self._starting.pop(rid, None)
            self._reconfiguring.pop(rid, None)
            self._stopping.pop(rid, None)
            return
        if kind is rc.ReplicaReady:
            began, name = self._starting.pop(rid, None) or (None, "")
            metric = "ray_serve_replica_startup_latency_ms"
        elif kind is rc.ReplicaStopped:
            began, name = self._stopping.pop(rid, None) or (None, "")
            metric = "ray_serve_replica_shutdown_duration_ms"
        else:
            sent = self._reconfiguring.get(rid)
            if sent is None or event.version < sent[2]:
                return  # (an answer to an older one: the last is still awaited)
            del self._reconfiguring[rid]
            began, name, _ = sent
            metric = "ray_serve_replica_reconfigure_latency_ms"
        if began is not None and not stale:
            self.m[metric].labels(name, _app(name)).observe((self.clock() - began) * 1000.0)

    def health_checked(self, deployment: str, ms: float) -> None:
        """One health check of a replica of ``deployment`` ended after ``ms``: answered or timed out
        (``observe.Watcher.health_checks``; Serve times no check that raised)."""
        self.m["ray_serve_health_check_latency_ms"].labels(deployment, _app(deployment)).observe(ms)

    def proxy_stopped(self, node_id: str, ms: float) -> None:
        """A proxy on ``node_id`` took ``ms`` to stop (``proxies.Proxies``: its server closed, its actor
        killed)."""
        self.m["ray_serve_proxy_shutdown_duration_ms"].labels(node_id, self.node_ip(node_id)).observe(ms)

    def transferred(self, deployment: str, what: str, nbytes: int) -> None:
        self.m["rankcore_tier_bytes"].labels(deployment, _app(deployment), what).inc(nbytes)

    def loop(self, seconds: float) -> None:
        self.loops += 1
        self.m["ray_serve_controller_control_loop_duration_s"].set(seconds)
        self.m["ray_serve_controller_num_control_loops"].labels(self.actor_id).set(self.loops)

    def refresh(self, state: rc.State, rejected: int = 0) -> None:
        """The gauges that read the controller's state: replica health, target, status, an autoscaled
        deployment's target ongoing requests, replicas by phase, each application's status (from its
        deployments the core holds: ``application_status``), events rejected. Cleared first, so a
        deleted deployment's series go. Forgets the starts, reconfigures and stops awaited of
        replicas the core no longer holds (lost with their node, or their deployment deleted)."""
        self.m["rankcore_rejected_events"].set(rejected)
        healthy, target, phases, status, ongoing, app_status = (
            self.m["ray_serve_deployment_replica_healthy"], self.m["ray_serve_autoscaling_target_replicas"],
            self.m["rankcore_deployment_replicas"], self.m["ray_serve_deployment_status"],
            self.m["ray_serve_autoscaling_target_ongoing_requests"], self.m["ray_serve_application_status"])
        for g in (healthy, target, phases, status, ongoing, app_status):
            g.clear()
        for waits in (self._starting, self._reconfiguring, self._stopping):
            for rid in [rid for rid in waits if rid not in state.index]:
                del waits[rid]
        names = _apps_table()
        apps: dict[str, list[str]] = {}
        for name, dep in state.deployments.items():
            app = names.get(name, name)
            apps.setdefault(app, []).append("DELETING" if dep.deleting else dep.status)
            target.labels(name, app).set(dep.target)
            status.labels(name, app).set(DEPLOYMENT_STATUS_NUMERIC.get(dep.status, 0))
            auto = dep.config.autoscaler
            if auto.autoscaling:
                ongoing.labels(name, app).set(auto.target_ongoing_requests)
            counts: dict[str, int] = {}
            for rid, rep in dep.replicas.items():
                counts[rep.phase.value] = counts.get(rep.phase.value, 0) + 1
                if rep.phase in rc.LIVE:
                    healthy.labels(name, rid, app).set(1 if rep.phase in _SERVING else 0)
            for phase, n in counts.items():
                phases.labels(name, app, phase).set(n)
        for app, statuses in apps.items():
            app_status.labels(app).set(APPLICATION_STATUS_NUMERIC.get(application_status(statuses), 0))
        self._refresh_proxies(state)

    def _refresh_proxies(self, state: rc.State) -> None:
        """``ray_serve_proxy_status``: each proxy in the core's book by its phase (Serve's numbers,
        ``PROXY_STATUS_NUMERIC``), and a node whose proxy the core stopped by how it went."""
        gauge = self.m["ray_serve_proxy_status"]
        gauge.clear()
        book = state.proxies.proxies
        for node in [n for n in self._proxies_gone if n in book]:
            del self._proxies_gone[node]
        for node, number in self._proxies_gone.items():
            gauge.labels(node, self.node_ip(node)).set(number)
        for node, proxy in book.items():
            gauge.labels(node, self.node_ip(node)).set(_PROXY_STATUS[proxy.phase])

    def exposition(self, state: rc.State, rejected: int = 0) -> bytes:
        self.refresh(state, rejected)
        return generate_latest(self.registry)


#: Serve's ``ProxyStatus.to_numeric``
PROXY_STATUS_NUMERIC = {"STARTING": 1, "HEALTHY": 2, "UNHEALTHY": 3, "DRAINING": 4, "DRAINED": 5}
#: the core's proxy phase -> Serve's status number (BACKOFF: it died or failed its checks, and restarts)
_PROXY_STATUS = {phase: PROXY_STATUS_NUMERIC[name] for phase, name in (
    (rc.ProxyPhase.STARTING, "STARTING"), (rc.ProxyPhase.HEALTHY, "HEALTHY"), (rc.ProxyPhase.DRAINING, "DRAINING"),
    (rc.ProxyPhase.BACKOFF, "UNHEALTHY"))}

#: the events that answer a replica's start, reconfigure or stop (or end the wait: a crash)
_ANSWERS = frozenset({rc.ReplicaReady, rc.ReplicaReconfigured, rc.ReplicaStopped, rc.ReplicaCrashed})

_MOVES: dict[type, str] = {rc.OffloadReplica: "offload", rc.LoadReplica: "load", rc.EvictReplica: "evict",
                           rc.DropWarmCopy: "drop_warm"}
