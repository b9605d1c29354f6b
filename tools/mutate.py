#!/usr/bin/env python
"""Mutation sweep: break one rule of ranks at a time and check the tests notice.

Each mutation in ``MUTATIONS`` is a named, deliberate rule break: exact source
snippets to find in ``rankcore/`` and what to put instead. The tool
snapshots the working tree once (tracked files and untracked, non-ignored
ones, uncommitted edits included; or a commit, with ``--rev``), and for each
mutation copies that snapshot to a temporary directory, applies the patch, and
runs the fast suite there (``tests/unit tests/property``) with this repo's
interpreter and ``PYTHONPATH`` pointing at the copy, so the mutated
``rankcore`` is the one imported, not the editable install (a tiny pytest
plugin checks that inside the very process that runs the tests).

* KILLED: the suite failed (good: the rule is guarded);
* SURVIVED: the suite passed (a rule can break without any test noticing);
* TIMEOUT: the suite did not finish in time (counted as killed, shown apart);
* ERROR: the mutation could not be tested (its snippet is not in the code
  exactly once, the copy's imports went elsewhere, pytest refused the arguments).

Exit status: 0 when every mutation was killed, 1 when any survived, 2 on an
error (a snippet that no longer matches is an error: keep this list in sync
with the code). An unmutated copy is run first (the baseline); if it fails,
nothing else runs.

Run it before a release (it takes minutes, so it is not part of ``make test``):

    .venv/bin/python tools/mutate.py                 # the whole sweep
    .venv/bin/python tools/mutate.py --list          # what each mutation breaks
    .venv/bin/python tools/mutate.py --check         # only: does every snippet still match once?
    .venv/bin/python tools/mutate.py --only node-loss-reverse-order --jobs 2

See docs/mutation-testing.md.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
#: the first run of every mutant: the golden scripts (seconds) then the unit tests, stopping at the first failure
DEFAULT_PYTEST_ARGS = "-x -q -p no:cacheprovider tests/scenarios tests/unit"
#: run next, with the same options, only for a mutant the runs before it missed (minutes)
DEFAULT_THEN = ("tests/property",)
#: pytest exit status the probe plugin uses when the copy's rankcore was not the one imported
PROBE_RC = 97
PROBE_MODULE = "_rankcore_mutate_probe"
ENV_VAR = "RANKCORE_MUTATION"

KILLED, SURVIVED, TIMEOUT, ERROR = "killed", "survived", "timeout", "error"


class MutationError(Exception):
    """A mutation cannot be applied (its snippet is missing or ambiguous), or the setup is wrong."""


@dataclass(frozen=True)
class Edit:
    """Replace ``find`` (which must occur exactly once in ``file``) by ``replace``."""

    file: str
    find: str
    replace: str


@dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str  # the rule this mutation breaks, in one line
    edits: tuple[Edit, ...]
    #: tests run first for this mutant (the ones meant to kill it), before the common runs
    tests: tuple[str, ...] = ()

    @property
    def files(self) -> list[str]:
        return sorted({e.file for e in self.edits})


def mutation(name: str, file: str, find: str, replace: str, breaks: str,
             more: Sequence[Edit] = (), tests: Sequence[str] = ()) -> Mutation:
    """One mutation: an edit of ``file`` (plus ``more`` edits when one rule lives in several places);
    ``tests``: pytest paths to try first (the tests meant to kill it)."""
    return Mutation(name=name, breaks=breaks, edits=(Edit(file, find, replace), *more), tests=tuple(tests))


CORE, RECOVERY, RANKS = "rankcore/core.py", "rankcore/control/recovery.py", "rankcore/base/ranks.py"
TX, POLICIES = "rankcore/base/transaction.py", "rankcore/base/victims.py"
MOVES, GANGS, CLOCK = "rankcore/control/moves.py", "rankcore/placement/gangs.py", "rankcore/control/clock.py"
#: the fast paths repeat the plainest case of some rules: a mutant of such a
#: rule edits both copies, so it is killed by the rule's tests, not only by
#: the fast-path equivalence test
FAST = "rankcore/fastpaths.py"

# Snippets are exact text (indentation included); each must occur once in its file.
MUTATIONS: tuple[Mutation, ...] = (
    # ------------------------------------------------------------- the four of issue 8 point 12
    mutation(
        "node-loss-reverse-order", CORE,
        "        for rep in by_rank(dep, on_node):\n",
        "        for rep in reversed(by_rank(dep, on_node)):\n",
        "a lost node's replicas are replaced in rank order (lowest rank first), so ids follow ranks",
    ),
    mutation(
        "recovery-node-rank-minority", RECOVERY,
        "min(votes, key=lambda nr: (-votes[nr], nr))",
        "min(votes, key=lambda nr: (votes[nr], nr))",
        "at recovery a node keeps the node rank most of its replicas report (majority vote)",
    ),
    mutation(
        "assign-highest-free-rank", RANKS,
        "        ranks = list(islice(_bits_iter_free(d[_GBITS]), min(holes, k))) if holes else []\n",
        "        ranks = list(islice(_bits_iter_free(d[_GBITS]), holes))[::-1][:k] if holes else []\n",
        "new replicas get the lowest free global rank (here: the highest hole first)",
    ),
    mutation(
        "compact-when-unhealthy", MOVES,
        "    return dep.healthy and not dep.ranks.is_contiguous()",
        "    return not dep.ranks.is_contiguous()",
        "ranks are compacted only once the deployment is healthy",
    ),
    # ------------------------------------------------------------------------ core rules
    mutation(
        "crash-replacement-fresh-rank", TX,
        "    ranks = dep.ranks.replace(rid, new_id, node_id) if node_id is not None else dep.ranks.replace(rid, new_id)\n",
        "    ranks = dep.ranks.release(rid).assign(new_id, node_id, rank=dep.ranks.lowest_free())\n",
        "a crashed replica's replacement inherits its global rank",
        more=(
            Edit(FAST,
                 "    ranks = dep.ranks.replace(rid, new_id, node_id)\n",
                 "    ranks = dep.ranks.release(rid).assign(new_id, node_id, rank=dep.ranks.lowest_free())\n"),
        ),
    ),
    mutation(
        "scale-world-size-not-announced", MOVES,
        "        dep = _copy(dep, target=n)\n"
        "        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=n))\n"
        "    return reconcile(tx, dep, victims)\n",
        "        dep = _copy(dep, target=n)\n"
        "    return reconcile(tx, dep, victims)\n",
        "world_size is announced (UpdateWorldSize) the moment a ScaleRequested changes the target",
    ),
    mutation(
        "victims-lowest-rank-first", MOVES,
        "(VICTIM_ORDER[r.phase], -ranks.global_rank(r.replica_id), r.replica_id)",
        "(VICTIM_ORDER[r.phase], ranks.global_rank(r.replica_id), r.replica_id)",
        "downscale victims chosen by the core are the highest ranks (so fewer ranks move later)",
    ),
    mutation(
        "victims-running-before-pending", POLICIES,
        "VICTIM_ORDER = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2, Phase.RECONFIGURING: 2, Phase.FAILED: -1}",
        "VICTIM_ORDER = {Phase.PENDING: 2, Phase.STARTING: 1, Phase.RUNNING: 0, Phase.RECONFIGURING: 0, Phase.FAILED: -1}",
        "downscale stops not-yet-running replicas before running ones",
    ),
    mutation(
        "stale-reconfigure-ack-as-fresh", CORE,
        "    if e.version < rep.version or rep.phase is Phase.RUNNING:\n",
        "    if rep.phase is Phase.RUNNING:\n",
        "an answer to an older reconfigure is stale: the replica stays reconfiguring until the latest is acked",
    ),
    mutation(
        "release-rank-at-stop-command", MOVES,
        "        replicas = replicas.set(rid, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n"
        "        tx.emit(stop_command(dep, rid))\n",
        "        replicas = replicas.set(rid, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n"
        "        tx.emit(stop_command(dep, rid))\n"
        "        dep = _copy(dep, ranks=dep.ranks.release(rid))\n",
        "ranks are released only on ReplicaStopped, not when StopReplica is sent",
        more=(
            Edit(CORE,
                 "    tx.put(remove(tx, dep, rep, dep.ranks.release(rep.replica_id)))\n",
                 "    tx.put(remove(tx, dep, rep, dep.ranks))\n"),
            Edit(MOVES,
                 "        # it was leaving anyway, or is a blue-green's blue, whose green holds its ranks: no replacement\n"
                 "        return remove(tx, dep, rep, dep.ranks.release(rid))\n",
                 "        # it was leaving anyway, or is a blue-green's blue, whose green holds its ranks: no replacement\n"
                 "        return remove(tx, dep, rep, dep.ranks)\n"),
            Edit(FAST, "    ranks = dep0.ranks.release(rid)\n", "    ranks = dep0.ranks\n"),
        ),
    ),
    mutation(
        "compaction-without-reconfigure", MOVES,
        '        new, cmd = reconfigure(dep, rep, "rank")\n'
        "        replicas = replicas.set(new.replica_id, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n"
        "        tx.emit(cmd)\n",
        '        new, cmd = reconfigure(dep, rep, "rank")\n'
        "        replicas = replicas.set(new.replica_id, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n",
        "every replica whose rank a compaction changed gets a ReconfigureReplica carrying it",
    ),
    # --------------------------------------------------------------------- rank table
    mutation(
        "compaction-highest-mover-lowest-hole", RANKS,
        "new_rank = {owner[old]: new for old, new in zip(movers, holes)}",
        "new_rank = {owner[old]: new for old, new in zip(movers, reversed(holes))}",
        "compaction moves the lowest old rank into the lowest hole",
    ),
    mutation(
        "new-local-rank-above-highest", RANKS,
        "    return _lowest_zero(mask)\n\n\ndef _top(",
        "    return mask.bit_length()\n\n\ndef _top(",
        "a replica placed on a node gets the lowest free local rank there (not one above the highest)",
    ),
    # ----------------------------------------------------------------------- recovery
    mutation(
        "recovery-ignores-local-ranks", RECOVERY,
        "r.replica_id, r.rank.local_rank) for r in rs), MAX_LOCAL)",
        "r.replica_id, None) for r in rs), MAX_LOCAL)",
        "recovery keeps the local ranks replicas report",
    ),
    mutation(
        "recovery-leaving-claim-wins", RECOVERY,
        "(((_leaving(r), r.replica_id), r.replica_id, r.rank.rank) for r in reports), MAX_RANKS",
        "(((not _leaving(r), r.replica_id), r.replica_id, r.rank.rank) for r in reports), MAX_RANKS",
        "at recovery a global rank claimed twice goes to the serving replica, not the stopping one",
    ),
    mutation(
        "recovery-rank-update-dropped", RECOVERY,
        "rep = attrs.evolve(rep, rank_update_due=True)",
        "rep = attrs.evolve(rep, rank_update_due=False)",
        "a recovered, still-starting replica whose rank changed is told its new rank once ready",
    ),
    mutation(
        "recovery-world-size-not-announced", RECOVERY,
        "    if any(r.world_size is not None and r.world_size != spec.num_replicas for r in reports):\n",
        "    if False:\n",
        "recovery announces world_size when a replica reports a different one",
    ),
)

# ---------------------------------------------------------------- issue 20: every rule row
# One mutant per row of the rule tables of docs/architecture.md ("Placement",
# "Static placement and gangs", "Health, timeouts, restarts and shutdown",
# "Ranks") that the mutants above do not cover yet, and one per check function
# of rankcore/invariants.py (made a no-op). The row each breaks is named in
# ``breaks`` ("[table: row] ..."); docs/mutation-testing.md lists what killed each.
PLACEMENT, SCHED, STATIC_ = "rankcore/placement/policies.py", "rankcore/placement/scheduling.py", "rankcore/placement/static.py"
PLACING = "rankcore/control/placing.py"
HEALTH, RESTARTS, STATE = "rankcore/control/health.py", "rankcore/placement/restarts.py", "rankcore/base/state.py"
UNHEALTHY = "rankcore/base/unhealthy.py"
EVENTS, INVARIANTS = "rankcore/base/events.py", "rankcore/invariants.py"
TIMELINE = "executors/scenarios/timeline.py"

ISSUE20_RULES: tuple[Mutation, ...] = (
    # ---------------------------------------------------------- Placement: rules settled once
    mutation(
        "spread-tie-break-ignores-own-replicas", PLACEMENT,
        "(-n.free.get(main, 0.0), n.replicas, n.order)",
        "(-n.free.get(main, 0.0), n.order)",
        "[Placement: spread tie-break] on equal free room, spread prefers the node with fewer of the deployment's own replicas",
    ),
    mutation(
        "spread-least-free-first", PLACEMENT,
        "(-n.free.get(main, 0.0), n.replicas, n.order)",
        "(n.free.get(main, 0.0), n.replicas, n.order)",
        "[Placement: spread tie-break] spread picks the node with the most free units of the main resource",
    ),
    mutation(
        "crash-replacement-no-preferred-node", PLACING,
        "    if pref is not None and pref not in avoid and not cl.suspect(pref):\n",
        "    if False:\n",
        "[Placement: crash replacement] a replacement placed by the queue goes back to its predecessor's node when it has room",
    ),
    mutation(
        "crash-replacement-never-keeps-booking", MOVES,
        "    booking = keep_booking(tx, dep, rid, new_id) if managed and delay == 0 and avoid is None else None\n",
        "    booking = None\n",
        "[Placement: crash replacement] a crashed replica's booking passes to its replacement in the same step",
    ),
    mutation(
        "suspect-node-not-set-on-exited", CLOCK,
        '    if cause == "exited" and rep.node_id is not None and tx.managed and tx.view.clock:\n',
        '    if cause == "killed" and rep.node_id is not None and tx.managed and tx.view.clock:\n',
        "[Placement: suspect nodes] ReplicaCrashed(cause='exited') makes the node suspect (and only that cause)",
    ),
    mutation(
        "suspect-node-not-avoided", PLACING,
        "    if cl.suspects:\n        healthy = [v for v in views if not cl.suspect(v.node_id)]\n",
        "    if False:\n        healthy = [v for v in views if not cl.suspect(v.node_id)]\n",
        "[Placement: suspect nodes] a suspect node is avoided while another node has room",
    ),
    mutation(
        "suspect-node-never-forgiven", "rankcore/base/clustertx.py",
        "        return until is not None and until > self.now\n",
        "        return until is not None\n",
        "[Placement: suspect nodes] a node is suspect for suspect_s of core time only",
        # (both copies of 'only for suspect_s': either one alone is an equivalent mutant, see the doc)
        more=(Edit(CLOCK, "        cl.suspects = type(cl.suspects)({n: t for n, t in cl.suspects.items() if t > cl.now})\n",
                   "        pass\n"),),
    ),
    mutation(
        "start-timeout-ignored", CLOCK,
        "            elif current.phase is Phase.STARTING:  # its process hung in __init__\n",
        "            elif False:  # its process hung in __init__\n",
        "[Placement: start timeout] a replica not ready start_timeout_s after InitializeReplica is stopped and replaced",
    ),
    mutation(
        "node-lost-spares-reserved", CORE,
        "        on_node = [r for r in dep.replicas.values() if r.node_id == e.node_id]\n",
        "        on_node = [r for r in dep.replicas.values() if r.node_id == e.node_id and r.phase is not Phase.PENDING]\n",
        "[Placement: deaths on a node] NodeLost replaces every replica on the node, reserved ones included",
    ),
    mutation(
        "placement-order-reversed", MOVES,
        "        enqueue(tx, dep, [rid for rid in ids if rid not in waits])\n",
        "        enqueue(tx, dep, [rid for rid in ids if rid not in waits][::-1])\n",
        "[Placement: placement order] the core places in queue order, rank order within a step",
    ),
    mutation(
        "placement-failed-goes-to-back", SCHED,
        "    enqueue(tx, dep, [rep.replica_id], front=True)\n",
        "    enqueue(tx, dep, [rep.replica_id])\n",
        "[Placement: answers] after a PlacementFailed the replica is placed again first in line",
    ),
    mutation(
        "placement-failed-same-node-again", SCHED,
        "    avoid_node(tx, rep.replica_id, node_id)\n    dep = _copy(",
        "    dep = _copy(",
        "[Placement: answers] after a PlacementFailed the replica avoids that node (retry_s)",
    ),
    mutation(
        "pending-at-recovery-not-requeued", RECOVERY,
        "    if tx.managed:  # what the replicas hold where they run, and who still waits for a node\n"
        "        adopt(tx, sorted(specs))\n",
        "    if False:  # what the replicas hold where they run, and who still waits for a node\n"
        "        adopt(tx, sorted(specs))\n",
        "[Placement: pending at recovery] replicas reported pending keep their rank and are queued and placed again",
    ),
    mutation(
        "scale-never-deployed-refused", TIMELINE,
        "        if target.deployed(event.name):\n",
        "        if True:\n",
        "[Placement: scale of a never-deployed deployment] the scenario timeline deploys it",
    ),
    mutation(
        "crash-rank-n-highest-id", TIMELINE,
        "    return min(hits) if hits else None\n",
        "    return max(hits) if hits else None\n",
        "[Placement: \"crash rank N\"] the live replica holding rank N, the lowest id if several",
    ),
    mutation(
        "crash-rank-n-hits-stopping", TIMELINE,
        "    hits = [rid for rid, held, phase in replicas if held == rank and phase in _CRASHABLE]\n",
        "    hits = [rid for rid, held, phase in replicas if held == rank]\n",
        "[Placement: \"crash rank N\"] a stopping replica is not the one 'crash rank N' hits",
    ),
    mutation(
        "placed-on-lost-node-refused", CORE,
        "        if e.node_id in tx.view.lost:  # placed there as the node went: it went with it\n",
        "        if False:  # placed there as the node went: it went with it\n",
        "[Health: ReplicaPlaced on an unknown node] a node reported lost: the replica died with it and is replaced",
    ),
    # ----------------------------------------------------------------------- Placement: policies
    mutation(
        "pack-roomiest-node", PLACEMENT,
        "        return (n.free.get(main, 0.0), n.order)\n",
        "        return (-n.free.get(main, 0.0), n.order)\n",
        "[Placement: policies] pack picks the node with the least free room that fits",
    ),
    mutation(
        "rank-packed-ignores-previous-rank", PLACEMENT,
        '    if policy == "rank_packed" and rank is not None and rank > 0 and rank_nodes:\n',
        "    if False:\n",
        "[Placement: policies] rank_packed puts rank r on the node of rank r-1 when it has room",
    ),
    # ----------------------------------------------------------------------------- Static placement
    mutation(
        "static-crash-not-on-bundles", MOVES,
        "    if dep.static is not None:\n        return static.crash(tx, dep, rep)\n",
        "",
        "[Static: replica crash] a new incarnation on the same rank and bundles",
    ),
    mutation(
        "static-lost-bundle-restarts", STATIC_,
        "        if rep.phase is Phase.STOPPING or g not in lost:  # leaving anyway; or back on its bundles\n",
        "        if True:  # leaving anyway; or back on its bundles\n",
        "[Static: a node holding a bundle of rank N lost] the replica becomes FAILED and its process is stopped",
    ),
    mutation(
        "static-failed-not-restarted-on-bundles-placed", STATIC_,
        "            if static.placed(g):\n                dep = restart_failed(tx, dep, rep)\n",
        "            if False:\n                dep = restart_failed(tx, dep, rep)\n",
        "[Static: the caller's group has its bundles elsewhere] a FAILED rank whose bundles are all placed restarts there",
    ),
    mutation(
        "static-moved-bundle-not-followed", STATIC_,
        "        elif rep.phase is not Phase.STOPPING and rep.node_id is not None and rep.node_id != static.node_of(g):\n",
        "        elif False:\n",
        "[Static: the caller's group has its bundles elsewhere] a live replica whose first bundle moved follows it",
    ),
    mutation(
        "static-placement-failed-unreserved", CORE,
        "    if dep.static is not None:  # its bundles are fixed: a new incarnation tries them again\n",
        "    if False:  # its bundles are fixed: a new incarnation tries them again\n",
        "[Static: PlacementFailed] a new incarnation tries the same bundles again",
    ),
    mutation(
        "static-placed-elsewhere-bundle-kept", STATIC_,
        "    return _copy(dep, static=static.with_nodes(nodes))\n",
        "    return dep\n",
        "[Static: ReplicaPlaced on another node] the bundle's node is updated",
    ),
    mutation(
        "static-recovery-failed-not-restarted", RECOVERY,
        "            elif rep.phase is Phase.FAILED:\n                dep = static.restart_failed(tx, dep, rep)\n",
        "            elif False:\n                dep = static.restart_failed(tx, dep, rep)\n",
        "[Static: recovery] a FAILED rank whose bundles are placed at recovery restarts on them",
    ),
    mutation(
        "static-gang-accepted", "rankcore/base/options.py",
        "        if value.gang_size > 1 and self.static.static_placement is not None:\n",
        "        if False:\n",
        "[Static: static + gangs] refused",
    ),
    mutation(
        "static-scale-to-other-count", STATIC_,
        "    if num_replicas not in (0, static.replicas):\n",
        "    if False:\n",
        "[Static] the replica count is the mapping's length: a ScaleRequested to another count is InvalidConfig",
    ),
    # ----------------------------------------------------------------------------------- Gangs
    mutation(
        "gang-scale-not-multiple", GANGS,
        "    if num_replicas % dep.gang_size:\n",
        "    if False:\n",
        "[Gangs: target] a ScaleRequested to a count not a multiple of gang_size is InvalidConfig",
    ),
    mutation(
        "gang-partial-placement", PLACEMENT,
        "    if sum(room.values()) < size:\n        return None\n",
        "",
        "[Gangs: placement] all or nothing: a gang that does not fit waits whole",
    ),
    mutation(
        "gang-pack-not-one-node", PLACEMENT,
        "        if whole:\n",
        "        if False:\n",
        "[Gangs: placement] pack puts the whole gang on one node when one has room",
    ),
    mutation(
        "gang-spread-packs", PLACEMENT,
        '    if strategy == "pack":\n        whole =',
        "    if True:\n        whole =",
        "[Gangs: placement] spread puts members on distinct nodes while there are enough",
    ),
    mutation(
        "gang-restart-gang-only-member", GANGS,
        "    if dep.gang_size <= 1 or rep.phase is Phase.STOPPING or (\n",
        "    if True or (\n",
        "[Gangs: a member fails] restart_gang stops and replaces every live member",
    ),
    mutation(
        "gang-changed-not-sent", GANGS,
        "        if set(members) - new:\n            out.append(GangChanged(",
        "        if False:\n            out.append(GangChanged(",
        "[Gangs: a member fails] restart_replica: the gang is told its new members (GangChanged)",
    ),
    mutation(
        "gang-context-rank-in-gang", GANGS,
        "rank_in_gang=c.global_rank % k,",
        "rank_in_gang=0,",
        "[Gangs: context] StartReplica.gang carries the member's rank in the gang",
    ),
    mutation(
        "gang-downscale-lowest-gangs", MOVES,
        "        for g in sorted(by_gang, reverse=True):\n",
        "        for g in sorted(by_gang):\n",
        "[Gangs: downscale] whole gangs from the top ranks",
    ),
    mutation(
        "gang-recovery-incomplete-kept", GANGS,
        "        if not any(m in fresh for m in members):\n            continue\n",
        "        if True:\n            continue\n",
        "[Gangs: controller crash during a gang's start] a gang with members started again is restarted whole",
    ),
    # ------------------------------------------------------ Health, timeouts, restarts and shutdown
    mutation(
        "health-threshold-off-by-one", HEALTH,
        "    if failures < dep.config.health.health_check_failure_threshold:\n",
        "    if failures <= dep.config.health.health_check_failure_threshold:\n",
        "[Health: health checks] health_check_failure_threshold failures in a row stop and replace the replica",
    ),
    mutation(
        "health-pass-does-not-reset", HEALTH,
        "        tx.put(put_replica(dep, rep, _with_failures(rep, 0)))\n",
        "        tx.put(put_replica(dep, rep, _with_failures(rep, rep.health_failures)))\n",
        "[Health: health checks] a passing check resets the count",
    ),
    mutation(
        "placement-timeout-ignored", CLOCK,
        "            elif current.phase is Phase.PENDING and current.node_id is not None:  # never placed there\n",
        "            elif False:  # never placed there\n",
        "[Health: placement timeout] a PlaceReplica unanswered placement_timeout_s: stopped and replaced",
    ),
    mutation(
        "placement-timeout-same-node", CLOCK,
        "                    dep = crash(tx, dep, current, avoid=current.node_id)\n",
        "                    dep = crash(tx, dep, current)\n",
        "[Health: placement timeout] the replacement avoids the node that did not answer",
    ),
    mutation(
        "placement-timeout-on-static-group", STATIC_,
        "                   bundles=static.bundles_of(g), capture_child_tasks=static.capture_child_tasks))\n    return dep\n",
        "                   bundles=static.bundles_of(g), capture_child_tasks=static.capture_child_tasks))\n"
        "    from .deadlines import placement as _arm\n    _arm(tx, dep, rid)\n    return dep\n",
        "[Health: placement timeout] static groups have no placement deadline",
    ),
    mutation(
        "start-timeout-not-a-failed-start", CLOCK,
        '                dep = fail(tx, restarts.failed_start(dep, current, "start_timeout", '
        '"not ready within start_timeout_s"), current)\n',
        "                dep = fail(tx, dep, current)\n",
        "[Health: start timeout] a start timeout counts as a failed start",
    ),
    mutation(
        "failed-start-while-running", RESTARTS,
        "    if rep.phase is Phase.STARTING and cause in FAILED_START_CAUSES:\n",
        "    if cause in FAILED_START_CAUSES:\n",
        "[Health: failures as facts] only an error while starting is a failed start",
    ),
    mutation(
        "backoff-first-failure-waits", RESTARTS,
        "    if k <= 1:\n",
        "    if k < 1:\n",
        "[Health: restart backoff] the first failed start is retried at once",
    ),
    mutation(
        "backoff-exponent-k-1", RESTARTS,
        "2.0 ** min(k - 2, 64)",
        "2.0 ** min(k - 1, 64)",
        "[Health: restart backoff] the k-th failure waits restart_backoff_s * 2**(k-2)",
    ),
    mutation(
        "backoff-uncapped", RESTARTS,
        "    return min(base_s * 2.0 ** min(k - 2, 64), max_s)\n",
        "    return base_s * 2.0 ** min(k - 2, 64)\n",
        "[Health: restart backoff] the wait is capped at restart_backoff_max_s",
    ),
    mutation(
        "backoff-not-reset-when-ready", RESTARTS,
        "    return unchecked_copy(dep, start_failures=0) if dep.start_failures else dep\n",
        "    return dep\n",
        "[Health: restart backoff] a replica that becomes ready ends the failures in a row",
    ),
    mutation(
        "backoff-keeps-booking", MOVES,
        "    if managed and (delay > 0 or avoid is not None):\n",
        "    if managed and avoid is not None:\n",
        "[Health: when a crash restart's room is free] a replacement waiting out a backoff does not hold the room",
        # (both: the first edit alone is equivalent, _succeed's _forget releases the booking anyway)
        more=(Edit(MOVES, "    booking = keep_booking(tx, dep, rid, new_id) if managed and delay == 0 and avoid is None else None\n",
                   "    booking = keep_booking(tx, dep, rid, new_id) if managed and avoid is None else None\n"),),
    ),
    mutation(
        "status-never-unhealthy-on-failed-starts", STATE,
        "        if self.failing_to_start or self.counts[_FAILED_AT] or self.health_failed:\n",
        "        if self.counts[_FAILED_AT] or self.health_failed:\n",
        "[Health: status] UNHEALTHY after min(max_constructor_retry_count, 3 x target) failed starts in a row",
    ),
    mutation(
        "status-never-unhealthy-on-a-replica-death", UNHEALTHY,
        "    if not marks and not dep.healthy:\n",
        "    if True:\n",
        "[Health: status] UNHEALTHY once a serving replica of the deployed revision dies (Serve's HEALTH_CHECK_FAILED)",
    ),
    mutation(
        "status-unhealthy-one-late", STATE,
        "self.start_failures >= min(",
        "self.start_failures > min(",
        "[Health: status] UNHEALTHY at exactly min(max_constructor_retry_count, 3 x target) failed starts",
    ),
    mutation(
        "give-up-stop-drains", TX,
        "graceful_shutdown_timeout_s=0.0 if now else o.graceful_shutdown_timeout_s",
        "graceful_shutdown_timeout_s=o.graceful_shutdown_timeout_s",
        "[Health: graceful shutdown] a replica the core gives up on is killed now (0 s)",
    ),
    mutation(
        "downscale-stop-kills", MOVES,
        "        tx.emit(stop_command(dep, rid))\n    return _copy(dep, replicas=replicas, counts=counts)\n",
        "        tx.emit(stop_command(dep, rid, now=True))\n    return _copy(dep, replicas=replicas, counts=counts)\n",
        "[Health: graceful shutdown] a downscale drains (graceful_shutdown_timeout_s)",
    ),
    # ------------------------------------------------------------------------------------ Ranks
    mutation(
        "new-node-rank-above-highest", RANKS,
        "            nr = _bits_lowest_free(e.dicts[_NBITS])\n",
        "            nr = max(d[_NOWNER], default=-1) + 1\n",
        "[Ranks] a node's node rank is the lowest free one when its first replica arrives",
    ),
    mutation(
        "deploy-world-size-not-announced", CORE,
        "    if dep.target != target:\n"
        "        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=dep.target))\n"
        "    tx.put(bluegreen.called_off(",
        "    if dep.target != target:\n"
        "        pass\n"
        "    tx.put(bluegreen.called_off(",
        "[Ranks: world_size] a DeploymentApplied that changes the target announces it (UpdateWorldSize)",
    ),
    mutation(
        "backoff-start-stale-world-size", RESTARTS,
        "                  world_size=dep.target, replaces=replaces, lineage=rep.lineage, revision=rep.revision)\n",
        "                  world_size=len(dep.replicas), replaces=replaces, lineage=rep.lineage, revision=rep.revision)\n",
        "[Ranks: world_size] a replacement released after its backoff starts with the world size as it is now",
    ),
    mutation(
        "recovery-unresponsive-ranks-given", MOVES,
        "        if dep.unresponsive:  # it may hold any free rank: none is given until it has stopped (rankcore.control.recovery)\n",
        "        if False:  # it may hold any free rank: none is given until it has stopped (rankcore.control.recovery)\n",
        "[Ranks: recovery] no rank of a deployment with an unresponsive replica is given until it has stopped",
    ),
    mutation(
        "spares-left-node-not-told", "rankcore/placement/spares.py",
        "for node in sorted(before.keys() | after.keys()) if before.get(node, 0) != after.get(node, 0)]",
        "for node in sorted(after.keys()) if before.get(node, 0) != after.get(node, 0)]",
        "[Health: spare processes] a node whose last replica of the deployment left is told 0",
        tests=("tests/scenarios", "tests/unit/test_spares.py"),
    ),
)


def noop(fn: str, signature: str) -> Mutation:
    """``rankcore.invariants.<fn>`` made a no-op (it returns before checking anything)."""
    return mutation(f"invariant-noop-{fn.strip('_').replace('_', '-')}", INVARIANTS, signature,
                    signature + "    return\n", f"[invariants] {fn} checks something (here: nothing)",
                    tests=INVARIANT_TESTS)


#: tried first on a no-op check: the tests that feed the checks broken steps and states
INVARIANT_TESTS = ("tests/unit/test_invariants.py", "tests/unit/test_issue19_core_bugs.py")


_STEP_SIG = "(before: State, event: object, result: Step) -> None:\n"
INVARIANT_NOOPS: tuple[Mutation, ...] = (
    noop("check_ranks_unique", "def check_ranks_unique(state: State) -> None:\n"),
    noop("check_every_replica_ranked", "def check_every_replica_ranked(state: State) -> None:\n"),
    noop("check_counts", "def check_counts(state: State) -> None:\n"),
    noop("check_contiguous_when_healthy", "def check_contiguous_when_healthy(state: State) -> None:\n"),
    noop("check_contiguity_counters", "def check_contiguity_counters(state: State) -> None:\n"),
    noop("check_cluster", "def check_cluster(state: State) -> None:\n"),
    noop("check_state", "def check_state(state: State) -> None:\n"),
    noop("check_world_size_commands", "def check_world_size_commands" + _STEP_SIG),
    noop("check_crash_inherits_rank", "def check_crash_inherits_rank" + _STEP_SIG),
    noop("check_upscale_keeps_ranks", "def check_upscale_keeps_ranks" + _STEP_SIG),
    noop("check_rank_changes_reconfigured", "def check_rank_changes_reconfigured" + _STEP_SIG),
    noop("_check_rank_change",
         "def _check_rank_change(old: Deployment | None, new: Deployment, rid: str, changed: bool, sent: Counter,\n"
         "                       was: object, now: object) -> None:\n"),
    noop("check_compaction_minimal", "def check_compaction_minimal" + _STEP_SIG),
    noop("check_new_replicas_take_lowest_free", "def check_new_replicas_take_lowest_free" + _STEP_SIG),
    noop("check_crash_replacement_inherits_all_ranks", "def check_crash_replacement_inherits_all_ranks" + _STEP_SIG),
    noop("check_placements", "def check_placements" + _STEP_SIG),
    noop("check_compact_only_when_healthy", "def check_compact_only_when_healthy" + _STEP_SIG),
    noop("check_command_order", "def check_command_order" + _STEP_SIG),
    noop("check_gangs_told", "def check_gangs_told" + _STEP_SIG),
    noop("check_spares_told", "def check_spares_told" + _STEP_SIG),
    noop("check_touched", "def check_touched" + _STEP_SIG),
    noop("_check_rank_changes_touched", "def _check_rank_changes_touched" + _STEP_SIG),
    noop("check_step", "def check_step(before: State, event: object, result: Step, *, full: bool = False) -> None:\n"),
    noop("check_recovery_roundtrip", "def check_recovery_roundtrip(state: State, step_fn: Any = None) -> None:\n"),
    noop("check_snapshot", "def check_snapshot(snapshot: Mapping[str, Any]) -> None:\n"),
    noop("_check_levels", "def _check_levels(name: str, triples: Iterable[tuple], healthy: bool) -> None:\n"),
)

TIERS = "rankcore/tiers/choice.py"
TIER_TESTS = ("tests/unit/test_tiers.py", "tests/property/test_tiers.py")
#: issue 21: the tier choices (docs/tiers.md)
TIER_RULES: tuple[Mutation, ...] = (
    mutation("tiers-dedicated-evicted", TIERS,
             "    if (resident.deployment == want.deployment or resident.dedicated or resident.leaving or resident.claim\n",
             "    if (resident.deployment == want.deployment or resident.leaving or resident.claim\n",
             "[Tiers: eviction] a dedicated replica is never evicted", tests=TIER_TESTS),
    mutation("tiers-young-evicted", TIERS,
             "    return want.dedicated or want.now - resident.hot_since >= least\n",
             "    return True\n",
             "[Tiers: eviction] a replica HOT for less than the minimum deployment time is spared", tests=TIER_TESTS),
    mutation("tiers-needless-victims", TIERS,
             "            return _needed(node, want, chosen)\n", "            return tuple(chosen)\n",
             "[Tiers: eviction] no replica is evicted whose eviction is not needed", tests=TIER_TESTS),
    mutation("tiers-warm-not-preferred", TIERS,
             "        choice = Choice.WARM_FREE if warm else Choice.FREE\n", "        choice = Choice.FREE\n",
             "[Tiers: placement] a node with a WARM copy and room comes before one with room only",
             tests=TIER_TESTS),
    mutation("tiers-node-order-ignored", TIERS,
             "    return (_RANK[choice], len(out), evicted, node.order, node.node_id), p\n",
             "    return (_RANK[choice], len(out), evicted), p\n",
             "[Tiers: placement] ties are broken by node order, whatever order the nodes come in",
             tests=TIER_TESTS),
    mutation("tiers-device-worst-fit", TIERS,
             "    fits = sorted((room, i) for i, room in free.items() if room >= per_device)\n",
             "    fits = sorted((-room, i) for i, room in free.items() if room >= per_device)\n",
             "[Tiers: devices] the devices with the least free memory that fit are taken first", tests=TIER_TESTS),
    mutation("tiers-cache-largest-first", TIERS,
             "    order = sorted((e.nbytes, i) for i, e in enumerate(node.cache) if not e.pinned)\n",
             "    order = sorted((-e.nbytes, i) for i, e in enumerate(node.cache) if not e.pinned)\n"
             "    order = [(-n, i) for n, i in order]\n",
             "[Tiers: cache] WARM copies are dropped smallest first", tests=TIER_TESTS),
    mutation("tiers-cache-drops-too-many", TIERS,
             "            for back in reversed(dropped[:-1]):\n", "            for back in reversed(dropped[:0]):\n",
             "[Tiers: cache] no WARM copy is dropped that need not be", tests=TIER_TESTS),
    mutation("invariant-noop-check-tiers", INVARIANTS, "def check_tiers(nodes: Iterable[Any]) -> None:\n",
             "def check_tiers(nodes: Iterable[Any]) -> None:\n    return\n",
             "[invariants] check_tiers checks something (here: nothing)", tests=TIER_TESTS),
)

RESIDENCY = "rankcore/tiers/residency.py"
RESIDENCY_TESTS = ("tests/scenarios", "tests/property/test_core_machine.py")
#: issue 21: sleep, wake and weight versions (rankcore/tiers/residency.py)
RESIDENCY_RULES: tuple[Mutation, ...] = (
    mutation("weights-skip-starting", RESIDENCY,
             "    if rep.phase not in _INITIALISED:\n", "    if rep.phase not in _SERVING:\n",
             "[Tiers: weights] a push reaches a replica that is starting", tests=RESIDENCY_TESTS),
    mutation("weights-not-at-init", "rankcore/base/transaction.py",
             "        weights_version=dep.weights_version,\n", "        weights_version=0,\n",
             "[Tiers: weights] a replica not yet initialised loads the last version pushed at start",
             tests=RESIDENCY_TESTS),
    mutation("sleep-not-after-ready", "rankcore/core.py",
             "    tx.put(put_replica(dep, rep, residency.settle(tx, dep, new)))",
             "    tx.put(put_replica(dep, rep, new))",
             "[Tiers: sleep] a replica that becomes ready while its deployment sleeps goes to sleep",
             tests=RESIDENCY_TESTS),
    mutation("wake-not-after-moved", RESIDENCY,
             "    return put_replica(dep, rep, settle(tx, dep, new))\n", "    return put_replica(dep, rep, new)\n",
             "[Tiers: sleep] a replica whose move ends against what its deployment now wants moves back",
             tests=RESIDENCY_TESTS),
    mutation("invariant-noop-check-residency", INVARIANTS, "def check_residency(state: State) -> None:\n",
             "def check_residency(state: State) -> None:\n    return\n",
             "[invariants] check_residency checks something (here: nothing)",
             tests=("tests/unit/test_invariants.py",)),
)

DEVICES = "rankcore/tiers/devices.py"
DEVICE_TESTS = ("tests/scenarios", "tests/unit/test_devices.py", "tests/integration/test_sim_tiers.py")
#: issue 21: GPU memory booked in the step (rankcore/tiers/devices.py, rankcore/control/evictions.py)
DEVICE_RULES: tuple[Mutation, ...] = (
    mutation("devices-no-claim", DEVICES,
             "    cl.evicting = cl.evicting.set(rid, victims)\n    book(cl, dep, rid, chosen.node_id, chosen.devices)\n",
             "    cl.evicting = cl.evicting.set(rid, victims)\n",
             "[Tiers: eviction] the replica that evicts claims the victims' room (nobody else takes it)",
             tests=DEVICE_TESTS),
    mutation("devices-replacement-evicts", DEVICES,
             "                may_evict=rid is None or rid not in cl.no_evict)\n", "                may_evict=True)\n",
             "[Tiers: eviction] an evicted replica's replacement waits for room and never evicts",
             tests=DEVICE_TESTS),
    mutation("devices-victim-min-time", TIERS,
             "    least = want.min_deployment_time_s if resident.min_deployment_time_s is None else "
             "resident.min_deployment_time_s\n",
             "    least = want.min_deployment_time_s\n",
             "[Tiers: eviction] the minimum deployment time that protects a replica is its own deployment's",
             tests=DEVICE_TESTS),
    mutation("devices-sleep-keeps-gpu", RESIDENCY,
             "        free_gpus(tx.cl, rep.replica_id)  # its GPU memory is free for others\n",
             "        pass\n",
             "[Tiers: sleep] a sleeping replica's GPU memory is free for another model", tests=DEVICE_TESTS),
    mutation("devices-stopping-victim", PLACING,
             "    chosen = devices.choose(cl, dep, rid, avoid, devices.stopping(tx))\n",
             "    chosen = devices.choose(cl, dep, rid, avoid)\n",
             "[Tiers: eviction] a replica being stopped already is no victim",
             tests=("tests/property/test_core_machine.py",)),
    mutation("invariant-noop-check-devices", INVARIANTS, "def check_devices(state: State) -> None:\n",
             "def check_devices(state: State) -> None:\n    return\n",
             "[invariants] check_devices checks something (here: nothing)",
             tests=("tests/unit/test_invariants.py", "tests/unit/test_devices.py")),
)

BLUEGREEN = "rankcore/control/bluegreen.py"
_BG_TESTS = ("tests/unit/test_rollouts_bluegreen.py",)
#: blue-green (issue 37, rankcore.control.bluegreen): each rule broken, one at a time
BLUE_GREEN_RULES: tuple[Mutation, ...] = (
    mutation("bluegreen-switch-before-ready", BLUEGREEN,
             "    return len(greens) == dep.target and all(r.phase in _SERVING and r.revision == dep.revision for r in greens)\n",
             "    return len(greens) == dep.target\n",
             "[Rollouts: blue-green] the pool switches only once every green is ready", tests=_BG_TESTS),
    mutation("bluegreen-standby-serves", RESIDENCY,
             "and rep.weights_version == dep.weights_version and (not dep.blues or rep.blue_ranks is not None))",
             "and rep.weights_version == dep.weights_version)",
             "[Rollouts: blue-green] a new replica does not serve while an old one does", tests=_BG_TESTS),
    mutation("bluegreen-blue-replaced", MOVES,
             "    if rep.phase is Phase.STOPPING or rep.blue_ranks is not None:\n",
             "    if rep.phase is Phase.STOPPING:\n",
             "[Rollouts: blue-green] a blue that dies is not replaced (its green holds its ranks)", tests=_BG_TESTS),
)
# (Not here: dropping call-off's explicit stop of the greens. Reconcile then stops them anyway, since they sit
# above the target on spare entries, so that mutant is equivalent: it survived the whole suite, 164 s.)

#: the mutants before issue 20 (the older rules)
OLDER = MUTATIONS
MUTATIONS = OLDER + ISSUE20_RULES + INVARIANT_NOOPS + TIER_RULES + RESIDENCY_RULES + DEVICE_RULES + BLUE_GREEN_RULES


# ------------------------------------------------------------------ mechanics
def repo_files(root: Path) -> list[str]:
    """The working tree's files as git sees them: tracked (as they are now, uncommitted
    edits included; deleted ones skipped) plus untracked ones that are not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout.decode()
    files = sorted({p for p in out.split("\0") if p})
    return [p for p in files if (root / p).is_file() and not (root / p).is_symlink()]


def copy_tree(root: Path, dest: Path, files: Iterable[str]) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def snapshot(root: Path, dest: Path, rev: str | None = None) -> list[str]:
    """Copy the code under test to ``dest`` once, so every mutant of a sweep sees the
    same files even while people keep editing: the working tree (``rev`` None) or
    the commit ``rev``. Returns the files copied."""
    if rev is None:
        files = repo_files(root)
        copy_tree(root, dest, files)
        return files
    listing = subprocess.run(["git", "ls-tree", "-r", "-z", "--name-only", rev], cwd=root,
                             capture_output=True)
    if listing.returncode:
        raise MutationError(f"git ls-tree {rev}: {listing.stderr.decode().strip()}")
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=root, check=True,
                             capture_output=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Pythons without extraction filters
            tar.extractall(dest)
    names = [p for p in listing.stdout.decode().split("\0") if p]
    return sorted(p for p in names if (dest / p).is_file() and not (dest / p).is_symlink())


def _check_edit(m: Mutation, e: Edit, text: str) -> None:
    n = text.count(e.find)
    if n != 1:
        where = "not found" if n == 0 else f"found {n} times"
        raise MutationError(
            f"mutation {m.name!r}: snippet {where} in {e.file} (it must occur exactly once; "
            f"update tools/mutate.py to match the code):\n{textwrap.indent(e.find, '    | ')}"
        )


def check_mutation(m: Mutation, tree: Path) -> None:
    """Raise MutationError unless every edit of ``m`` matches exactly once in ``tree``
    (edits of one file are checked in order, each on the text the previous ones left)."""
    texts: dict[str, str] = {}
    for e in m.edits:
        path = tree / e.file
        if e.file not in texts:
            if not path.is_file():
                raise MutationError(f"mutation {m.name!r}: {e.file} does not exist")
            texts[e.file] = path.read_text()
        _check_edit(m, e, texts[e.file])
        texts[e.file] = texts[e.file].replace(e.find, e.replace, 1)


def apply_mutation(m: Mutation, tree: Path) -> None:
    """Patch ``tree`` in place (checks everything before writing anything)."""
    check_mutation(m, tree)
    texts: dict[str, str] = {}
    for e in m.edits:
        text = texts.get(e.file)
        if text is None:
            text = (tree / e.file).read_text()
        texts[e.file] = text.replace(e.find, e.replace, 1)
    for rel, text in texts.items():
        (tree / rel).write_text(text)


PROBE_SOURCE = f'''\
"""Written by tools/mutate.py: fail the run unless rankcore (and executors) come from the copy."""
import importlib
import os

import pytest


def pytest_collection_finish(session):
    expected = os.path.realpath(os.environ["RANKCORE_MUTATE_TREE"])
    for name in ("rankcore", "executors"):
        mod = importlib.import_module(name)
        where = os.path.realpath(mod.__file__)
        if os.path.commonpath([where, expected]) != expected:
            pytest.exit(f"mutate probe: {{name}} was imported from {{where}}, not from the copy {{expected}}",
                        returncode={PROBE_RC})
'''


@dataclass
class Result:
    mutation: str
    status: str
    seconds: float
    detail: str = ""  # killed: the first failing test; error: why
    output: str = field(default="", repr=False)


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if "mutate probe:" in line:
            return "mutate probe:" + line.split("mutate probe:", 1)[1].rstrip(" !")
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split(" ", 1)[1]
    for line in output.splitlines():
        if "error" in line.lower() and "Interrupted" in line:
            return line.strip()
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def run_pytest(tree: Path, probe_dir: Path, python: str, pytest_args: Sequence[str], timeout: float,
               name: str) -> tuple[int | None, str, float]:
    """Run pytest in ``tree``; return (exit status or None on timeout, output, seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(probe_dir)])
    env["RANKCORE_MUTATE_TREE"] = str(tree)
    env[ENV_VAR] = name
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [python, "-m", "pytest", "-p", PROBE_MODULE, *pytest_args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pytest we started, and anything it started
        out, _ = proc.communicate()
        rc = None
    return rc, out.decode(errors="replace"), time.monotonic() - t0


def _options(args: Sequence[str], tree: Path) -> list[str]:
    """``args`` without its test paths (those that exist in ``tree``): the options to reuse."""
    return [a for a in args if not (a and not a.startswith("-") and (tree / a.split("::")[0]).exists())]


def stages(m: Mutation | None, pytest_args: Sequence[str], then: Sequence[str], tree: Path) -> list[list[str]]:
    """The pytest runs for ``m``, in order, each only if the ones before passed:
    ``m.tests`` (with the options of ``pytest_args``), ``pytest_args``, then each path of ``then``.
    The baseline (None) runs all but the first."""
    opts = _options(pytest_args, tree)
    out = [[*opts, *m.tests]] if m is not None and m.tests else []
    out.append(list(pytest_args))
    out.extend([*opts, *shlex.split(t)] for t in then)
    return out


def run_one(m: Mutation | None, root: Path, files: Sequence[str], python: str, pytest_args: Sequence[str],
            timeout: float, keep: bool = False, then: Sequence[str] = ()) -> Result:
    """Copy the tree, apply ``m`` (None: the unmutated baseline), run the suite, classify.

    The suite is ``stages``: a run that fails kills the mutant and ends it (its
    detail names the run, ``[2] tests/...::test`` for the second); the mutant
    survives only when every run passed. ``timeout`` is for all of them."""
    name = m.name if m is not None else "(baseline)"
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"rankcore-mutant-{name.strip('()')}-"))
    try:
        tree, probe_dir = work / "tree", work / "probe"
        probe_dir.mkdir()
        (probe_dir / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)
        copy_tree(root, tree, files)
        if m is not None:
            try:
                apply_mutation(m, tree)
            except MutationError as exc:
                return Result(name, ERROR, time.monotonic() - t0, str(exc).splitlines()[0])
        runs = stages(m, pytest_args, then, tree)
        outs = []
        for i, args in enumerate(runs, 1):
            left = timeout - (time.monotonic() - t0)
            rc, out, _ = run_pytest(tree, probe_dir, python, args, max(left, 1.0), name)
            outs.append(out)
            secs = time.monotonic() - t0
            tag = f"[{i}] " if len(runs) > 1 and i > 1 else ""
            if rc is None:
                return Result(name, TIMEOUT, secs, f"{tag}no result after {timeout:.0f} s", out)
            if rc == 0:
                continue
            if rc == PROBE_RC:
                return Result(name, ERROR, secs, _first_failure(out), out)
            if rc in (1, 2):  # tests failed / collection errors (e.g. the mutant does not import)
                return Result(name, KILLED, secs, tag + _first_failure(out), out)
            return Result(name, ERROR, secs, f"{tag}pytest exited {rc}: {_first_failure(out)}", out)
        return Result(name, SURVIVED, time.monotonic() - t0, "", "\n".join(outs))
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def sweep(mutations: Sequence[Mutation], root: Path, files: Sequence[str], python: str,
          pytest_args: Sequence[str], timeout: float, jobs: int = 1, keep: bool = False,
          on_result: Callable[[Result], None] | None = None, then: Sequence[str] = ()) -> list[Result]:
    """Run every mutation on a copy of ``files`` of ``root`` (``jobs`` at a time);
    results in the order of ``mutations``."""
    results: dict[str, Result] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_one, m, root, files, python, pytest_args, timeout, keep, then): m for m in mutations}
        for fut in as_completed(futures):
            res = fut.result()
            results[res.mutation] = res
            if on_result is not None:
                on_result(res)
    return [results[m.name] for m in mutations]


def select(names: Sequence[str]) -> list[Mutation]:
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise click.BadParameter(f"unknown mutation(s) {unknown}; see --list", param_hint="--only")
    return [by_name[n] for n in names] if names else list(MUTATIONS)


def _default_python(root: Path) -> str:
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _print_table(results: Sequence[Result], wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    style = {KILLED: "green", TIMEOUT: "yellow", SURVIVED: "bold red", ERROR: "bold magenta"}
    breaks = {m.name: m.breaks for m in MUTATIONS}
    table = Table(title=f"mutation sweep ({len(results)} mutations, {wall:.0f} s wall)")
    table.add_column("mutation")
    table.add_column("status")
    table.add_column("s", justify="right")
    table.add_column("killed by / why")
    for r in results:
        table.add_row(r.mutation, f"[{style[r.status]}]{r.status.upper()}[/]", f"{r.seconds:.0f}",
                      r.detail if r.status != SURVIVED else f"nothing: {breaks.get(r.mutation, '')}")
    Console(width=200).print(table)


def markdown(results: Sequence[Result]) -> str:
    breaks = {m.name: m.breaks for m in MUTATIONS}
    lines = ["| mutation | rule it breaks | status | s | killed by |", "|---|---|---|--:|---|"]
    for r in results:
        lines.append(f"| `{r.mutation}` | {breaks.get(r.mutation, '')} | {r.status.upper()} | {r.seconds:.0f} | "
                     f"{('`' + r.detail + '`') if r.detail and r.status == KILLED else r.detail or '-'} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ CLI
@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--only", "only", multiple=True, metavar="NAME", help="Run only this mutation (repeatable).")
@click.option("--list", "list_", is_flag=True, help="List the mutations and the rule each breaks, then exit.")
@click.option("--check", is_flag=True, help="Only check that every snippet matches the code exactly once.")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1), help="Mutants run at once.")
@click.option("--timeout", default=600.0, show_default=True, type=float, help="Seconds per mutant run.")
@click.option("--pytest-args", default=DEFAULT_PYTEST_ARGS, show_default=True,
              help="Arguments for pytest: every mutant's first common run (after its own tests, if it names any).")
@click.option("--then", "then", multiple=True, default=DEFAULT_THEN, show_default=True, metavar="PATHS",
              help="Test paths run next (same options), only for a mutant the runs before missed (repeatable).")
@click.option("--no-then", is_flag=True, help="No run after --pytest-args.")
@click.option("--group", type=click.Choice(["all", "older", "issue20", "rules", "invariants", "tiers"]), default="all",
              show_default=True, help="Which mutations: older (before issue 20), issue20 (rules + invariants), "
                                      "tiers (issue 21).")
@click.option("--seed", default="0", show_default=True,
              help="--hypothesis-seed for every run (reproducible sweeps); 'random' for none.")
@click.option("--no-baseline", is_flag=True, help="Skip the unmutated run that must pass first.")
@click.option("--rev", default=None, metavar="REV",
              help="Mutate this commit (e.g. HEAD) instead of the working tree as it is now.")
@click.option("--python", "python", default=None, help="Interpreter (default: the repo's .venv/bin/python).")
@click.option("--keep", is_flag=True, help="Keep the temporary copies (to inspect a mutant).")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as a Markdown table to this file.")
@click.option("--show-survivors", is_flag=True, help="Print the pytest output of surviving mutants.")
def main(only: tuple[str, ...], list_: bool, check: bool, jobs: int, timeout: float, pytest_args: str,
         then: tuple[str, ...], no_then: bool, group: str, seed: str, no_baseline: bool, rev: str | None,
         python: str | None, keep: bool, md_path: str | None, show_survivors: bool) -> None:
    """Apply rule-breaking mutations to rankcore one at a time; fail if the tests miss any."""
    mutations = select(only)
    if not only and group != "all":
        pick = {"older": OLDER, "issue20": ISSUE20_RULES + INVARIANT_NOOPS, "rules": ISSUE20_RULES,
                "invariants": INVARIANT_NOOPS, "tiers": TIER_RULES + RESIDENCY_RULES + DEVICE_RULES}[group]
        mutations = list(pick)
    then = () if no_then else then
    if list_:
        for m in mutations:
            click.echo(f"{m.name:40} {', '.join(m.files):22} {m.breaks}")
        return
    work = Path(tempfile.mkdtemp(prefix="rankcore-mutate-source-"))
    try:
        try:
            source = work / "source"
            files = snapshot(ROOT, source, rev)
        except MutationError as exc:
            raise click.ClickException(str(exc)) from None
        bad = []
        for m in mutations:
            try:
                check_mutation(m, source)
            except MutationError as exc:
                bad.append(str(exc))
        if bad:
            click.echo("\n".join(bad), err=True)
            sys.exit(2)
        if rev is None:
            what = "the working tree"
        else:
            sha = subprocess.run(["git", "rev-parse", "--short=10", rev], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip()
            what = f"commit {rev} ({sha})"
        if check:
            click.echo(f"all {len(mutations)} mutations match {what} exactly once")
            return
        _run(mutations, source, files, what, python or _default_python(ROOT), pytest_args, seed, timeout,
             jobs, keep, no_baseline, md_path, show_survivors, then)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(mutations: Sequence[Mutation], source: Path, files: Sequence[str], what: str, python: str,
         pytest_args: str, seed: str, timeout: float, jobs: int, keep: bool, no_baseline: bool,
         md_path: str | None, show_survivors: bool, then: Sequence[str] = ()) -> None:
    args = shlex.split(pytest_args)
    if seed != "random":
        args.append(f"--hypothesis-seed={seed}")
    t0 = time.monotonic()
    click.echo(f"{len(mutations)} mutations of {what} ({len(files)} files); pytest {' '.join(args)}"
               f"{''.join(f'; then {t}' for t in then)}; --jobs {jobs}", err=True)
    if not no_baseline:
        base = run_one(None, source, files, python, args, timeout, keep, then)
        if base.status != SURVIVED:
            click.echo(base.output[-4000:], err=True)
            click.echo(f"baseline (no mutation) {base.status}: {base.detail}; the suite must pass "
                       f"before a mutation sweep means anything", err=True)
            sys.exit(2)
        click.echo(f"baseline (no mutation) passed in {base.seconds:.0f} s", err=True)

    done = [0]

    def progress(r: Result) -> None:
        done[0] += 1
        click.echo(f"[{done[0]}/{len(mutations)}] {r.mutation}: {r.status} ({r.seconds:.0f} s) {r.detail}",
                   err=True)

    results = sweep(mutations, source, files, python, args, timeout, jobs, keep, progress, then)
    wall = time.monotonic() - t0
    _print_table(results, wall)
    if show_survivors:
        for r in results:
            if r.status == SURVIVED:
                click.echo(f"--- {r.mutation}\n{r.output[-2000:]}")
    counts = {s: sum(r.status == s for r in results) for s in (KILLED, TIMEOUT, SURVIVED, ERROR)}
    click.echo(f"{counts[KILLED]} killed, {counts[TIMEOUT]} timed out, {counts[SURVIVED]} survived, "
               f"{counts[ERROR]} errors; {wall:.0f} s wall with --jobs {jobs}")
    if md_path:
        Path(md_path).write_text(markdown(results))
    if counts[ERROR]:
        sys.exit(2)
    if counts[SURVIVED]:
        sys.exit(1)


if __name__ == "__main__":
    main()
