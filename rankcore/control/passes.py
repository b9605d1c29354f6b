"""The end-of-step work, as a named list of passes, and ``finish``, which runs it.

Every handler ends with ``finish(tx)``: the passes run in this order over what
the step did, then the step is built (``transaction.build``). Each pass skips
itself when there is nothing for it (the common step runs none of them past a
test of one field):

0. ``rollouts``: touched deployments with a rollout under way retire the outdated
   replicas they may now (``rollouts.advance_touched``);
1. ``place_waiting``: the waiting queue is walked once every release of the
   step is done (``placing.place_waiting``; only when the step opened the
   cluster's working copy and someone waits, not blocked);
2. ``wakes``: sleeping replicas that wait for GPU room on their node try again
   (``evictions.retry_wakes``); ``evictions``: the evictions chosen in the
   step are sent, the victims' replacements started (``evictions.carry_out``);
3. ``ticks``: a ``ScheduleTick`` per deadline armed this step (``deadlines.ticks``);
4. ``gangs``: gang members started this step are told their gang (``gangs.tell``);
5. ``compaction``: each touched deployment that is healthy with holes in its
   ranks is compacted (``moves.compact_touched``);
6. ``groups``: each collective group of a touched deployment whose members changed, once all
   are up, gets a new epoch and each member one ``ReformGroup`` (``groups.reform_touched``; after
   the compaction, so a moved member re-forms on its new rank);
7. ``deletions``: deployments being deleted whose last replica has gone leave,
   with their WARM copies (``deletion.sweep``);
8. ``proxies``: the proxies are made to match where they should run, and their deadlines
   acted on (``proxies.reconcile``; only when the core runs proxies and the step changed
   them, the nodes or reached a proxy's deadline);
9. ``spares``: nodes whose set of replicas of a deployment changed are told
   how many spare processes to keep (``spares.announce``);
10. ``demand``: when the step changed what waits for room (or, while anything
   waits, what the nodes hold), the autoscaler is told the new demand
   (``demand.announce``; last: every pass above may queue or place).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Callable

from ..base.state import RecoveryOutcome, Step
from ..base.transaction import Tx, build
from ..placement import deadlines, demand, gangs, spares
from . import configs, deletion, evictions, groups, moves, proxies, rollouts
from .placing import place_waiting

__all__ = ["PASSES", "finish"]


def _place_waiting(tx: Tx) -> None:
    if tx.working is not None:
        place_waiting(tx)


#: the end-of-step passes, in the order they run: (name, pass)
PASSES: tuple[tuple[str, Callable[[Tx], None]], ...] = (
    ("rollouts", rollouts.advance_touched),
    ("configs", configs.pace_touched),
    ("place_waiting", _place_waiting),
    ("wakes", evictions.retry_wakes),
    ("evictions", evictions.carry_out),
    ("ticks", deadlines.ticks),
    ("gangs", gangs.tell),
    ("compaction", moves.compact_touched),
    ("groups", groups.reform_touched),
    ("deletions", deletion.sweep),
    ("proxies", proxies.reconcile),
    ("spares", spares.announce),
    ("demand", demand.announce),
)


def finish(tx: Tx, stale: bool = False, recovery: RecoveryOutcome | None = None, retell: bool = False) -> Step:
    """Run the end-of-step passes and build the step (``stale``: the event changed nothing;
    ``retell``: a recovery, whose demand pass tells the demand even unchanged, ``demand.tell``)."""
    for _, run in PASSES:
        if retell and run is demand.announce:
            demand.tell(tx)
        else:
            run(tx)
    return build(tx, stale, recovery)
