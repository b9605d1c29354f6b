"""The request plane: sans-IO, not through ``step`` (docs/requests.md).

``machine`` (``RequestMachine``: per deployment a FIFO queue, least-loaded
dispatch, retries, cancellation, deadlines), ``queue`` and ``records``, and
``batcher`` (``Batcher``: when a replica's batch closes, issue 39) and ``multiplex`` (which
replica gets a request for a multiplexed model, ``route_model``; which models a replica keeps,
``ModelCache``), ``routing`` (which candidate replica a request goes to: a deployment's router,
``Configure.request_router``; issue 68), and ``dataplane`` (what a compiled balancer in front of the replicas holds: the
direct data plane's table, issue 65). It imports only the base; it learns who serves from the control plane's pool
commands (``rankcore.control.pool``).

``rankcore.requests`` is the public namespace of the machine, the batcher and multiplexing.
"""

from . import dataplane
from .batcher import *  # noqa: F403  (batcher.__all__)
from .batcher import __all__ as _batcher_all
from .machine import *  # noqa: F403  (the public namespace: machine.__all__)
from .machine import __all__ as _machine_all
from .multiplex import *  # noqa: F403  (multiplex.__all__)
from .multiplex import __all__ as _multiplex_all
from .routing import *  # noqa: F403  (routing.__all__)
from .routing import __all__ as _routing_all

__all__ = [*_machine_all, *_batcher_all, *(n for n in _multiplex_all if n not in _machine_all), *_routing_all,
           "dataplane"]
