"""tier_history: each replica's tier history read from the core's commands alone (issue 21),
from command records and from trace records alike."""

from __future__ import annotations

import rankcore as rc
from executors.scenarios.metrics import tier_history

RANK = rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)


def _place(rid: str, source: str) -> rc.PlaceReplica:
    return rc.PlaceReplica(replica_id=rid, deployment=rid.split("#")[0], node_id="n", rank=RANK,
                           devices=(0,) if source else (), source=source)


def test_each_tier_command_adds_its_step_in_order_per_replica() -> None:
    cmds = [
        _place("a#0", "cold"),
        _place("u#0", ""),  # not tiered: no tier decision
        rc.StartReplica(replica_id="b#0", deployment="b", global_rank=0, world_size=1),
        rc.EvictReplica(replica_id="a#0", deployment="a", node_id="n", to="warm", for_replica="b#0"),
        _place("b#0", "cold"),
        rc.EvictReplica(replica_id="b#0", deployment="b", node_id="n", to="cold", for_replica="a#1"),
        _place("a#1", "warm"),
        rc.DropWarmCopy(node_id="n", deployment="a", replica_id="a#0"),
        rc.OffloadReplica(replica_id="a#1", deployment="a"),
        rc.LoadReplica(replica_id="a#1", deployment="a"),
    ]
    assert tier_history(cmds) == {
        "a#0": ["hot<-cold", "evicted->warm", "dropped->cold"],
        "b#0": ["hot<-cold", "evicted->cold"],
        "a#1": ["hot<-warm", "warm", "hot<-warm"],
    }


def test_trace_records_give_the_same_history_and_events_are_ignored() -> None:
    records = [
        {"kind": "command", "type": "PlaceReplica", "fields": {"replica_id": "a#0", "source": "cold"}},
        {"kind": "event", "type": "ReplicaPlaced", "fields": {"replica_id": "a#0"}},
        {"kind": "command", "type": "EvictReplica", "fields": {"replica_id": "a#0", "to": "warm"}},
        {"kind": "command", "type": "StopReplica", "fields": {"replica_id": "a#0"}},
    ]
    assert tier_history(records) == {"a#0": ["hot<-cold", "evicted->warm"]}
