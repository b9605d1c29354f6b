"""Batches in the simulator's traffic (``traffic.<d>.batch``, issue 39): the core's batcher
closes them, a batch of n is served for ``fixed_s + n x per_item_s``; throughput follows the
batch size, nothing is lost when a replica dies with batches in hand, and bad keys are refused
naming the key. Every run checks the invariants after every step."""

from __future__ import annotations

from pathlib import Path

import pytest

from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation, load_scenario

ROOT = Path(__file__).resolve().parents[2]

BASE = """
seed: 3
duration: 60
cluster: {nodes: 1, gpus_per_node: 2}
latency: {place: 0.1, start: 1, stop: 0.5}
deployments:
  embed: {replicas: 2, max_ongoing_requests: 64}
timeline:
  - deploy: embed
TIMELINE
traffic:
  embed:
    from: 5
    arrivals: {kind: poisson, rate: RATE}
    batch: BATCH
"""


def _run(batch: str, rate: float = 300, timeline: str = "") -> dict:
    text = BASE.replace("BATCH", batch).replace("RATE", str(rate)).replace("TIMELINE", timeline)
    result = Simulation(parse_scenario(text, "<batching>"), check=True).run()
    assert result.passed, [e.detail for e in result.failures]
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


def test_the_example_batches_and_answers_its_load():
    result = Simulation(load_scenario(ROOT / "examples/scenarios/traffic-batching.yaml"), check=True).run()
    assert result.passed
    q = result.metrics["deployments"]["embed"]["requests"]
    assert q["lost"] == 0 and 0 < q["failed"] < 100  # (what the crash at t=60 held)
    assert q["batch_size_mean"] > 4  # batched: one at a time it could not keep up
    assert q["throughput_rps"] == pytest.approx(600, rel=0.05)


def test_an_overloaded_deployment_answers_what_its_batches_can():
    # 4 a batch, 20 ms + 4 x 0.5 ms: 181.8 req/s a replica, 363.6 for two, under 600 offered
    q = _run("{max_batch_size: 4, batch_wait_timeout_s: 0.01, fixed_s: 0.02, per_item_s: 0.0005}", rate=600)
    assert q["batch_size_mean"] == pytest.approx(4, abs=0.01)
    assert q["throughput_rps"] == pytest.approx(2 * 4 / 0.022, rel=0.03)
    assert q["batches_full"] >= 0.99 * q["batches"]


def test_a_light_load_waits_out_the_timeout_in_small_batches():
    q = _run("{max_batch_size: 32, batch_wait_timeout_s: 0.05, fixed_s: 0.001, per_item_s: 0.0}", rate=20)
    assert q["batches_full"] == 0 and 1 <= q["batch_size_mean"] < 3
    assert 0.05 <= q["latency_p50"] <= 0.06  # the timeout, then the batch's 1 ms


def test_a_replica_dying_with_batches_in_hand_loses_nothing():
    q = _run("{max_batch_size: 8, batch_wait_timeout_s: 0.01, fixed_s: 0.05, per_item_s: 0.001}", rate=200,
             timeline="  - at: 30\n    crash: {deployment: embed, rank: 0}\n  - at: 40\n    crash: {deployment: embed, "
                      "rank: 1}")
    assert q["failed"] > 0 or q["retried"] > 0  # (the requests it held: not idempotent, they fail)
    assert q["answered"] > 0.9 * q["submitted"]


@pytest.mark.parametrize("batch, words", [
    ("{max_batch_size: 0, fixed_s: 0.01}", "traffic.embed.batch.max_batch_size"),
    ("{max_batch_size: 4}", "missing required field 'fixed_s'"),
    ("{fixed_s: 0.01, size: 3}", "size"),
    ("{fixed_s: 0.01, cores: 2}", "traffic.embed.batch.cores: needs 'request_s', 'threads' or 'replica_s' beside it"),
    ("{fixed_s: 0.01, request_s: 0.001}", "traffic.embed.batch.request_s: needs 'cores' beside it"),
    ("{fixed_s: 0.01, replica_s: 0.001}", "traffic.embed.batch.replica_s: needs 'cores' beside it"),
    ("{fixed_s: 0.01, cores: 2, threads: 0.001}", "traffic.embed.batch.threads: must be a non-empty list"),
    ("{fixed_s: 0.01, cores: 2, threads: []}", "traffic.embed.batch.threads: must be a non-empty list"),
    ("{fixed_s: 0.01, cores: 2, threads: [0.001, -1]}", "traffic.embed.batch.threads"),
    ("{fixed_s: 0.01, cores: 0, request_s: 0.001}", "traffic.embed.batch.cores: must be at least 1"),
])
def test_bad_batch_keys_are_refused_naming_the_key(batch, words):
    text = BASE.replace("BATCH", batch).replace("RATE", "10").replace("TIMELINE", "")
    with pytest.raises(ScenarioError, match=words.replace(".", r"\.")):
        parse_scenario(text, "<batching>")


def test_the_hosts_cores_cap_what_requests_cpu_allows_and_batches_run_on_them():
    # 2 replicas, batches of up to 16 at 1 ms: alone they would answer ~600 req/s offered; each request's
    # own CPU (2 ms on one of 2 cores) caps the host at 1,000 req/s, then 1 core at 4 ms: 250 req/s
    free = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001}", rate=600)
    assert free["throughput_rps"] == pytest.approx(600, rel=0.05)
    two = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, cores: 2, request_s: 0.002}",
               rate=600)
    assert two["throughput_rps"] == pytest.approx(600, rel=0.05)  # (under the cap: all answered)
    assert two["latency_p50"] > free["latency_p50"] + 0.002  # (each one's CPU first)
    one = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, cores: 1, request_s: 0.004}",
               rate=600)
    assert one["throughput_rps"] < 250 * 1.02  # the core is the limit (batches take it too)
    assert one["throughput_rps"] > 200
    # batches run on the cores too: with one core and heavy batches, the requests' CPU shares it with them
    heavy = _run("{max_batch_size: 4, batch_wait_timeout_s: 0.0, fixed_s: 0.02, cores: 1, request_s: 0.001}",
                 rate=600)
    assert heavy["throughput_rps"] < 4 / (0.02 + 4 * 0.001) * 1.05


def test_a_shared_thread_and_each_replicas_loop_cap_what_the_cores_would_allow():
    # 600 req/s offered to 2 replicas, batches of up to 16 at 1 ms, 4 cores: plenty of CPU, but
    # one shared thread (a proxy's loop) at 4 ms a request answers at most 250 a second
    proxy = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, cores: 4, threads: [0.004]}",
                 rate=600)
    assert 230 < proxy["throughput_rps"] < 250 * 1.02
    # each replica's own loop at 4 ms: 250 a second each, 500 for two (one loop per replica) ...
    loops = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, cores: 4, replica_s: 0.004}",
                 rate=600)
    assert 480 < loops["throughput_rps"] < 500 * 1.02
    # ... but on one core the two loops and the batches share it: under 1 / 4 ms in all
    shared = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, cores: 1, replica_s: 0.004}",
                  rate=600)
    assert 180 < shared["throughput_rps"] < 250
    # the same CPU on threads of its own (``request_s``) is not capped by one thread: 4 cores allow 1,000
    own = _run("{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, cores: 4, request_s: 0.004}",
               rate=600)
    assert own["throughput_rps"] == pytest.approx(600, rel=0.05)


def test_a_crowd_of_threads_slows_each_one_processor_sharing():
    # one request at a time (poisson at 5 a second), 2 ms on a shared thread, no other work: ~2 ms
    # of CPU adds ~2 ms; with 1 core and every request's 20 ms own work beside it, all run slower
    alone = _run("{max_batch_size: 1, batch_wait_timeout_s: 0.0, fixed_s: 0.001, cores: 1, threads: [0.002]}",
                 rate=5)
    crowd = _run("{max_batch_size: 1, batch_wait_timeout_s: 0.0, fixed_s: 0.001, cores: 1, threads: [0.002], "
                 "request_s: 0.02}", rate=40)
    assert alone["latency_p50"] == pytest.approx(0.003, abs=0.0005)  # (2 ms on the thread, 1 ms the batch)
    assert crowd["latency_p50"] > 0.023 + 0.001  # (the 23 ms of CPU, slowed by the others sharing the core)


def test_batch_with_service_or_stream_is_refused():
    text = BASE.replace("BATCH", "{fixed_s: 0.01}\n    service: 0.1").replace("RATE", "10").replace("TIMELINE", "")
    with pytest.raises(ScenarioError, match="service time is its batch's"):
        parse_scenario(text, "<batching>")
    text = BASE.replace("BATCH", "{fixed_s: 0.01}\n    stream: {items: 3, item_interval_s: 0.1}").replace(
        "RATE", "10").replace("TIMELINE", "")
    with pytest.raises(ScenarioError, match="batch and stream together"):
        parse_scenario(text, "<batching>")


@pytest.mark.parametrize("timeout", [0.1, 0.25])  # (ends while its batch forms / while its batch runs)
def test_deadlines_end_requests_waiting_in_a_batch_and_running_in_one(timeout):
    text = BASE.replace("BATCH", "{max_batch_size: 16, batch_wait_timeout_s: 0.2, fixed_s: 0.3, per_item_s: 0.0}\n"
                                 f"    timeout_s: {timeout}").replace("RATE", "40").replace("TIMELINE", "")
    result = Simulation(parse_scenario(text, "<batching>"), check=True).run()
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    assert q["failed"] > 0 and q["answered"] == 0  # (every batch waits 0.2 s, then runs 0.3 s: past 0.25 s)
    assert q["late"] > 0  # the answers of the requests cut off came in late
    # ~20 req/s a replica into a batch open 0.2 s: ~5 each (seen: 5.0), unless those past their deadline left it
    # before it closed (seen: 2.2)
    assert q["batch_size_mean"] < 3 if timeout < 0.2 else q["batch_size_mean"] > 4


@pytest.mark.parametrize("replicas, clients, rps, size", [(1, 16, 1600, 16), (2, 16, 800, 8), (1, 64, 1600, 16)])
def test_a_closed_loop_of_callers_gives_what_the_batches_allow(replicas, clients, rps, size):
    """``arrivals: {kind: closed}``: each caller sends again when its answer comes. 16 callers, one
    replica: a full batch of 16 every 10 ms; on two replicas each gets 8, waits its 10 ms timeout,
    then 10 ms of service."""
    text = (BASE.replace("{kind: poisson, rate: RATE}", f"{{kind: closed, clients: {clients}}}")
            .replace("BATCH", "{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.01}")
            .replace("TIMELINE", "").replace("replicas: 2,", f"replicas: {replicas},"))
    result = Simulation(parse_scenario(text, "<closed>"), check=True).run()
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["failed"]) == (0, 0)
    assert q["throughput_rps"] == pytest.approx(rps, rel=0.01) and q["batch_size_mean"] == pytest.approx(size)


def test_closed_arrivals_need_a_whole_number_of_clients():
    text = BASE.replace("{kind: poisson, rate: RATE}", "{kind: closed, clients: 0}").replace(
        "BATCH", "{fixed_s: 0.01}").replace("TIMELINE", "")
    with pytest.raises(ScenarioError, match=r"traffic\.embed\.arrivals\.clients.*whole number of callers"):
        parse_scenario(text, "<closed>")


def test_closed_callers_refused_at_once_retry_after_a_pause_and_the_run_ends():
    """More callers than the replica and its queue take: the rest are refused ("overloaded") the
    moment they send; each sends again 1 ms later (else the run would spin at one instant)."""
    text = (BASE.replace("{kind: poisson, rate: RATE}", "{kind: closed, clients: 50}")
            .replace("BATCH", "{max_batch_size: 4, batch_wait_timeout_s: 0.01, fixed_s: 0.01}")
            .replace("TIMELINE", "").replace("replicas: 2, max_ongoing_requests: 64",
                                             "replicas: 1, max_ongoing_requests: 4, max_queued_requests: 2")
            .replace("duration: 60", "duration: 7"))
    result = Simulation(parse_scenario(text, "<closed>"), check=True).run()
    q = result.metrics["deployments"]["embed"]["requests"]
    assert q["rejected"]["overloaded"] > 0 and q["lost"] == 0
    assert q["throughput_rps"] == pytest.approx(400, rel=0.05)  # full batches of 4 every 10 ms


def test_nothing_is_left_on_the_cores_after_deadlines_cut_batches_of_a_frozen_replica_and_one_dies():
    text = BASE.replace("BATCH", "{max_batch_size: 4, batch_wait_timeout_s: 0.01, fixed_s: 0.02, cores: 1, "
                                 "request_s: 0.001}\n    timeout_s: 0.04\n    until: 50").replace(
        "RATE", "150").replace("TIMELINE", "  - at: 30\n    hang: {deployment: embed, rank: 0}\n  - at: 31\n"
                                           "    crash: {deployment: embed, rank: 1}")
    sim = Simulation(parse_scenario(text, "<batching>"), check=True)
    result = sim.run()
    assert result.passed
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    assert q["failed"] > 0 and q["answered"] > 0  # (deadlines cut requests in running batches)
    flow = sim.traffic.flows["embed"]
    assert not flow.cores.jobs and flow.cores.timer is None  # nothing left running on the cores


def test_the_loaded_host_example_is_limited_by_its_cores_not_its_batches():
    sc = load_scenario(ROOT / "examples/scenarios/traffic-batching-host.yaml")
    result = Simulation(sc, check=True).run()
    assert result.passed
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    # the batches alone (16 every 9 ms) would allow ~1,700 req/s; the host's two cores give ~470
    assert 420 < q["throughput_rps"] < 520
    assert q["batch_size_mean"] > 15
    alone = _run_text((ROOT / "examples/scenarios/traffic-batching-host.yaml").read_text().replace(
        "      cores: 2\n      request_s: 0.0007\n      threads: [0.0003, 0.0012]\n      replica_s: 0.0011\n", ""))
    assert alone["throughput_rps"] > 3 * q["throughput_rps"]


def _run_text(text: str) -> dict:
    result = Simulation(parse_scenario(text, "<batching>"), check=True).run()
    assert result.passed
    return result.metrics["deployments"]["embed"]["requests"]


@pytest.mark.parametrize("cpu", ["cores: 1, request_s: 0.004", "cores: 4, threads: [0.004]",
                                 "cores: 1, request_s: 0.001, replica_s: 0.002"])
def test_a_request_retried_after_a_crash_mid_cpu_is_answered_by_the_new_replica(cpu):
    # idempotent requests in their own CPU's stages on rank 0 when it crashes are retried on rank 1:
    # the dead replica's stale stages must not take them out of rank 1's (every one answered, none
    # left waiting at the end, nothing left on the cores or a thread)
    text = BASE.replace("BATCH", "{max_batch_size: 16, batch_wait_timeout_s: 0.01, fixed_s: 0.001, " + cpu + "}"
                        "\n    idempotent: true\n    until: 40").replace("RATE", "300").replace(
        "TIMELINE", "  - at: 30\n    crash: {deployment: embed, rank: 0}").replace("duration: 60", "duration: 120")
    sim = Simulation(parse_scenario(text, "<batching>"), check=True)
    result = sim.run()
    assert result.passed
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"], q["failed"]) == (0, 0, 0, 0), q
    flow = sim.traffic.flows["embed"]
    assert flow.live == 0 and not sim.traffic._in_cpu  # every request ended: none stranded mid-CPU
    assert not flow.cores.jobs and all(not t.queue and not t.busy for t in flow.threads)



@pytest.mark.parametrize("cpu", ["threads: [0.00001]", "replica_s: 0.00001"])
def test_a_replica_that_dies_mid_batch_frees_the_cores_at_once(cpu):
    # Two replicas on one core, each always running a batch (fixed_s 50 ms: 100 ms of wall shared).
    # Rank 0 dies at t=30: its batch's process is gone, so its job leaves the cores at that instant,
    # not when the CPU it still needed would have run out (the survivor gets the whole core at once).
    text = BASE.replace("BATCH", "{max_batch_size: 4, batch_wait_timeout_s: 0.01, fixed_s: 0.05, cores: 1, "
                        + cpu + "}\n    until: 40").replace("RATE", "300").replace(
        "TIMELINE", "  - at: 30\n    crash: {deployment: embed, rank: 0}")
    sim = Simulation(parse_scenario(text, "<batching>"), check=True)
    seen: dict[str, object] = {}

    def jobs_of(rid: str) -> set[int]:
        b = sim.traffic._batchers[rid]
        return set(b.jobs) | ({b.thread.job} if b.thread is not None and b.thread.job is not None else set())

    def before() -> None:
        rid = seen["rid"] = sim.backend.holder("embed", 0)
        seen["jobs"] = jobs_of(rid) & set(sim.traffic.flows["embed"].cores.jobs)

    def after() -> None:
        running = set(sim.traffic.flows["embed"].cores.jobs)
        seen["left"] = seen["jobs"] & running  # type: ignore[operator]
        seen["survivor"] = jobs_of(sim.backend.holder("embed", 1)) & running

    sim.schedule(29.999, before)
    sim.schedule(30.001, after)
    result = sim.run()
    assert result.passed
    q = result.metrics["deployments"]["embed"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    assert seen["jobs"], "rank 0 was running no batch just before its crash: the test shows nothing"
    assert seen["left"] == set() and seen["survivor"]  # its batch left the cores; the survivor's runs on


@pytest.mark.parametrize("cpu", ["threads: [0.003]", "replica_s: 0.003", "request_s: 0.003"])
def test_a_graceful_stop_on_a_loaded_host_drains_what_its_replica_holds_up_to_its_timeout(cpu):
    # 2 -> 1 at t=30 with the one core saturated: the stopping replica's requests run slower than the
    # guess of their end (shared cores), so its stop waits for them (none fails) ...
    text = BASE.replace("BATCH", "{max_batch_size: 4, batch_wait_timeout_s: 0.01, fixed_s: 0.02, cores: 1, "
                        + cpu + "}\n    until: 40").replace("RATE", "300").replace(
        "TIMELINE", "  - at: 30\n    scale: {deployment: embed, replicas: 1}")
    q = _run_text(text)
    assert (q["lost"], q["machine_lost"], q["double_ends"], q["failed"]) == (0, 0, 0, 0), q
    # ... until graceful_shutdown_timeout_s: cut to the stop latency (0.5 s), what it still holds fails
    q = _run_text(text.replace("max_ongoing_requests: 64}", "max_ongoing_requests: 64, "
                                                            "graceful_shutdown_timeout_s: 0.5}"))
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    assert q["failed"] > 0 and {f["reason"] for f in q["failures"]} == {"replica_died"}, q
