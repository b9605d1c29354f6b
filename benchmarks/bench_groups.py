"""Collective groups after a member's crash: rankcore's ``collective_group`` against Ray Serve 2.60's
gang scheduling (``RESTART_GANG``) and ``torchrun`` elastic, same run, same model (issue 67).

What it measures
----------------
One data-parallel model, written once (``_Member``), run by all three systems: ``--world`` members
(default 4), each of which at start "loads weights" (a float32 torch tensor of ``--weights-mb`` MB,
default 64, filled, plus ``--load-s`` s of sleep standing for the rest of a model load, default 1.0)
and then loops: an all-reduce (``torch.distributed``, gloo, CPU) of a tensor holding rank + 1, checked
against W(W+1)/2, every 50 ms. Each member appends to a file of its own (one per process, in a
temporary folder of the run) what it saw: ``ready`` (weights loaded), the first correct all-reduce of
each generation of its group (generation, rank, world, value, pid, time), every wrong one, and its
errors. The three systems:

* **ours**: ``executors.ray_gpu.deployment(..., num_replicas=W, collective_group=True)`` (not a gang:
  a crash replaces that member alone on its rank, ``restart_replica``'s behaviour, the survivors stay);
  the loop is ``ProcessGroup(backend="gloo", timeout_s=--group-timeout).ensure()`` then the all-reduce,
  and on an error ``failed`` (examples/ray/data_parallel_group.py's loop). Generation: the epoch.
  A member is killed with ``ray.kill(actor, no_restart=True)``.
* **serve**: ``serve.deployment(..., num_replicas=W, gang_scheduling_config=GangSchedulingConfig(
  gang_size=W, runtime_failure_policy=RESTART_GANG))``, the group formed as Ray Serve LLM's
  ``DPServer`` forms its data-parallel group (ray/llm/_internal/serve/serving_patterns/data_parallel/
  dp_server.py): the replica context's ``gang_context`` gives the DP rank and size; in the constructor
  gang rank 0 takes an address and free port (``ray.util.collective.collective.get_address_and_port``)
  and publishes ``{address, port, node_id}`` in Ray's GCS KV store under the gang's id, the others
  wait for it there; then (here: plain torch gloo instead of vLLM) ``init_process_group(init_method=
  "tcp://address:port")``. No re-form: a broken group waits for Serve to restart the gang.
  Generation: the gang id (new at each gang start). Killed with ``ray.kill(actor, no_restart=True)``.
  (DPServer polls the KV store every 0.5 s; here every 0.05 s, in Serve's favour.)
* **torchrun**: ``torchrun --nnodes=1:1 --nproc-per-node=W --max-restarts=<trials + 2>
  --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:<free port>`` (its default ``--monitor-interval``
  0.1 s) running this very script as the worker (``--torchrun-worker``; no script is written
  elsewhere): ``init_process_group("gloo")`` from torchrun's environment; generation:
  ``TORCHELASTIC_RESTART_COUNT``. A worker is killed with SIGKILL; torchrun restarts every worker.

Both Ray systems use the same health checks (``health_check_period_s`` = ``--health-period``,
default 1 s, ``health_check_timeout_s`` 3 s; Serve's own default period is 10 s) and replicas of
``num_cpus`` 0.05, each in a fresh local Ray (``ray.init(address="local", num_cpus=--num-cpus)``).
Serve's and torchrun's groups form once per process (a first rendezvous of members started together
on a loaded host must not time out: 60 s); ours' ``ProcessGroup`` bounds its rendezvous and each
collective by ``--group-timeout`` (default 5 s, examples/ray/data_parallel_group.py's). A collective
mostly fails at once when a peer's process dies (gloo: connection closed), but a survivor may be
blocked on another survivor, not on the dead member (seen when rank 0 is killed): before
``ProcessGroup.failed`` it waited out that timeout ("Timed out waiting 5000ms for recv") and ours was
back about 5 s after the kill, +2 s over one replica start; ``failed`` leaves the broken epoch at once,
which closes that member's connections and releases whoever waits on it. The per-trial member errors
in the ``--json`` file show what each survivor saw. Serve and torchrun kill every survivor anyway.

torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a fresh store each restart): as it ships
(torch 2.13), its restarted workers share the agent's store with the group they replace and may read
its stale addresses (pytorch/pytorch#135712; here a restart then failed to form at all);
``--torchrun-shared-store`` measures that. A torchrun worker exits on an error, as a training script
does.

Each system runs in a child process of its own (childrun.py), one after the other. In each,
``--trials`` times (default 2): wait until all W members reported a correct all-reduce in one
generation and 1 s passed without an error, kill the member of rank ``--kill-ranks`` (trial i: the
i-th, cycling; default 1 then 0: a member, then the one that holds the rendezvous), and measure:

* **back after kill**: seconds from the kill until every one of the W ranks reported a correct
  all-reduce at world W in a generation newer than any before the kill;
* **one replica start**: seconds from the kill until the first process started after it has loaded
  its weights (ours: the replacement; Serve and torchrun: the first of the restarted members), the
  reference of the goal "back in at most one replica start + 1 s", judged in each trial against its
  own start (the table gives each trial's back minus start);
* **survivors restarted**: members of the generation killed into, the victim aside, whose process is
  not a member of the re-formed generation (summed over the trials, out of the survivors);
* **wrong results**: all-reduces whose value was not W(W+1)/2 for the world the member saw, plus
  requests answered a wrong value;
* **requests failed/sent**: from the kill until ``--tail`` s (default 1) after back, a request every
  ``--every`` s (default 0.05), each its own task bounded by ``--request-timeout`` (default 2 s, a
  timeout counts failed: nothing hangs), asking a replica through the system's handle for its last
  all-reduce (``step_now``; it raises while the member's group is broken: ours ``GroupReforming``).
  torchrun: n/a (its workers serve no requests; there is nothing to send one to).

Medians over the trials for the times. Printed: a table, ours' time over Serve's and over
torchrun's, and the goal of issue 67: ours back in at most one replica start + 1 s after every kill,
0 survivors restarted, 0 wrong results, and back sooner (median) than both others (those measured).
For ours the ``--json`` file also has, per trial, when each member was told the new epoch
(``on_group_changed``) and was back, and the members' errors after the kill.

How to run
----------
    .venv/bin/python benchmarks/bench_groups.py                      # all three, W=4, 2 trials: ~2 min
    .venv/bin/python benchmarks/bench_groups.py --quick              # W=3, 8 MB, 1 trial
    .venv/bin/python benchmarks/bench_groups.py --only ours,torchrun --world 2 --json out.json

Needs the ``bench`` extra (Ray Serve) for serve; ``--only ours,torchrun`` does not. Progress goes to
stderr; the table (and ``--json`` file) is the result. Timings on a small shared host are noisy:
compare within one run. ``RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from common import (
    ROOT,
    OursReplica,
    ServeReplica,
    awaitable,
    free_port,
    merged_counts,
    print_table,
    replica_id,
    use_this_tree,
)

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)

SYSTEMS = ("ours", "serve", "torchrun")
TITLES = {"ours": "ours (collective_group)", "serve": "Serve 2.60 RESTART_GANG", "torchrun": "torchrun elastic"}
DEP = "dp"  # deployment name (and Serve application name)
ACTOR_OPTIONS = {"num_cpus": 0.05}
HEALTH_TIMEOUT_S = 3.0
STEP_S = 0.05  # a member's pause between all-reduces
FORM_TIMEOUT_S = 60.0  # Serve's and torchrun's one rendezvous per process
QUIET_S = 1.0  # steady: this long after the last member's first correct all-reduce, no error
GOAL_SLACK_S = 1.0  # the goal: back within one replica start + this
#: Ray Serve LLM's key prefix for a gang's DP master (GangMasterInfoRegistry), this benchmark's own
KV_PREFIX = "bench_groups:gang_dp_master/"
DEFAULTS = {"world": 4, "weights_mb": 64, "load_s": 1.0, "trials": 2, "kill_ranks": [1, 0]}
QUICK = {"world": 3, "weights_mb": 8, "load_s": 0.5, "trials": 1, "kill_ranks": [1]}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_groups {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def expected(world: int) -> float:
    """A correct all-reduce of rank + 1 over ``world`` members."""
    return world * (world + 1) / 2


# ---------------------------------------------------------------- the model
class Records:
    """A member's file of what it saw: JSON lines in ``<folder>/<pid>.jsonl``."""

    def __init__(self, folder: str, **fields: Any) -> None:
        self.fields = {"pid": os.getpid(), **fields}
        self.file = open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a")
        self.lock = threading.Lock()

    def write(self, kind: str, **fields: Any) -> None:
        with self.lock:
            self.file.write(json.dumps({"k": kind, "t": time.time(), **self.fields, **fields}) + "\n")
            self.file.flush()


def read_records(folder: str) -> list[dict]:
    """Every member's records in ``folder``, by time (a line being written is skipped)."""
    out = []
    for path in pathlib.Path(folder).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return sorted(out, key=lambda r: r["t"])


class _Member:
    """The model all three systems run: weights loaded at start, then an all-reduce of rank + 1 every
    ``STEP_S``, checked. A system's class says how its group is joined (``_join`` -> (generation,
    rank, world)) and what to do after an error (``_after_error``)."""

    last: tuple[str, int, float] | None = None  # (generation, world, value) of the last all-reduce

    def _load(self, folder: str, weights_mb: int, load_s: float, **who: Any) -> None:
        import torch

        self.weights = torch.full((max(1, weights_mb * 2**20 // 4),), 0.5)  # (float32: filled, touched)
        self.weights.add_(0.5)
        time.sleep(load_s)
        self.records = Records(folder, **who)
        self.records.write("ready")
        self.stop = threading.Event()
        self._gens: set[str] = set()
        self._last_error = (None, 0.0)

    def _join(self) -> tuple[str, int, int]:
        raise NotImplementedError

    def _after_error(self) -> None:
        self.stop.wait(0.2)

    def _step(self) -> None:
        import torch
        import torch.distributed as dist

        try:
            gen, rank, world = self._join()
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
        except Exception as exc:  # a member gone mid-call, no group yet: said once a second at most
            self.last = None
            said = f"{type(exc).__name__}: {exc}"[:200]
            if said != self._last_error[0] or time.time() - self._last_error[1] > 1.0:
                self.records.write("error", error=said)
                self._last_error = (said, time.time())
            self._after_error()
            return
        value = t.item()
        self.last = (gen, world, value)
        if value != expected(world):
            self.records.write("wrong", gen=gen, rank=rank, world=world, value=value)
        elif gen not in self._gens:
            self._gens.add(gen)
            self.records.write("ok", gen=gen, rank=rank, world=world, value=value)

    def _loop(self) -> None:
        while not self.stop.is_set():
            self._step()
            self.stop.wait(STEP_S)

    def _answer(self) -> float:
        if self.last is None:
            raise RuntimeError("the group is broken or re-forming")
        return self.last[2]


class OursDP(OursReplica, _Member):
    """ours: the group re-formed in place at each epoch the core tells (``ProcessGroup``)."""

    def __init__(self, folder: str, weights_mb: int, load_s: float, group_timeout: float) -> None:
        from executors.ray_gpu.replica.collective import ProcessGroup

        ctx = self.context()
        self.pg = ProcessGroup(backend="gloo", timeout_s=group_timeout)
        self._load(folder, weights_mb, load_s, rid=str(ctx.replica_id), start_rank=ctx.rank.rank)
        threading.Thread(target=self._loop, daemon=True).start()

    def _join(self) -> tuple[str, int, int]:
        g = self.pg.ensure(wait_s=1.0)
        return str(g.epoch), g.rank, g.world_size

    def _after_error(self) -> None:
        self.pg.failed(wait_s=1.0)

    def on_group_changed(self, group: Any) -> None:
        """(Called by the replica after each epoch told: the time it was told, for the breakdown.)"""
        if hasattr(self, "records"):
            self.records.write("told", gen=str(group.epoch), rank=group.rank, world=group.world_size)

    def step_now(self) -> float:
        from executors.ray_gpu.replica.collective import GroupReforming

        if self.last is None:
            raise GroupReforming("the group is re-forming")
        return self.last[2]

    def __del__(self) -> None:
        if hasattr(self, "stop"):
            self.stop.set()


class ServeDP(ServeReplica, _Member):
    """Ray Serve: DPServer's pattern (gang rank, master address in the GCS KV store), plain torch gloo."""

    def __init__(self, folder: str, weights_mb: int, load_s: float, group_timeout: float) -> None:
        import ray
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

        ctx = self.context()
        gang = ctx.gang_context
        if gang is None:
            raise RuntimeError("needs gang scheduling (gang_scheduling_config)")
        self.dp_rank, self.dp_size, self.gang_id = gang.rank, gang.world_size, gang.gang_id
        key = (KV_PREFIX + gang.gang_id).encode()
        if self.dp_rank == 0:  # (DPServer: before the engine, and so the weights, loads)
            from ray.util.collective.collective import get_address_and_port

            self.address, self.port = get_address_and_port()
            _internal_kv_put(key, json.dumps({"address": self.address, "port": self.port,
                                              "node_id": ray.get_runtime_context().get_node_id()}).encode(),
                             overwrite=True)
        else:
            deadline = time.monotonic() + FORM_TIMEOUT_S
            while (data := _internal_kv_get(key)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no DP master info for gang {gang.gang_id} in {FORM_TIMEOUT_S:g} s")
                time.sleep(0.05)
            info = json.loads(data)
            self.address, self.port = info["address"], info["port"]
        self._load(folder, weights_mb, load_s, rid=replica_id(ctx), start_rank=self.dp_rank)
        self.formed = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _join(self) -> tuple[str, int, int]:
        import torch.distributed as dist

        if not self.formed:
            dist.init_process_group("gloo", init_method=f"tcp://{self.address}:{self.port}", rank=self.dp_rank,
                                    world_size=self.dp_size, timeout=datetime.timedelta(seconds=FORM_TIMEOUT_S))
            self.formed = True
        return self.gang_id, self.dp_rank, self.dp_size

    def step_now(self) -> float:
        return self._answer()

    def __del__(self) -> None:
        if hasattr(self, "stop"):
            self.stop.set()


class TorchrunDP(_Member):
    """torchrun's worker: the group from torchrun's environment, formed once per worker."""

    def __init__(self, folder: str, weights_mb: int, load_s: float) -> None:
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.gen = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.formed = False
        self._load(folder, weights_mb, load_s, rid=f"worker-{self.rank}", start_rank=self.rank)

    def _join(self) -> tuple[str, int, int]:
        import torch.distributed as dist

        if not self.formed:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=FORM_TIMEOUT_S))
            self.formed = True
        return self.gen, self.rank, self.world

    def _after_error(self) -> None:
        raise SystemExit(1)  # (as a training script does on an error: torchrun restarts the group)


def torchrun_worker(args: argparse.Namespace) -> int:
    """The worker torchrun starts (``--torchrun-worker FOLDER``): the loop until ``FOLDER/stop`` exists."""
    member = TorchrunDP(args.torchrun_worker, args.weights_mb, args.load_s)
    stop = os.path.join(args.torchrun_worker, "stop")
    while not os.path.exists(stop):
        member._step()
        time.sleep(STEP_S)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


# --------------------------------------------------------------- analysis
def _first_ok(records: list[dict], world: int, since: float, old_gens: set) -> dict[str, dict[int, dict]]:
    """By generation (not in ``old_gens``), by rank: its first correct all-reduce at ``world`` at or after ``since``."""
    by_gen: dict[str, dict[int, dict]] = {}
    for r in records:
        if r["k"] == "ok" and r["world"] == world and r["t"] >= since and r["gen"] not in old_gens:
            by_gen.setdefault(r["gen"], {}).setdefault(r["rank"], r)
    return by_gen


def steady(records: list[dict], world: int, now: float) -> dict | None:
    """The newest generation where all ``world`` ranks reported a correct all-reduce, at least
    ``QUIET_S`` before ``now``, with no error or wrong result since: its time, members' pids and
    replica ids by rank, and every generation seen (None: not steady yet)."""
    complete = [(max(r["t"] for r in ranks.values()), gen, ranks)
                for gen, ranks in _first_ok(records, world, 0.0, set()).items() if sorted(ranks) == list(range(world))]
    if not complete:
        return None
    t, gen, ranks = max(complete, key=lambda c: c[0])
    if now - t < QUIET_S or any(r["k"] in ("error", "wrong") and r["t"] >= t for r in records):
        return None
    return {"gen": gen, "t": t, "pids": {k: r["pid"] for k, r in ranks.items()},
            "rids": {k: r.get("rid") for k, r in ranks.items()},
            "gens": sorted({r["gen"] for r in records if "gen" in r})}


def recovery(records: list[dict], t_kill: float, before: dict, victim: int, world: int) -> dict:
    """What a kill at ``t_kill`` of rank ``victim`` of ``before`` (``steady``'s) led to: back_s (until
    every rank all-reduced right at ``world`` in a generation newer than those before; None: not
    back), start_s (until the first process started since loaded its weights), survivors restarted
    (of the members before, the victim aside: not in the re-formed generation; None if not back),
    wrong (wrong all-reduces since the kill), the generation re-formed."""
    complete = [(max(r["t"] for r in ranks.values()), gen, ranks)
                for gen, ranks in _first_ok(records, world, t_kill, set(before["gens"])).items()
                if sorted(ranks) == list(range(world))]
    survivors = {k: pid for k, pid in before["pids"].items() if k != victim}
    out: dict[str, Any] = {"back_s": None, "gen": None, "survivors": len(survivors), "restarted": None}
    if complete:
        t, gen, ranks = min(complete, key=lambda c: c[0])
        pids = {r["pid"] for r in ranks.values()}
        out.update(back_s=t - t_kill, gen=gen, restarted=sum(1 for pid in survivors.values() if pid not in pids))
        told = {r["rank"]: r["t"] for r in records if r["k"] == "told" and r["gen"] == gen}
        out["ranks_back_s"] = {k: round(r["t"] - t_kill, 3) for k, r in sorted(ranks.items())}
        # (ours: when each member was told the epoch re-formed)
        out["told_s"] = {k: round(t - t_kill, 3) for k, t in sorted(told.items())} or None
    old = set(before["pids"].values())
    starts = [r["t"] for r in records if r["k"] == "ready" and r["t"] >= t_kill and r["pid"] not in old]
    out["start_s"] = min(starts) - t_kill if starts else None
    out["wrong"] = sum(1 for r in records if r["k"] == "wrong" and r["t"] >= t_kill)
    out["member_errors"] = [f"{r['t'] - t_kill:.2f}s pid {r['pid']}: {r['error']}"[:160]
                            for r in records if r["k"] == "error" and r["t"] >= t_kill][:12]
    return out


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None




def summarise(res: dict) -> dict:
    """A system's trials as its table row: medians of the times, sums of the counts (requests: None
    when it serves none)."""
    trials = res.get("trials", [])
    reqs = [t["requests"] for t in trials if t.get("requests") is not None]
    return {"trials": len(trials), "back_s": _median([t["back_s"] for t in trials]),
            "back_all": [t["back_s"] for t in trials], "start_s": _median([t["start_s"] for t in trials]),
            "start_all": [t["start_s"] for t in trials], "not_back": sum(1 for t in trials if t["back_s"] is None),
            "after_start_all": [t["back_s"] - t["start_s"] if t["back_s"] is not None and t["start_s"] is not None
                                else None for t in trials],
            "restarted": sum(t["restarted"] or 0 for t in trials),
            "restarted_unknown": sum(1 for t in trials if t["restarted"] is None),
            "survivors": sum(t["survivors"] for t in trials),
            "wrong": sum(t["wrong"] + (t["requests"] or {}).get("wrong", 0) for t in trials),
            "req_failed": sum(r["failed"] for r in reqs) if reqs else None,
            "req_timeouts": sum(r["timeouts"] for r in reqs) if reqs else None,
            "req_sent": sum(r["sent"] for r in reqs) if reqs else None,
            "failed_by": merged_counts([r["failed_by"] for r in reqs]),
            "first_failures": list(dict.fromkeys(e for r in reqs for e in r["first_errors"]))[:3],
            "kill_ranks": [t["victim"] for t in trials], "errors": res.get("errors", [])}


def judge(rows: dict[str, dict]) -> dict:
    """Issue 67's goal from the rows by system: ours back within one replica start + ``GOAL_SLACK_S``
    in every trial (each against its own start), 0 survivors restarted, 0 wrong results, every trial
    back, and sooner (median) than each other system measured; the ratios ours / theirs of the median
    time back. ``met`` None: ours not measured."""
    ours = rows.get("ours")
    out: dict[str, Any] = {"ratios": {}, "checks": {}, "met": None}
    for other in ("serve", "torchrun"):
        theirs = rows.get(other)
        if ours and theirs and ours["back_s"] is not None and theirs["back_s"]:
            out["ratios"][other] = ours["back_s"] / theirs["back_s"]
    if not ours or not ours["trials"]:
        return out
    back = ours["back_s"]
    checks = {"back within one replica start + 1 s, every trial": all(
                  x is not None and x <= GOAL_SLACK_S for x in ours["after_start_all"]),
              "0 survivors restarted": ours["restarted"] == 0 and ours["restarted_unknown"] == 0,
              "0 wrong results": ours["wrong"] == 0,
              "back after every kill": ours["not_back"] == 0}
    for other in ("serve", "torchrun"):
        theirs = rows.get(other)
        if theirs and theirs["trials"]:
            checks[f"ahead of {other}"] = back is not None and (theirs["back_s"] is None or back < theirs["back_s"])
    out["checks"] = checks
    out["met"] = all(checks.values())
    return out


def print_report(results: dict, args: argparse.Namespace) -> tuple[dict, dict]:
    rows = {name: summarise(res) for name, res in results.items()}
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), None)
    torch_version = next((r.get("torch_version") for r in results.values() if r.get("torch_version")), "?")
    print(f"\ncollective group after a member's kill: world {args.world}, weights {args.weights_mb} MB + "
          f"{args.load_s:g} s load, {args.trials} trial(s) killing rank(s) "
          f"{[args.kill_ranks[i % len(args.kill_ranks)] for i in range(args.trials)]}, health checks every "
          f"{args.health_period:g} s (Ray systems), a request every {args.every:g} s, "
          + (f"Ray {version}, " if version else "") + f"torch {torch_version}, {os.cpu_count()} CPUs")
    headers = ["system", "back after kill (s)", "one replica start (s)", "survivors restarted", "wrong results",
               "requests failed/sent", "back per trial (s) (- start)"]
    table = []
    for name, row in rows.items():
        reqs = "n/a" if row["req_sent"] is None else f"{row['req_failed']}/{row['req_sent']}"
        if name == "torchrun":
            reqs = "n/a (serves none)"
        table.append([TITLES.get(name, name), childrun.fmt(row["back_s"]), childrun.fmt(row["start_s"]),
                      f"{row['restarted']}/{row['survivors']}" + ("?" if row["restarted_unknown"] else ""),
                      str(row["wrong"]), reqs,
                      ", ".join(childrun.fmt(b) + (f" ({x:+.2f})" if x is not None else "")
                                for b, x in zip(row["back_all"], row["after_start_all"])) or "-"])
    print_table(headers, table)
    print("(medians of the trials; survivors restarted and failures summed over them; per trial: back, and in "
          "brackets back minus that trial's one replica start; '-': not measured or not back within "
          "--settle-timeout; '?' after survivors: a trial not back, its survivors not counted)")
    verdict = judge(rows)
    for other, title in (("serve", "Serve RESTART_GANG"), ("torchrun", "torchrun")):
        if other in verdict["ratios"]:
            r = verdict["ratios"][other]
            print(f"ours vs {title}: {r:.2f}x the time back after a kill"
                  + (f" ({1 / r:.2f}x sooner)" if 0 < r < 1 else ""))
    for name, row in rows.items():
        if row["failed_by"]:
            print(f"{name}: requests failed by {row['failed_by']} (timeout: no answer within {args.request_timeout:g} s); "
                  f"first: {row['first_failures']}")
        for e in row["errors"]:
            print(f"{name}: ERROR: {e}")
    if verdict["met"] is not None:
        said = "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in verdict["checks"].items())
        print(f"goal (issue 67: ours back <= one replica start + 1 s, 0 survivors restarted, 0 wrong, ahead of "
              f"both): {'MET' if verdict['met'] else 'NOT MET'} ({said})")
    return rows, verdict


# -------------------------------------------------------------- measuring
def failure(exc: BaseException) -> tuple[str, str]:
    """A failed request's kind (a timeout; a replica's error by its own class, ``RayTaskError(X)``: X)
    and what it said (its last line, without terminal colours)."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout", "timeout"
    name = type(exc).__name__
    inner = re.fullmatch(r"\w+\((\w+)\)", name)
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if ln.strip()]
    return (inner.group(1) if inner else name), f"{name}: {lines[-1] if lines else ''}"[:200]


async def trickle(send: Any, stop: asyncio.Event, every: float, timeout: float, want: float) -> dict:
    """A request every ``every`` s until ``stop``, each its own task bounded by ``timeout``."""
    stats: dict[str, Any] = {"sent": 0, "failed": 0, "timeouts": 0, "wrong": 0, "failed_by": {}, "first_errors": []}
    tasks = []

    async def one() -> None:
        try:
            got = await asyncio.wait_for(send(), timeout)
        except Exception as exc:
            kind, said = failure(exc)
            stats["failed"] += 1
            stats["timeouts"] += kind == "timeout"
            stats["failed_by"][kind] = stats["failed_by"].get(kind, 0) + 1
            if len(stats["first_errors"]) < 3 and said not in stats["first_errors"]:
                stats["first_errors"].append(said)
            return
        if got != want:
            stats["wrong"] += 1

    while not stop.is_set():
        tasks.append(asyncio.ensure_future(one()))
        stats["sent"] += 1
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass
    await asyncio.gather(*tasks)
    return stats


async def one_trial(system: Any, folder: str, victim: int, args: argparse.Namespace) -> dict:
    """Wait until steady, kill rank ``victim``, watch the records (and the requests) until back and
    ``--tail`` s more, or ``--settle-timeout``."""
    deadline = time.time() + args.settle_timeout
    while (before := steady(read_records(folder), args.world, time.time())) is None:
        if time.time() > deadline:
            raise RuntimeError(f"{system.name}: not steady at world {args.world} within {args.settle_timeout:g} s")
        await asyncio.sleep(0.1)
    kill = system.killer(before, victim)  # (the lookups before the clock starts)
    t_kill = time.time()
    kill()
    stop = asyncio.Event()
    send = system.sender()
    reqs = (asyncio.ensure_future(trickle(send, stop, args.every, args.request_timeout, expected(args.world)))
            if send is not None else None)
    deadline = t_kill + args.settle_timeout
    got = recovery([], t_kill, before, victim, args.world)
    while time.time() < deadline:
        got = recovery(read_records(folder), t_kill, before, victim, args.world)
        if got["back_s"] is not None:
            break
        await asyncio.sleep(0.05)
    if got["back_s"] is not None:
        await asyncio.sleep(args.tail)
    stop.set()
    got["requests"] = await reqs if reqs is not None else None
    got.update(victim=victim, gen_before=before["gen"], records=len(read_records(folder)))
    log(f"{system.name}: killed rank {victim}: back {childrun.fmt(got['back_s'])} s (by rank {got.get('ranks_back_s')}"
        + (f", told the epoch at {got['told_s']}" if got.get("told_s") else "")
        + f"), start {childrun.fmt(got['start_s'])} s, restarted {got['restarted']}/{got['survivors']}, wrong {got['wrong']}, "
        f"requests {got['requests']}")
    return got


class Ours:
    name = "ours"

    def deploy(self, mod: Any, folder: str, args: argparse.Namespace) -> None:
        from executors.ray_gpu import deployment, run

        d = deployment(mod.OursDP, name=DEP, num_replicas=args.world, collective_group=True,
                       ray_actor_options=dict(ACTOR_OPTIONS), health_check_period_s=args.health_period,
                       health_check_timeout_s=HEALTH_TIMEOUT_S)
        self.handle = run(d.bind(folder, args.weights_mb, args.load_s, args.group_timeout),
                          timeout=args.settle_timeout)

    def killer(self, before: dict, victim: int) -> Any:
        import ray

        from executors.ray_gpu.control.controller import NAMESPACE, actor_name

        actor = ray.get_actor(actor_name(DEP, before["rids"][victim]), namespace=NAMESPACE)
        return lambda: ray.kill(actor, no_restart=True)

    def sender(self) -> Any:
        return lambda: awaitable(self.handle.step_now.remote())

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"

    def deploy(self, mod: Any, folder: str, args: argparse.Namespace) -> None:
        from ray import serve
        from ray.serve.config import GangRuntimeFailurePolicy, GangSchedulingConfig

        serve.start(proxy_location="Disabled")  # (handle calls only)
        d: Any = serve.deployment(
            mod.ServeDP, name=DEP, num_replicas=args.world, ray_actor_options=dict(ACTOR_OPTIONS),
            gang_scheduling_config=GangSchedulingConfig(
                gang_size=args.world, runtime_failure_policy=GangRuntimeFailurePolicy.RESTART_GANG),
            health_check_period_s=args.health_period, health_check_timeout_s=HEALTH_TIMEOUT_S)
        self.handle = serve.run(d.bind(folder, args.weights_mb, args.load_s, args.group_timeout), name=DEP,
                                route_prefix=None)

    def killer(self, before: dict, victim: int) -> Any:
        import ray

        actor = childrun.serve_replica_actor(before["rids"][victim])  # (found before the kill is timed)
        return lambda: ray.kill(actor, no_restart=True)

    def sender(self) -> Any:
        return lambda: awaitable(self.handle.step_now.remote())

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


class Torchrun:
    name = "torchrun"

    def deploy(self, mod: Any, folder: str, args: argparse.Namespace) -> None:
        exe = pathlib.Path(sys.executable).with_name("torchrun")
        launcher = [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]
        cmd = [*launcher, "--nnodes=1:1", f"--nproc-per-node={args.world}", f"--max-restarts={args.trials + 2}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
               str(pathlib.Path(__file__).resolve()), "--torchrun-worker", folder,
               "--weights-mb", str(args.weights_mb), "--load-s", str(args.load_s)]
        self.folder = folder
        self.log_path = os.path.join(folder, "torchrun.log")
        self.log_file = open(self.log_path, "w")
        env = dict(os.environ)
        if not args.torchrun_shared_store:  # (torch's own workaround for pytorch/pytorch#135712)
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def killer(self, before: dict, victim: int) -> Any:
        pid = before["pids"][victim]
        return lambda: os.kill(pid, signal.SIGKILL)

    def sender(self) -> None:
        return None  # (torchrun's workers serve no requests)

    def shutdown(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        open(os.path.join(self.folder, "stop"), "w").close()  # (the workers end their loops, torchrun exits)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            log("torchrun: not ended 20 s after the stop file: SIGTERM to its process group")
            os.killpg(proc.pid, signal.SIGTERM)  # (its own session: torchrun and its workers only)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.log_file.close()
        if proc.returncode not in (0, None):
            with open(self.log_path) as f:
                log(f"torchrun exited {proc.returncode}; its log ends: {f.read()[-1500:]}")


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    import bench_groups as mod  # (by name: the replicas import the same module)
    import torch

    res: dict[str, Any] = {"system": system_name, "torch_version": torch.__version__, "trials": [], "errors": []}
    system: Any = {"ours": Ours, "serve": Serve, "torchrun": Torchrun}[system_name]()
    folder = tempfile.mkdtemp(prefix=f"bench_groups_{system_name}_")
    try:
        if system_name != "torchrun":
            import ray

            res["ray_version"] = ray.__version__
            ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                     object_store_memory=256 * 1024**2, log_to_driver=False)
        try:
            t = time.perf_counter()
            system.deploy(mod, folder, args)
            res["deploy_s"] = time.perf_counter() - t
            log(f"{system_name}: {args.world} members started in {res['deploy_s']:.1f}s")
            for i in range(args.trials):
                victim = args.kill_ranks[i % len(args.kill_ranks)]
                res["trials"].append(childrun.run_async(one_trial(system, folder, victim, args)))
        except Exception as exc:
            res["errors"].append(f"{type(exc).__name__}: {exc}"[:2000])
            log(f"{system_name}: ERROR {exc!r}")
        finally:
            system.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return res


# ------------------------------------------------------------------ main
def spawn(system_name: str, args: argparse.Namespace) -> dict:
    argv = ["--world", str(args.world), "--weights-mb", str(args.weights_mb), "--load-s", str(args.load_s),
            "--trials", str(args.trials), "--kill-ranks", ",".join(map(str, args.kill_ranks)),
            "--every", str(args.every), "--request-timeout", str(args.request_timeout),
            "--settle-timeout", str(args.settle_timeout), "--tail", str(args.tail),
            "--health-period", str(args.health_period), "--group-timeout", str(args.group_timeout),
            "--num-cpus", str(args.num_cpus), *(["--torchrun-shared-store"] if args.torchrun_shared_store else [])]
    limit = args.settle_timeout * (2 * args.trials + 1) + 120
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, limit, log)


def _systems(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if values == ["all"]:
        return list(SYSTEMS)
    if not values or any(v not in SYSTEMS for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--only takes 'all' or some of {', '.join(SYSTEMS)} (comma-separated, "
                                         f"each once), got {text!r}")
    return [s for s in SYSTEMS if s in values]


def _ranks(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of ranks, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"ranks are ints >= 0, got {text!r}")
    return values


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked (a bad one: exit status 2 and a message naming it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, help=f"members of the group; default {DEFAULTS['world']}")
    p.add_argument("--weights-mb", type=int, help=f"MB of weights each member loads; default {DEFAULTS['weights_mb']}")
    p.add_argument("--load-s", type=float,
                   help=f"seconds of the rest of a model load, slept at start; default {DEFAULTS['load_s']}")
    p.add_argument("--trials", type=int, help=f"kills of each system, one after another; default {DEFAULTS['trials']}")
    p.add_argument("--kill-ranks", type=_ranks,
                   help="the rank each trial kills, in turn (comma-separated); default 1,0")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: world {QUICK['world']}, {QUICK['weights_mb']} MB, {QUICK['load_s']} s load, "
                        f"{QUICK['trials']} trial killing rank 1 (an option given explicitly wins)")
    p.add_argument("--only", type=_systems, default=list(SYSTEMS),
                   help="all (default) or some of ours,serve,torchrun, comma-separated")
    p.add_argument("--every", type=float, default=0.05, help="seconds between requests while re-forming; default 0.05")
    p.add_argument("--request-timeout", type=float, default=2.0,
                   help="a request not answered by then counts failed; default 2")
    p.add_argument("--settle-timeout", type=float, default=90.0,
                   help="seconds to be steady, and to be back after a kill, before a trial gives up; default 90")
    p.add_argument("--tail", type=float, default=1.0, help="seconds of requests after back; default 1")
    p.add_argument("--health-period", type=float, default=1.0,
                   help="health_check_period_s of both Ray systems; default 1 (Serve's own default: 10)")
    p.add_argument("--group-timeout", type=float, default=5.0,
                   help="ours' ProcessGroup timeout_s (rendezvous and collectives); default 5")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of each local Ray; default 4")
    p.add_argument("--torchrun-shared-store", action="store_true",
                   help="torchrun as it ships: its workers share the agent's TCPStore across restarts (a restarted "
                        "group may read the last one's addresses: pytorch/pytorch#135712); default: "
                        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, a fresh store each restart")
    p.add_argument("--json", metavar="FILE", help="write all results here")
    p.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--torchrun-worker", metavar="FOLDER", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.world < 2:
        p.error(f"--world must be 2 or more (a group to re-form around a lost member), got {args.world}")
    if args.world * ACTOR_OPTIONS["num_cpus"] > args.num_cpus:
        p.error(f"--num-cpus {args.num_cpus} has no room for --world {args.world} replicas of num_cpus "
                f"{ACTOR_OPTIONS['num_cpus']}")
    bad = [r for r in args.kill_ranks if r >= args.world]
    if bad:
        p.error(f"--kill-ranks {bad} are not ranks of --world {args.world} (0..{args.world - 1})")
    if args.trials < 1 or args.weights_mb < 0 or args.load_s < 0:
        p.error("need --trials >= 1, --weights-mb >= 0, --load-s >= 0")
    if min(args.every, args.request_timeout, args.settle_timeout, args.health_period, args.group_timeout) <= 0 \
            or args.tail < 0:
        p.error("need --every, --request-timeout, --settle-timeout, --health-period, --group-timeout > 0 and "
                "--tail >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.torchrun_worker:
        return torchrun_worker(args)
    childrun.ray_env(ROOT, ROOT / "benchmarks")
    if args.child:
        def on_term(signum: int, frame: Any) -> None:
            raise SystemExit(f"terminated by signal {signum}")

        signal.signal(signal.SIGTERM, on_term)  # (the child's finally shuts its Ray or torchrun down)
        res = run_child(args.child, args)
        with open(args.child_out, "w") as f:
            json.dump(res, f, indent=1, default=repr)
        return 0
    missing = childrun.serve_missing(["serve"]) if "serve" in args.only else None
    if missing:
        print(f"{missing}: `make bench` installs it, or run --only ours,torchrun", file=sys.stderr)
        return 2
    results = {}
    for name in args.only:
        log(f"{name}: starting its child")
        results[name] = spawn(name, args)
    rows, verdict = print_report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith(("child", "torchrun"))},
                       "results": results, "rows": rows, "goal": verdict}, f, indent=1, default=repr)
        log(f"wrote {args.json}")
    return 1 if any(r.get("errors") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
