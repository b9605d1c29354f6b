"""Choice rules the core applies, as data and small pure functions, in a
module beneath both the event handlers and the recovery rebuild.

Downscale victims: named victims first, then replicas not yet serving
(pending before starting), then the highest global ranks, so the ranks that
stay are the low, contiguous ones and the fewest replicas move later.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from .lifecycle import Phase

__all__ = ["VICTIM_ORDER"]

#: Sort key of a downscale victim by phase (lower goes first).
VICTIM_ORDER = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2, Phase.RECONFIGURING: 2, Phase.FAILED: -1}
