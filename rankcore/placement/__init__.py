"""Placement: which node a replica goes to and what it books there.

``policies`` (spread / pack / rank_packed, gangs' node choice), ``scheduling``
(the waiting queue, bookings, the end-of-step placement walk), ``clustertx``
(one step's working copy of the cluster), ``static`` (a caller's placement
group: every move of static placement), ``gangs`` (every move of a gang) and
``spares`` (which nodes keep idle processes for a crash's replacement).

``rankcore.placement`` is also the public namespace of the placement policies
(``rankcore.placement.choose_node``, ``POLICIES``, ``NodeView``, ...), as it
was before the planes had folders.
"""

from .policies import POLICIES, NodeView, choose_gang, choose_node, packing_gap

__all__ = ["POLICIES", "NodeView", "choose_node", "choose_gang", "packing_gap"]
