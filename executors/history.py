"""Rank history: which global rank each replica lineage held, in order.

Executors differ in timing (which answer comes first), not in rules, so the
comparable thing between two runs of one scenario is, per (deployment,
lineage), the sequence of global ranks it held: the simulator and the Ray
executor must agree on it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["rank_history"]


def rank_history(records: Iterable[dict]) -> dict[tuple[str, int], list[int]]:
    """(deployment, lineage) -> the global ranks it held, consecutive repeats merged."""
    history: dict[tuple[str, int], list[int]] = {}
    lineage_of: dict[str, tuple[str, int]] = {}

    def hold(key: tuple[str, int], rank: int) -> None:
        ranks = history.setdefault(key, [])
        if not ranks or ranks[-1] != rank:
            ranks.append(rank)

    for rec in records:
        kind = rec.get("kind")
        if kind == "command" and rec["type"] == "StartReplica":
            f = rec["fields"]
            if f.get("lineage") is not None:
                key = (rec["deployment"], f["lineage"])
                lineage_of[f["replica_id"]] = key
                hold(key, f["global_rank"])
        elif kind == "command" and rec["type"] == "ReconfigureReplica":
            known = lineage_of.get(rec["replica"])
            if known is not None:
                hold(known, rec["fields"]["rank"][0])
        elif kind in ("snapshot", "delta"):  # (a delta: the replicas its step changed; null: gone)
            for dep, d in rec["deployments"].items():
                for rid, r in (d or {}).get("replicas", {}).items():
                    if r is None:
                        continue
                    key = (dep, r["lineage"])
                    lineage_of[rid] = key
                    hold(key, r["global_rank"])
    return history
