"""The proxies as the core sees them (issue 38): where the ingress runs, one per node.

A proxy is a managed kind like a replica, but one per node and with no rank:
the core decides on which nodes one runs (``proxy_location``, Ray Serve's
names), starts, drains, stops and restarts them (``rankcore.control.proxies``);
the executor runs them and reports what happened. Records only here: the
options (declared once: every surface reads them from ``ProxyOptions``), each
proxy's record and the book the state keeps of them.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import enum
import math

import attrs
import immutables

from . import fields as f
from .errors import InvalidConfig
from .options import RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S

__all__ = ["ProxyLocation", "PROXY_LOCATIONS", "ProxyPhase", "ProxyOptions", "Proxy", "ProxyBook",
           "PROXY_READY_CHECK_TIMEOUT_S", "PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD", "PROXY_MIN_DRAINING_PERIOD_S",
           "PROXY_RESTART_BACKOFF_S", "PROXY_RESTART_BACKOFF_MAX_S", "proxy_id"]


class ProxyLocation(str, enum.Enum):
    """Where proxies run (Ray Serve's ``ProxyLocation``): ``HeadOnly`` on the head node only,
    ``EveryNode`` on the head node and every node that holds a replica (Serve's default and
    ours), ``Disabled`` nowhere."""

    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"
    Disabled = "Disabled"

    def __repr__(self) -> str:
        return f"ProxyLocation.{self.name}"


PROXY_LOCATIONS = tuple(loc.value for loc in ProxyLocation)

# Ray Serve's values (ray/serve/_private/constants.py) where it has one.
#: a proxy not ready this long after its start is stopped and started again
PROXY_READY_CHECK_TIMEOUT_S = 5.0
#: this many failed health checks in a row make a proxy unhealthy: it is stopped and started again
PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD = 3
#: a draining proxy stops no sooner than this after its drain began (and only with nothing in flight)
PROXY_MIN_DRAINING_PERIOD_S = 30.0
#: ours (Serve restarts a dead proxy at its next control loop): a proxy that dies before it was
#: ever ready again is restarted after a doubling backoff, as a replica's failed starts are
#: (``rankcore.placement.restarts``): at once, then 1, 2, 4 ... 64 s
PROXY_RESTART_BACKOFF_S, PROXY_RESTART_BACKOFF_MAX_S = RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S


def _location(value: object) -> object:
    if isinstance(value, str) and not isinstance(value, ProxyLocation):  # ("EveryNode", "every_node", "everynode")
        key = value.replace("_", "").replace("-", "").lower()
        for loc in ProxyLocation:
            if key == loc.value.lower():
                return loc
    return value


def _check_location(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, ProxyLocation):
        raise InvalidConfig(f"proxy_location must be one of {', '.join(PROXY_LOCATIONS)}, got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class ProxyOptions:
    """The proxies' options, declared once (``ProxiesConfigured`` carries one; the Ray
    executor's ``start(proxy_location=...)`` and a scenario's ``proxies:`` read it)."""

    #: where proxies run (``ProxyLocation``; a string of its name is accepted)
    proxy_location: ProxyLocation = attrs.field(default=ProxyLocation.EveryNode, converter=_location,
                                                validator=_check_location)
    #: Serve's PROXY_READY_CHECK_TIMEOUT_S
    ready_check_timeout_s: float = attrs.field(default=PROXY_READY_CHECK_TIMEOUT_S, validator=f.positive_seconds)
    #: Serve's PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD
    health_check_unhealthy_threshold: int = attrs.field(default=PROXY_HEALTH_CHECK_UNHEALTHY_THRESHOLD,
                                                        validator=f.positive_int)
    #: Serve's PROXY_MIN_DRAINING_PERIOD_S
    min_draining_period_s: float = attrs.field(default=PROXY_MIN_DRAINING_PERIOD_S, validator=f.seconds)
    restart_backoff_s: float = attrs.field(default=PROXY_RESTART_BACKOFF_S, validator=f.seconds)
    restart_backoff_max_s: float = attrs.field(default=PROXY_RESTART_BACKOFF_MAX_S, validator=f.seconds)


class ProxyPhase(str, enum.Enum):
    """Where a node's proxy is (Ray Serve's ``ProxyStatus`` where it has one)."""

    STARTING = "starting"  # StartProxy sent; not ready yet (ready deadline armed when the core has a clock)
    HEALTHY = "healthy"  # ready and serving
    DRAINING = "draining"  # its node needs none any more: /-/healthz answers 503, in-flight requests finish
    BACKOFF = "backoff"  # died (or was stopped as unhealthy): its restart waits out a backoff

    def __repr__(self) -> str:
        return f"ProxyPhase.{self.name}"


def proxy_id(node_id: str, n: int) -> str:
    """The ``n``-th proxy the core started: named for its node, numbered so that news of an
    older incarnation is told apart (``proxy:<node>#<n>``)."""
    return f"proxy:{node_id}#{n}"


@attrs.frozen(kw_only=True)
class Proxy:
    """One node's proxy. ``deadline``: when the core acts on it unasked (STARTING: its
    ready check times out; DRAINING: the drain may end; BACKOFF: it starts again); inf: never."""

    proxy_id: str
    node_id: str
    phase: ProxyPhase
    deadline: float = math.inf
    #: health checks failed in a row
    failures: int = 0
    #: deaths in a row before it was ever ready (the backoff doubles with each)
    restarts: int = 0
    #: requests in flight at its last report (None: none reported since its drain began)
    ongoing: int | None = None


@attrs.frozen(kw_only=True)
class ProxyBook:
    """Every proxy the core runs, by node, and what decides where they run.
    ``options`` None: the core manages no proxies (embedders with an ingress of their own;
    the simulator without a ``proxies:`` section)."""

    options: ProxyOptions | None = None
    #: the head node (Serve: the controller's node): it has a proxy under HeadOnly and EveryNode
    head: str | None = None
    #: node id -> its proxy (at most one a node: the map says so)
    proxies: immutables.Map = attrs.field(factory=immutables.Map)
    #: nodes being drained (``NodeDraining``): their proxies drain
    draining: frozenset = frozenset()
    #: proxies ever started (numbers the next one); the earliest deadline is ``Cluster.proxies_at``
    started: int = 0

    @property
    def managed(self) -> bool:
        return self.options is not None
