"""Which replica stopped answering while the others answer: outlier detection by silence (issue 65).

A replica whose process is frozen (``SIGSTOP``, a wedged GIL, a host swapping) still looks alive to
its controller until health checks time out (Serve's default: 30 s), and a router keeps sending it
work that waits there. Envoy's answer is outlier detection: a host that misbehaves while its peers
do not is ejected from the load balancer for a while. Here the sign is silence, and the rule is one
function so the request machine and its tests read the same thing: a replica is *quiet* when

* it holds a request that has sent no sign of life (dispatched, not started) for ``after_s`` or more,
* it itself reported nothing (an answer, a start) in the last ``after_s``, and
* a peer of the same deployment reported something since that request was sent and within ``after_s``.

A quiet replica gets no new request until it reports something again (then it is back at once);
the requests it holds stay its own: whether one began there cannot be told from outside while
the process lives, and a frozen process may thaw and run it. Peers answering is what makes it an
outlier: when the whole deployment is slow (a long model call, a cold cache), nobody is quiet.

Internal module: ``rankcore.requests.RequestMachine`` uses it (``quiet_after_s``).
"""

from __future__ import annotations

__all__ = ["QUIET_AFTER_S", "quiet"]

#: the silence after which a replica whose peers answer is left out of new work (seconds of the
#: request machine's clock: ``Tick``); a frozen replica is noticed this long after its oldest call
QUIET_AFTER_S = 5.0


def quiet(now: float, oldest_silent: float | None, heard: float | None, peers_heard: float | None,
          after_s: float) -> bool:
    """Whether a replica is quiet at ``now`` (module docstring): ``oldest_silent``, when its oldest
    request with no sign of life was sent (None: it holds none); ``heard``, when it last reported
    something (None: never); ``peers_heard``, when any replica of its deployment last did (its own
    reports included: then ``heard`` is as recent, and it is not quiet)."""
    if oldest_silent is None or now - oldest_silent < after_s:
        return False
    if heard is not None and now - heard < after_s:
        return False
    return peers_heard is not None and peers_heard >= oldest_silent and now - peers_heard < after_s
