"""The request plane: sans-IO, not through ``step`` (docs/requests.md).

``machine`` (``RequestMachine``: per deployment a FIFO queue, least-loaded
dispatch, retries, cancellation, deadlines), ``queue`` and ``records``. It
imports only the base; it learns who serves from the control plane's pool
commands (``rankcore.control.pool``).

``rankcore.requests`` is the public namespace of the machine, as before.
"""

from .machine import *  # noqa: F403  (the public namespace: machine.__all__)
from .machine import __all__ as __all__
