"""Each replica's pid, actor id, node, log file in ``rankcore status --json``, ``serve.status()`` and
``GET /api/serve/applications/`` (issue 64), and what they show after a replica dies: its deployment
``UNHEALTHY`` saying which replica died, as Ray Serve shows it, until its successor serves.

On one local Ray: an application of two replicas (``Talker``) whose constructor waits while a gate
file exists, so the test holds a successor's start and reads the status while the dead replica is
gone. The rule itself (which deaths count, when the mark goes) is the core's:
tests/unit/test_unhealthy_status.py."""

from __future__ import annotations

import functools
import json
import os
import signal
import time
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from executors.cli import PID_COLUMN_FROM, main
from executors.ray_gpu import serve
from executors.ray_gpu.api import apps, rest
from executors.ray_gpu.api import config as cf
from executors.ray_gpu.api.deployments import get_deployment_handle
from executors.ray_gpu.control.observe import DEAD_KEPT, Watcher
from rankcore.base.state import UNTIL_RECOVERED

APP, DEP = "details", "Talker"
#: what Ray Serve's ``ReplicaDetails`` says of a replica, each checked below
IDENTITY = ("pid", "actor_id", "actor_name", "worker_id", "node_id", "node_ip", "start_time_s", "log_file_path")


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.05}, health_check_period_s=0.3,
                  graceful_shutdown_timeout_s=0.0)
class Talker:
    def __init__(self, gate: str):
        deadline = time.monotonic() + 120
        while os.path.exists(gate) and time.monotonic() < deadline:  # (the test holds this start)
            time.sleep(0.05)
        self.sick = False
        print(f"talker {serve.get_replica_context().replica_id} started", flush=True)

    def whoami(self) -> dict:
        import ray

        rid = serve.get_replica_context().replica_id
        print(f"talker {rid} says hello", flush=True)
        ctx = ray.get_runtime_context()
        return {"replica_id": rid, "pid": os.getpid(), "actor_id": ctx.get_actor_id(), "node_id": ctx.get_node_id(),
                "worker_id": ctx.get_worker_id()}

    def sicken(self) -> str:
        self.sick = True
        return serve.get_replica_context().replica_id

    def check_health(self) -> None:
        if self.sick:
            raise RuntimeError("told to be sick")


def build(args: dict) -> Any:
    return Talker.bind(args["gate"])


# ------------------------------------------------------------------ on Ray
@pytest.fixture(scope="module")
def talker(local_ray, tmp_path_factory):
    """The application applied from a config (as ``rankcore deploy`` does) and the REST server;
    yields (the gate file, when it was applied); both gone at the end."""
    gate = tmp_path_factory.mktemp("talker") / "gate"
    data = {"http_options": {"host": "127.0.0.1", "port": 0},  # (no route: no proxy starts; Serve's model wants them)
            "applications": [{"name": APP, "route_prefix": None, "args": {"gate": str(gate)},
                              "import_path": "tests.integration.test_ray_replica_details:build"}]}
    applied_at = time.time()
    apps.apply_config(cf.parse(data), wait_s=90)
    try:
        yield gate, applied_at
    finally:
        gate.unlink(missing_ok=True)
        rest.stop_rest()
        apps.delete_app(APP)


def status_json() -> tuple[int, dict]:
    """``rankcore status --json``: its exit status and its JSON (in this process, Ray's own line about
    a worker it saw die can come first on stdout: the driver's, not the command's)."""
    out = CliRunner().invoke(main, ["status", "--json"])
    text = out.stdout
    start = 0 if text.startswith("{") else text.index("\n{\n") + 1
    return out.exit_code, json.JSONDecoder().raw_decode(text, start)[0]


def talker_of(view: dict) -> dict:
    return view["applications"][APP]["deployments"][DEP]


@functools.cache
def serve_model() -> Any:
    """Ray Serve's own model of the REST answer, or None: ``ray.serve`` does not import here (its
    extras come with ``.[bench]``). Tried once: a second import of a package that failed half-way
    can succeed, and the tests would check different things by their order."""
    try:
        from ray.serve.schema import ServeInstanceDetails
    except ImportError:
        return None
    return ServeInstanceDetails


def rest_details() -> dict:
    got = httpx.get(f"{rest.start_rest(port=0)}/api/serve/applications/", timeout=30)
    assert got.status_code == 200, got.text
    body = got.json()
    ServeInstanceDetails = serve_model()
    if ServeInstanceDetails is not None:
        ServeInstanceDetails(**body)  # (its ReplicaDetails takes every field we give, STOPPED ones too)
    return body["applications"][APP]["deployments"][DEP]


def logs_dir() -> Path:
    """The node's Ray logs directory: the ``logs`` folder of the Ray session's."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    assert logs.name == "logs" and logs.parent.name.startswith("session_"), logs
    return logs


def until(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def identified() -> dict | None:
    """The status once every replica has said who it is."""
    view = status_json()[1]
    return view if all(r["pid"] for r in talker_of(view)["replicas"]) else None


def healthy_again() -> dict | None:
    code, view = status_json()
    dep = talker_of(view)
    running = [r for r in dep["replicas"] if r["state"] == "RUNNING" and r["pid"] is not None]
    return view if code == 0 and dep["status"] == "HEALTHY" and len(running) == 2 else None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (ray.serve's pydantic models, imported here)
def test_every_status_gives_each_replicas_pid_actor_id_node_and_log_file(talker) -> None:
    import ray

    _, applied_at = talker
    said = get_deployment_handle(DEP).whoami.broadcast()  # rid -> what the replica says of itself
    assert len(said) == 2
    assert until(identified, 30)  # (each says who it is when its actor starts: at once)
    code, view = status_json()
    assert code == 0 and view["healthy"]
    rows = {r["replica_id"]: r for r in talker_of(view)["replicas"]}
    assert set(rows) == set(said)
    for rid, r in rows.items():
        assert set(IDENTITY) <= set(r), sorted(r)
        me = said[rid]
        assert r["pid"] == me["pid"] and r["pid"] != os.getpid()
        os.kill(r["pid"], 0)  # a live process of this machine
        assert r["actor_id"] == me["actor_id"] == ray.get_actor(r["actor_name"], namespace="rankcore")._actor_id.hex()
        assert r["actor_name"] == f"ModelActor:{DEP}:{rid}"
        assert r["worker_id"] == me["worker_id"] and r["node_id"] == me["node_id"]
        assert r["node_ip"] == ray.util.get_node_ip_address()
        assert applied_at <= r["start_time_s"] <= time.time()
        # below the node's Ray logs directory, as Serve's (it starts with "/"): the file its stdout goes to
        assert r["log_file_path"].startswith(f"/worker-{r['worker_id']}-") and r["log_file_path"].endswith(f"-{r['pid']}.out")
        log = Path(str(logs_dir()) + r["log_file_path"])
        assert until(lambda log=log, rid=rid: f"talker {rid} says hello" in log.read_text(), 10), log
        assert f"talker {rid} started" in log.read_text()
        assert log.with_suffix(".err").is_file()  # (its stderr: the same name ending .err)
    assert talker_of(view)["recent_dead_replicas"] == []
    # serve.status() is the same view; the REST answer is Serve's ReplicaDetails with the same facts
    assert {r["replica_id"]: {k: r[k] for k in IDENTITY} for r in talker_of(serve.status())["replicas"]} == \
        {rid: {k: r[k] for k in IDENTITY} for rid, r in rows.items()}
    dep = rest_details()
    assert dep["status"] == "HEALTHY" and dep["status_trigger"] == "UNSPECIFIED" and dep["recent_dead_replicas"] == []
    assert {r["replica_id"]: {k: r[k] for k in IDENTITY} for r in dep["replicas"]} == \
        {rid: {k: r[k] for k in IDENTITY} for rid, r in rows.items()}
    # and the tables show each pid on a terminal wide enough (narrower, the replica ids would wrap)
    out = CliRunner().invoke(main, ["status"], env={"COLUMNS": str(PID_COLUMN_FROM)})
    assert out.exit_code == 0 and all(str(r["pid"]) in out.stdout for r in rows.values()), out.stdout
    assert all(rid in out.stdout for rid in rows)
    out = CliRunner().invoke(main, ["status"], env={"COLUMNS": str(PID_COLUMN_FROM - 1)})
    assert out.exit_code == 0 and not any(str(r["pid"]) in out.stdout for r in rows.values()), out.stdout


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_replica_killed_makes_its_deployment_unhealthy_naming_it_until_its_successor_serves(talker) -> None:
    gate, _ = talker
    view = until(identified, 30)
    victim = talker_of(view)["replicas"][0]
    gate.touch()  # (its successor's constructor waits: the status is read while it is gone)
    os.kill(victim["pid"], signal.SIGKILL)

    def seen() -> tuple[int, dict] | None:
        code, v = status_json()
        return (code, v) if talker_of(v)["status"] == "UNHEALTHY" else None

    got = until(seen, 30)
    assert got, status_json()
    code, view = got
    dep = talker_of(view)
    assert code == 1 and not view["healthy"]  # (Serve's serve status: UNHEALTHY; our exit status 1)
    (crash,) = [f for f in view["recent_faults"] if f["event"] == "ReplicaCrashed"]
    assert crash["replica_id"] == victim["replica_id"] and crash["reason"] == "actor died (exited)"
    assert dep["message"] == f"replica {victim['replica_id']} died: {crash['reason']}. {UNTIL_RECOVERED}"
    assert view["applications"][APP]["status"] == "UNHEALTHY"
    assert view["applications"][APP]["message"] == f"{DEP}: {dep['message']}"
    assert victim["replica_id"] not in {r["replica_id"] for r in dep["replicas"]}  # gone: its successor starts
    (successor,) = [r for r in dep["replicas"] if r["state"] == "STARTING"]
    assert successor["rank"] == victim["rank"]
    assert [r["state"] for r in dep["replicas"]].count("RUNNING") == 1
    assert sorted(r["state"] for r in dep["replicas"]) == ["RUNNING", "STARTING"]
    (dead,) = dep["recent_dead_replicas"]  # the dead one is listed apart, as Serve's, its log file kept
    assert dead["state"] == "STOPPED" and {k: dead[k] for k in IDENTITY} == {k: victim[k] for k in IDENTITY}
    assert f"talker {victim['replica_id']} started" in Path(str(logs_dir()) + dead["log_file_path"]).read_text()
    with pytest.raises(ProcessLookupError):
        os.kill(victim["pid"], 0)
    out = CliRunner().invoke(main, ["status"], env={"COLUMNS": "250"})
    assert out.exit_code == 1 and f"unhealthy: application {APP}: UNHEALTHY {DEP}: replica " \
        f"{victim['replica_id']} died" in out.stderr
    rested = rest_details()
    assert (rested["status"], rested["status_trigger"], rested["message"]) == \
        ("UNHEALTHY", "HEALTH_CHECK_FAILED", dep["message"])
    assert [r["replica_id"] for r in rested["recent_dead_replicas"]] == [victim["replica_id"]]
    time.sleep(1.0)
    assert talker_of(status_json()[1])["status"] == "UNHEALTHY"  # (while its successor is held)
    gate.unlink()
    view = until(healthy_again, 60)
    assert view, status_json()
    dep = talker_of(view)
    assert dep["message"] == "" and view["applications"][APP]["status"] == "RUNNING"
    assert [r["replica_id"] for r in dep["recent_dead_replicas"]] == [victim["replica_id"]]
    assert rest_details()["status_trigger"] == "UNSPECIFIED"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_replica_failing_its_health_checks_says_so_until_replaced(talker) -> None:
    gate, _ = talker
    gate.touch()
    sick = get_deployment_handle(DEP).sicken.remote().result(timeout=60)

    def seen() -> dict | None:
        dep = talker_of(status_json()[1])
        return dep if dep["status"] == "UNHEALTHY" else None

    dep = until(seen, 30)  # (3 failed checks 0.3 s apart: health_check_failure_threshold)
    assert dep, status_json()
    assert dep["message"].startswith(f"replica {sick} failed its health check: check_health raised: ")
    assert "told to be sick" in dep["message"] and dep["message"].endswith(f". {UNTIL_RECOVERED}")
    gate.unlink()
    view = until(healthy_again, 60)
    assert view, status_json()
    assert sick not in {r["replica_id"] for r in talker_of(view)["replicas"]}
    assert sick in {r["replica_id"] for r in talker_of(view)["recent_dead_replicas"]}


# ------------------------------------------------------- the gone replicas kept, no Ray
def test_each_deployment_keeps_its_last_ten_gone_replicas() -> None:
    state = types.SimpleNamespace(deployments={"app": None})
    w = Watcher(types.SimpleNamespace(driver=types.SimpleNamespace(observers=[], state=state)))  # type: ignore[arg-type]
    for i in range(12):
        w.identities[f"app#{i}"] = ("app", {"actor_name": f"ModelActor:app:app#{i}", "pid": 100 + i})
        w._let_go(f"app#{i}")
    assert DEAD_KEPT == 10 and not w.identities
    assert [(r["replica_id"], r["state"], r["pid"]) for r in w.details()["gone"]["app"]] == \
        [(f"app#{i}", "STOPPED", 100 + i) for i in range(2, 12)]
    state.deployments = {}  # (deleted: its gone replicas with it)
    assert w.details()["gone"] == {}
