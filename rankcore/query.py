"""What an executor asks of a state, under one name (``rc.query``): the questions a backend, a
status page or a recovery asks between steps, each answered by the rule that owns it.

* ``desired_specs`` / ``desired_deleted`` / ``desired_asleep`` / ``desired_weights`` /
  ``desired_no_evict``: what to persist so a recovery can rebuild the state
  (``rankcore.base.state``);
* ``is_serving`` / ``fully_serving``: whether a replica takes traffic now, whether a deployment's
  every replica does (``rankcore.tiers.residency``);
* ``is_held``: a gang member's rollout successor held for its gang, told from one waiting out a
  restart backoff (``rankcore.placement.gangs``);
* ``blue_green_role`` / ``shown_ranks``: a replica's part in a blue-green update and the ranks it
  is told (``rankcore.control.bluegreen``);
* ``serving_proxies`` / ``proxy_nodes`` / ``parse_proxy_id``: the proxies that serve, the nodes
  that should run one, a proxy id's parts (``rankcore.control.proxies``);
* ``parse_replica_number``: the number in a replica id the core gave (``rankcore.base.state``).

Public (docs/embedding.md, "What you may import"): ``rankcore.__all__`` keeps the events, the
commands, ``step`` / ``run`` / ``State`` and its records, and the errors.
"""

from __future__ import annotations

from .base.state import (
    desired_asleep,
    desired_deleted,
    desired_no_evict,
    desired_specs,
    desired_weights,
    parse_replica_number,
)
from .control.bluegreen import role as blue_green_role
from .control.bluegreen import shown_ranks
from .control.proxies import parse_proxy_id
from .control.proxies import serving as serving_proxies
from .control.proxies import wanted as proxy_nodes
from .placement.gangs import is_held
from .tiers.residency import fully_serving
from .tiers.residency import serving as is_serving

__all__ = ["desired_specs", "desired_deleted", "desired_asleep", "desired_weights", "desired_no_evict",
           "is_serving", "fully_serving", "is_held", "blue_green_role", "shown_ranks", "serving_proxies",
           "proxy_nodes", "parse_proxy_id", "parse_replica_number"]
