"""The control plane: what happens to replicas over time.

``transaction`` (one step's work in progress and the primitives every rule
stands on), ``moves`` (start, stop, scale, crash, compaction), ``restarts``
(failed starts, backoff), ``deadlines`` and ``clock`` (time's rules),
``health``, ``recovery`` (a controller's restart), ``deletion``,
``autoscaling``, ``pool`` (who serves, told to the request plane) and
``passes`` (the end-of-step work every handler finishes with).
"""
