"""The deployment options that executors honour, and their defaults, declared once.

Ray Serve's names and values where it has the option (ray/serve/_private/constants.py,
2.60); ``DeploymentApplied`` declares each option with its default from here, the
commands carry the values, and every executor and scenario surface reads them from
there, never from a constant of its own.
"""

from __future__ import annotations

import attrs

__all__ = [
    "Options",
    "HEALTH_CHECK_PERIOD_S", "HEALTH_CHECK_TIMEOUT_S", "HEALTH_CHECK_FAILURE_THRESHOLD",
    "GRACEFUL_SHUTDOWN_WAIT_LOOP_S", "GRACEFUL_SHUTDOWN_TIMEOUT_S", "MAX_CONSTRUCTOR_RETRY_COUNT",
    "MAX_PER_REPLICA_RETRY_COUNT", "PLACEMENT_TIMEOUT_S", "SPARE_PROCESSES", "RESTART_BACKOFF_S", "RESTART_BACKOFF_MAX_S", "OPTION_NAMES", "DEFAULT_OPTIONS",
]

HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 30.0
#: REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD
HEALTH_CHECK_FAILURE_THRESHOLD = 3
GRACEFUL_SHUTDOWN_WAIT_LOOP_S = 2.0
GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
#: DEFAULT_CONSTRUCTOR_RETRY_COUNT (the deployment is UNHEALTHY after min(this, 3 x target))
MAX_CONSTRUCTOR_RETRY_COUNT = 20
#: ours (Ray Serve has none): how long a PlaceReplica may go unanswered (the Ray executor waited
#: 10 s for a placement group pinned to a node before this was a core rule)
PLACEMENT_TIMEOUT_S = 10.0
#: ours (Ray Serve retries a failing constructor at once): restart backoff, doubling, capped
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 64.0
#: ours (Ray Serve has none): started, idle worker processes kept on each node holding a replica,
#: so a replacement there skips the process start (rankcore.spares); 0: none (each costs a
#: Python process's memory on every such node, no GPU)
SPARE_PROCESSES = 0

#: MAX_PER_REPLICA_RETRY_COUNT: the UNHEALTHY threshold is min(MAX_CONSTRUCTOR_RETRY_COUNT, this x target)
MAX_PER_REPLICA_RETRY_COUNT = 3


@attrs.frozen(kw_only=True, weakref_slot=False)
class Options:
    """A deployment's health, shutdown, placement-timeout, restart and spare-process options, as
    ``DeploymentApplied`` gave them (one slot on ``Deployment``: the hot path copies
    deployments, and these change only with a new ``DeploymentApplied``)."""

    health_check_period_s: float = HEALTH_CHECK_PERIOD_S
    health_check_timeout_s: float = HEALTH_CHECK_TIMEOUT_S
    health_check_failure_threshold: int = HEALTH_CHECK_FAILURE_THRESHOLD
    graceful_shutdown_wait_loop_s: float = GRACEFUL_SHUTDOWN_WAIT_LOOP_S
    graceful_shutdown_timeout_s: float = GRACEFUL_SHUTDOWN_TIMEOUT_S
    placement_timeout_s: float | None = PLACEMENT_TIMEOUT_S
    restart_backoff_s: float = RESTART_BACKOFF_S
    restart_backoff_max_s: float = RESTART_BACKOFF_MAX_S
    max_constructor_retry_count: int = MAX_CONSTRUCTOR_RETRY_COUNT
    spare_processes: int = SPARE_PROCESSES

    @classmethod
    def of(cls, spec: object) -> Options:
        """The options a ``DeploymentApplied`` (or anything with these attributes) declares."""
        return cls(**{a.name: getattr(spec, a.name) for a in attrs.fields(cls)})


#: the names of the options (``DeploymentApplied`` fields, ``Options`` fields, scenario keys)
OPTION_NAMES: tuple[str, ...] = tuple(a.name for a in attrs.fields(Options))
DEFAULT_OPTIONS = Options()
