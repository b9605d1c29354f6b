"""A scripted walk through the core: upscale, crash, downscale, recovery.

A toy executor that answers every command at once (placing replicas round
robin on a few nodes) so the rank rules can be seen without a cluster. The
simulator (executors/sim) replaces this with virtual time, latencies and
faults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rich.console import Console
from rich.table import Table

import rankcore as rc
from rankcore.invariants import check_state, reports_from
from rankcore.protocol import answers


class InstantExecutor:
    """Answers each command immediately; replicas go to nodes round robin, a
    crash replacement to the node of the replica it replaces."""

    def __init__(self, nodes: Iterable[str], on_step: Callable[[object, rc.Step], None] | None = None) -> None:
        self.nodes = list(nodes)
        self.state = rc.State()
        self.next_node = 0
        self.on_step = on_step
        self.log: list[object] = []
        self.where: dict[str, str] = {}

    def feed(self, event: object) -> None:
        queue = [event]
        while queue:
            ev = queue.pop(0)
            result = rc.step(self.state, ev)
            check_state(result.state)
            self.state = result.state
            if self.on_step:
                self.on_step(ev, result)
            for cmd in result.commands:
                self.log.append(cmd)
                queue.extend(self.answer(cmd))

    def answer(self, cmd: object) -> list[object]:
        node = None
        if isinstance(cmd, rc.StartReplica):
            node = self.where.get(cmd.replaces or "")
            if node is None:
                node = self.nodes[self.next_node % len(self.nodes)]
                self.next_node += 1
            self.where[cmd.replica_id] = node
        return answers(cmd, node or "")


def _table(state: rc.State, deployment: str, title: str) -> Table:
    dep = state.deployments[deployment]
    t = Table(title=f"{title}  [dim](world_size={dep.world_size}, healthy={dep.healthy})[/dim]")
    for col in ("replica", "node", "rank", "node_rank", "local_rank", "phase"):
        t.add_column(col, justify="right" if "rank" in col else "left")
    rows = []
    for rid, rep in dep.replicas.items():
        rk = dep.ranks.rank_of(rid)
        g = dep.ranks.global_rank(rid)
        rows.append((g, rid, rep.node_id or "-", rk, rep.phase.value))
    for g, rid, node, rk, phase in sorted(rows):
        t.add_row(rid, node, str(g), str(rk.node_rank) if rk else "-", str(rk.local_rank) if rk else "-", phase)
    return t


def run_demo(console: Console | None = None) -> rc.State:
    """Print ranks through upscale, crash, downscale and controller recovery."""
    console = console or Console()
    reconfigures: list[rc.ReconfigureReplica] = []

    def on_step(event: object, result: rc.Step) -> None:
        reconfigures.extend(c for c in result.commands if isinstance(c, rc.ReconfigureReplica))

    ex = InstantExecutor(["node-a", "node-b", "node-c"], on_step)
    name = "llm"

    def show(title: str) -> None:
        console.print(_table(ex.state, name, title))
        if reconfigures:
            for c in reconfigures:
                console.print(
                    f"  reconfigure {c.replica_id}: rank={c.rank.rank} node_rank={c.rank.node_rank} "
                    f"local_rank={c.rank.local_rank} ({c.reason})"
                )
            reconfigures.clear()

    console.rule("[bold]rankcore demo")
    ex.feed(rc.DeploymentApplied(name=name, num_replicas=4, user_config={"model": "v1"},
                                 has_reconfigure=True, reconfigure_takes_rank=True))
    show("1. deploy 4 replicas on 3 nodes")
    ex.feed(rc.ScaleRequested(deployment=name, num_replicas=6))
    show("2. upscale 4 -> 6: existing ranks unchanged, new ones get the lowest free")
    victim = next(r for r in ex.state.deployments[name].replicas if ex.state.deployments[name].ranks.global_rank(r) == 2)
    ex.feed(rc.ReplicaCrashed(replica_id=victim, reason="demo"))
    show(f"3. {victim} (rank 2) crashes: its replacement gets rank 2")
    dep = ex.state.deployments[name]
    victims = tuple(r for r in sorted(dep.replicas) if dep.ranks.global_rank(r) in (0, 3, 4))
    ex.feed(rc.ScaleRequested(deployment=name, num_replicas=3, victims=victims))
    show("4. downscale 6 -> 3 (stopping ranks 0, 3, 4): compacted once healthy, fewest changes")
    # Controller recovery: one replica died while the controller was down; the
    # survivors report their ranks in all three forms Ray Serve has produced.
    exact = reports_from(ex.state)
    died = exact.reports[0].replica_id
    forms = []
    for i, r in enumerate(exact.reports[1:]):
        rank = r.rank
        assert rank.node_rank is not None and rank.local_rank is not None  # a placed replica's full rank
        value = [
            rc.ReplicaRank(rank=rank.rank, node_rank=rank.node_rank, local_rank=rank.local_rank),
            {"rank": rank.rank, "node_rank": rank.node_rank, "local_rank": rank.local_rank},
            rank.rank,
        ][i % 3]
        forms.append(rc.ReplicaReport(replica_id=r.replica_id, deployment=r.deployment, rank=value,
                                      node_id=r.node_id, world_size=r.world_size, lineage=r.lineage))
    ex.state = rc.State()  # the controller lost everything
    ex.feed(rc.ControllerRecovered(deployments=exact.deployments, reports=tuple(forms)))
    show(f"5. controller recovered from reports ({died} died meanwhile): its gap is refilled")
    console.print(f"[green]done[/green]: {len(ex.log)} commands carried out, invariants held after every step")
    return ex.state
