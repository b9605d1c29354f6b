"""Golden scenario scripts (raft's datadriven testdata): parse, run, render, rewrite.

A script is blocks separated by blank lines; ``#`` lines are comments. A block
is one line of input, ``----``, then the expected output (no blank lines).
The input is one event in the vocabulary of README.md (``deploy``, ``placed``,
``crashed``, ``tick``, ...), a Python constructor ``rc.Xxx(...)``, or
``settle`` (answer every outstanding command, one step each, like raft's
``stabilize``). Every step goes through ``rankcore.step`` and
``rankcore.invariants.check_step(before, event, result, full=True)``.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

import rankcore as rc
from rankcore.invariants import check_step

SEPARATOR = "----"
#: at most this many steps in one ``settle`` (a loop that never settles is a failure)
SETTLE_LIMIT = 500


class ScriptError(Exception):
    """A script that cannot be read: names the file and line."""


@attrs.define
class Block:
    line: int  # 1-based line of the input
    text: str  # the input line
    expected: list[str] | None  # None: no ``----`` yet (only allowed when rewriting)
    comments: list[str]  # the lines (comments, blanks) before the input


@attrs.define
class Script:
    path: Path
    blocks: list[Block]
    trailer: list[str]  # lines after the last block


def parse(path: Path) -> Script:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    pending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            pending.append(line)
            i += 1
            continue
        start = i
        i += 1
        expected: list[str] | None = None
        if i < len(lines) and lines[i] == SEPARATOR:
            i += 1
            expected = []
            while i < len(lines) and lines[i].strip():
                expected.append(lines[i])
                i += 1
        elif i < len(lines) and lines[i].strip() and not lines[i].startswith("#"):
            raise ScriptError(f"{path}:{i + 1}: expected {SEPARATOR!r} or a blank line after the input, "
                              f"got {lines[i]!r}")
        blocks.append(Block(line=start + 1, text=line, expected=expected, comments=pending))
        pending = []
    return Script(path=path, blocks=blocks, trailer=pending)


def render(script: Script, outputs: list[list[str]]) -> str:
    out: list[str] = []
    for block, got in zip(script.blocks, outputs):
        out.extend(block.comments)
        out.append(block.text)
        out.append(SEPARATOR)
        out.extend(got)
    while script.trailer and not script.trailer[-1].strip():
        script.trailer.pop()
    out.extend(script.trailer)
    return "\n".join(out) + "\n"


# -- the input vocabulary --------------------------------------------------------------------------

def _value(text: str) -> Any:
    """A ``key=value`` value: a Python literal when it reads as one, else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _split(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    pos: list[str] = []
    kw: dict[str, Any] = {}
    for a in args:
        key, eq, val = a.partition("=")
        if eq and key.isidentifier():
            kw[key] = _value(val)
        else:
            pos.append(a)
    return pos, kw


def _resources(kw: dict[str, Any], pos: list[str]) -> dict[str, float]:
    res = {}
    for a in pos:
        name, _, amount = a.partition("=")
        res[name] = float(amount)
    for name in [k for k in kw if k.isupper() or k in ("memory",)]:
        res[name] = float(kw.pop(name))
    return res


def _node_joined(pos: list[str], kw: dict[str, Any]) -> object:
    node = pos[0]
    return rc.NodeJoined(node_id=node, resources=_resources(kw, pos[1:]), **kw)


def _node_capacity(pos: list[str], kw: dict[str, Any]) -> object:
    return rc.NodeCapacityChanged(node_id=pos[0], resources=_resources(kw, pos[1:]))


def _deploy(pos: list[str], kw: dict[str, Any]) -> object:
    (name,) = pos
    if "replicas" in kw:
        kw["num_replicas"] = kw.pop("replicas")
    res = {}
    if "gpus" in kw:
        res["GPU"] = float(kw.pop("gpus"))
    if "cpus" in kw:
        res["CPU"] = float(kw.pop("cpus"))
    if res:
        kw["resources"] = res
    if "group" in kw:
        kw["static_placement"] = rc.StaticPlacement(group=kw.pop("group"), bundle_nodes=kw.pop("bundle_nodes"),
                                                    mapping=kw.pop("mapping"))
    return rc.DeploymentApplied(name=name, **kw)


def _scale(pos: list[str], kw: dict[str, Any]) -> object:
    name, count = pos
    victims = kw.pop("victims", ())
    if isinstance(victims, str):
        victims = tuple(v for v in victims.split(",") if v)
    return rc.ScaleRequested(deployment=name, num_replicas=int(count), victims=victims, **kw)


def _health(pos: list[str], kw: dict[str, Any]) -> object:
    rid, verdict = pos
    if verdict not in ("ok", "fail"):
        raise ValueError(f"health: say ok or fail, got {verdict!r}")
    return rc.HealthChecked(replica_id=rid, healthy=verdict == "ok", **kw)


def _bundles_placed(pos: list[str], kw: dict[str, Any]) -> object:
    name, *nodes = pos
    return rc.BundlesPlaced(deployment=name, bundle_nodes=[None if n == "-" else n for n in nodes])


#: word -> builder(positional args, key=value args): the readable one-line events
VOCABULARY: dict[str, Callable[[list[str], dict[str, Any]], object]] = {
    "node-joined": _node_joined,
    "node-capacity": _node_capacity,
    "node-lost": lambda pos, kw: rc.NodeLost(node_id=pos[0]),
    "deploy": _deploy,
    "scale": _scale,
    "delete": lambda pos, kw: rc.DeploymentDeleted(deployment=pos[0]),
    "placed": lambda pos, kw: rc.ReplicaPlaced(replica_id=pos[0], node_id=pos[1], **kw),
    "placement-failed": lambda pos, kw: rc.PlacementFailed(replica_id=pos[0], node_id=pos[1], **kw),
    "ready": lambda pos, kw: rc.ReplicaReady(replica_id=pos[0]),
    "reconfigured": lambda pos, kw: rc.ReplicaReconfigured(replica_id=pos[0], version=int(pos[1])),
    "crashed": lambda pos, kw: rc.ReplicaCrashed(replica_id=pos[0], **kw),
    "health": _health,
    "stopped": lambda pos, kw: rc.ReplicaStopped(replica_id=pos[0], **kw),
    "tick": lambda pos, kw: rc.Tick(now=float(pos[0])),
    "bundles-placed": _bundles_placed,
    "sleep": lambda pos, kw: rc.SleepRequested(deployment=pos[0]),
    "wake": lambda pos, kw: rc.WakeRequested(deployment=pos[0], **kw),
    "push": lambda pos, kw: rc.WeightsPushed(deployment=pos[0], version=int(pos[1])),
    "moved": lambda pos, kw: rc.TierMoved(replica_id=pos[0], tier=pos[1]),
    "move-failed": lambda pos, kw: rc.TierMoveFailed(replica_id=pos[0], **kw),
    "weights-updated": lambda pos, kw: rc.WeightsUpdated(replica_id=pos[0], version=int(pos[1])),
}


def event_of(text: str) -> object:
    """The event an input line says (raises on a line it cannot read)."""
    if text.startswith("rc."):
        return eval(text, {"rc": rc, "__builtins__": {}})  # a constructor, written by the script's author
    word, *args = text.split()
    if word not in VOCABULARY:
        raise ValueError(f"unknown word {word!r} (known: {', '.join(VOCABULARY)}, settle, or rc.Xxx(...))")
    pos, kw = _split(args)
    return VOCABULARY[word](pos, kw)


#: answer event type -> how an input line says it (for ``settle``'s trace)
_DESCRIBE: dict[type, Any] = {
    rc.ReplicaPlaced: lambda e: f"placed {e.replica_id} {e.node_id}",
    rc.ReplicaReady: lambda e: f"ready {e.replica_id}",
    rc.ReplicaReconfigured: lambda e: f"reconfigured {e.replica_id} {e.version}",
    rc.ReplicaStopped: lambda e: f"stopped {e.replica_id}",
    rc.TierMoved: lambda e: f"moved {e.replica_id} {e.tier}",
    rc.WeightsUpdated: lambda e: f"weights-updated {e.replica_id} {e.version}",
}


def describe(event: object) -> str:
    """An answer event as an input line would say it (for ``settle``'s trace)."""
    show = _DESCRIBE.get(type(event))
    return repr(event) if show is None else show(event)


# -- the output ------------------------------------------------------------------------------------

def _rank(rank: rc.ReplicaRank | None) -> str:
    return "-" if rank is None else f"({rank.rank},{rank.node_rank},{rank.local_rank})"


def _num(x: float) -> str:
    return f"{x:g}"


def _start(c: rc.StartReplica) -> str:
    s = f"StartReplica {c.replica_id} rank={c.global_rank} world={c.world_size}"
    if c.replaces:
        s += f" replaces={c.replaces}"
    if c.gang is not None:
        s += f" gang={c.gang.gang_id}:{c.gang.rank_in_gang}/{c.gang.gang_size} members={','.join(c.gang.members)}"
    return s


def _place(c: rc.PlaceReplica) -> str:
    s = f"PlaceReplica {c.replica_id} {c.node_id} rank={_rank(c.rank)}"
    if c.group is not None:
        s += f" group={c.group} bundles={','.join(map(str, c.bundles))}"
    if c.devices:
        s += f" devices={','.join(map(str, c.devices))} from={c.source}"
    return s


def _shape(need: tuple) -> str:
    return ",".join(f"{k}={_num(v)}" for k, v in need)


def _request(c: rc.RequestResources) -> str:
    """``RequestResources waiting=GPU=1x2 held=GPU=2;GPU=1`` (``-``: none)."""
    waiting = " ".join(f"{_shape(need)}x{n}" for need, n in c.waiting) or "-"
    return f"RequestResources waiting={waiting} held={';'.join(_shape(b) for b in c.held) or '-'}"


#: command type -> its line (the commands are final classes)
_SHOW: dict[type, Any] = {
    rc.StartReplica: _start,
    rc.PlaceReplica: _place,
    rc.InitializeReplica: lambda c: (f"InitializeReplica {c.replica_id} rank={_rank(c.rank)} world={c.world_size}"
                                     + (f" weights={c.weights_version}" if c.weights_version else "")),
    rc.OffloadReplica: lambda c: f"OffloadReplica {c.replica_id}",
    rc.LoadReplica: lambda c: f"LoadReplica {c.replica_id}",
    rc.UpdateWeights: lambda c: f"UpdateWeights {c.replica_id} {c.version}",
    rc.ReconfigureReplica: lambda c: (f"ReconfigureReplica {c.replica_id} rank={_rank(c.rank)} "
                                      f"world={c.world_size} reason={c.reason} version={c.version}"),
    rc.StopReplica: lambda c: f"StopReplica {c.replica_id} grace={_num(c.graceful_shutdown_timeout_s)}",
    rc.UpdateWorldSize: lambda c: f"UpdateWorldSize {c.deployment} {c.world_size}",
    rc.ScheduleTick: lambda c: f"ScheduleTick {_num(c.at)}",
    rc.GangChanged: lambda c: f"GangChanged {c.gang_id} members={','.join(c.members)}",
    rc.ReformGroup: lambda c: (f"ReformGroup {c.replica_id} {c.group.group_id} epoch={c.group.epoch} "
                               f"rank={c.group.rank}/{c.group.world_size} members={','.join(c.group.members)} "
                               + ("in-place" if c.group.in_place else "joins" if c.group.previous_rank is None
                                  else f"moved-from={c.group.previous_rank}")),
    rc.KeepSpareProcesses: lambda c: f"KeepSpareProcesses {c.deployment} {c.node_id} {c.count}",
    rc.EvictReplica: lambda c: f"EvictReplica {c.replica_id} {c.node_id} to={c.to} for={c.for_replica}",
    rc.DropWarmCopy: lambda c: f"DropWarmCopy {c.node_id} {c.deployment} {c.replica_id}",
    rc.RequestResources: _request,
}


def show_command(c: object) -> str:
    """One command, compact and deterministic."""
    show = _SHOW.get(type(c))
    return repr(c) if show is None else show(c)


def show_state(state: rc.State) -> list[str]:
    """Every deployment (by name): its status, then its replicas in global-rank order."""
    out: list[str] = []
    for name in sorted(state.deployments.keys()):
        dep = state.deployments[name]
        out.append(f"{name}: {dep.status} target={dep.target}" + (" asleep" if dep.asleep else "")
                   + (f" weights={dep.weights_version}" if dep.weights_version else ""))
        for rid, rank in dep.ranks.items():
            r = dep.replicas.get(rid)
            phase = r.phase.value if r is not None else "?"
            node = (r.node_id if r is not None else None) or "-"
            shown = _rank(rank) if rank is not None else f"({dep.ranks.global_rank(rid)},-,-)"
            extra = ""
            if r is not None and r.residency is not rc.Residency.HOT:
                extra += f" {r.residency.value}"
            if r is not None and (r.weights_version or r.weights_pending):
                extra += f" weights={r.weights_version}{'?' if r.weights_pending else ''}"
            out.append(f"  {rid} {phase} {node} {shown}{extra}")
        ranked = {rid for rid, _ in dep.ranks.items()}
        for rid in sorted(k for k in dep.replicas if k not in ranked):
            r = dep.replicas[rid]
            out.append(f"  {rid} {r.phase.value} {r.node_id or '-'} no-rank")
    cl = state.cluster
    for node_id in sorted(cl.devices.keys()):  # GPU memory booked (rankcore.tiers.devices): who holds what, where
        held = sorted((tuple(r.devices), rid, r.bytes_per_device, r.leaving, rid in cl.evicting)
                      for rid, (n, r) in cl.hot.items() if n == node_id)
        gpu = " ".join(f"{rid}@{','.join(map(str, d))}={b}" + ("(leaving)" if gone else "(claim)" if claim else "")
                       for d, rid, b, gone, claim in held)
        cache = " ".join(f"{e.deployment}:{e.replica_id}={e.nbytes}" for e in cl.caches.get(node_id, ()))
        out.append(f"gpu {node_id}: {gpu or '-'} | warm: {cache or '-'}")
    return out


# -- running ---------------------------------------------------------------------------------------

#: the command each kind of outstanding command is answered by, in ``settle``
def _answer(c: object) -> object | None:
    if isinstance(c, rc.PlaceReplica):
        return rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id)
    if isinstance(c, rc.InitializeReplica):
        return rc.ReplicaReady(replica_id=c.replica_id)
    if isinstance(c, rc.ReconfigureReplica):
        return rc.ReplicaReconfigured(replica_id=c.replica_id, version=c.version)
    if isinstance(c, (rc.StopReplica, rc.EvictReplica)):
        return rc.ReplicaStopped(replica_id=c.replica_id)
    if isinstance(c, rc.OffloadReplica):
        return rc.TierMoved(replica_id=c.replica_id, tier="warm")
    if isinstance(c, rc.LoadReplica):
        return rc.TierMoved(replica_id=c.replica_id, tier="hot")
    if isinstance(c, rc.UpdateWeights):
        return rc.WeightsUpdated(replica_id=c.replica_id, version=c.version)
    return None


def _channel(x: object) -> str:
    """What an answer or a command is about: a replica's life, its tier, its weights
    (one of each may be owed at once)."""
    if isinstance(x, (rc.OffloadReplica, rc.LoadReplica, rc.TierMoved, rc.TierMoveFailed)):
        return "tier"
    if isinstance(x, (rc.UpdateWeights, rc.WeightsUpdated)):
        return "weights"
    return "life"


class Runner:
    """Feeds a script's events to the core, one step each, and keeps what is owed an answer."""

    def __init__(self) -> None:
        self.state = rc.State()
        #: (replica id, channel) -> the latest command about it that awaits an answer (emission order)
        self.owed: dict[tuple[str, str], object] = {}

    def step(self, event: object) -> list[str]:
        before = self.state
        try:
            result = rc.step(before, event)
        except rc.RankcoreError as e:
            return [f"error {type(e).__name__}: {e}"]
        check_step(before, event, result, full=True)
        self.state = result.state
        rid = getattr(event, "replica_id", None)
        if isinstance(event, (rc.ReplicaPlaced, rc.ReplicaReady, rc.ReplicaReconfigured, rc.ReplicaStopped,
                              rc.ReplicaCrashed, rc.PlacementFailed, rc.TierMoved, rc.TierMoveFailed,
                              rc.WeightsUpdated)):
            self.owed.pop((rid, _channel(event)), None)
        for c in result.commands:
            if _answer(c) is not None:
                key = (c.replica_id, _channel(c))
                self.owed.pop(key, None)
                self.owed[key] = c
        for gone in [k for k in self.owed if self.state.replica(k[0]) is None]:
            del self.owed[gone]
        lines = [show_command(c) for c in result.commands]
        if result.stale:
            lines.append("stale")
        return lines

    def run(self, text: str) -> list[str]:
        if text.split()[0] == "settle":
            return self.settle()
        try:
            event = event_of(text)
        except rc.RankcoreError as e:
            return [f"error {type(e).__name__}: {e}"] + show_state(self.state)
        return self.step(event) + show_state(self.state)

    def settle(self) -> list[str]:
        """Answer every outstanding command, oldest first, until none is owed."""
        lines: list[str] = []
        for _ in range(SETTLE_LIMIT):
            if not self.owed:
                return lines + show_state(self.state)
            key = next(iter(self.owed))
            event = _answer(self.owed.pop(key))
            lines.append(f"> {describe(event)}")
            lines.extend(f"  {line}" for line in self.step(event))
        raise ScriptError(f"settle did not settle in {SETTLE_LIMIT} steps")


def check(path: Path, rewrite: bool, runner: Any = None) -> str | None:
    """Run one script; rewrite it, or return a diff of what differs (None: all as expected).
    ``runner``: what runs each block's input line (``run(text) -> output lines``); the core's
    ``Runner`` by default (the request plane's: ``requests_golden.Runner``)."""
    script = parse(path)
    runner = Runner() if runner is None else runner
    outputs: list[list[str]] = []
    problems: list[str] = []
    for block in script.blocks:
        try:
            got = runner.run(block.text)
        except Exception as e:
            raise ScriptError(f"{path}:{block.line}: {block.text!r}: {type(e).__name__}: {e}") from e
        outputs.append(got)
        if not rewrite:
            if block.expected is None:
                problems.append(f"{path}:{block.line}: {block.text!r} has no {SEPARATOR!r} "
                                f"(run with RANKCORE_REWRITE=1 to write its output)")
            elif block.expected != got:
                diff = difflib.unified_diff(block.expected, got, f"expected ({path.name}:{block.line})",
                                            "got", lineterm="")
                problems.append(f"{path}:{block.line}: {block.text}\n" + "\n".join(diff))
                break  # what follows a first difference differs for that reason
    if rewrite:
        path.write_text(render(script, outputs))
        return None
    return "\n\n".join(problems) or None
