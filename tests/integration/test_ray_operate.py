"""Operating rankcore as Ray Serve is operated (issue 37), on one local Ray: ``rankcore deploy``
of docs/operate.md's config file, the same file again (nothing restarted or reconfigured), a
user_config-only change (reconfigured in place: same replicas, same ranks), a ``version`` change
(a rolling update, ranks kept), an application left out (deleted), ``rankcore status --json``
and its exit status, ``rankcore delete``, and the REST paths (``GET``/``PUT``/``DELETE
/api/serve/applications/``, a 400 naming the key path, the answer validated by Ray Serve's
own ``ServeInstanceDetails``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from executors.cli import main
from executors.ray_gpu.api import apps, rest
from executors.ray_gpu.api.deployments import ask, get_controller, get_deployment_handle
from executors.ray_gpu.ingress.http import ingress_address

from ..unit.test_config_file import doc_config
from .conftest import _local_ray


@pytest.fixture(scope="module")
def ray_ops():
    """One local Ray for the module (no GPU); at its end the REST server stops and the
    controller forgets everything."""
    gen = _local_ray(0, 128, "reset")
    next(gen)
    try:
        yield
    finally:
        rest.stop_rest()
        next(gen, None)


pytestmark = pytest.mark.usefixtures("ray_ops")


def config(**changes: Any) -> dict:
    """docs/operate.md's file on any free port, with ``changes`` to its Echo entry (``drop_hello``:
    without the second application; ``extra``: one more application)."""
    data = yaml.safe_load(doc_config())
    data["http_options"]["port"] = 0
    echo = data["applications"][0]["deployments"][0]
    drop, extra = changes.pop("drop_hello", False), changes.pop("extra", None)
    echo.update(changes)
    if drop:
        data["applications"] = data["applications"][:1]
    if extra:
        data["applications"].append(extra)
    return data


def deploy(tmp_path: Path, data: dict, *args: str) -> Any:
    f = tmp_path / "deploy.yaml"
    f.write_text(yaml.safe_dump(data))
    return CliRunner().invoke(main, ["deploy", str(f), "--rest-port", "0", "--timeout", "60", *args])


def replicas(name: str = "Echo") -> dict:
    """Replica id -> what it says (rank, config, reconfigure count, pid), with its ranks and revision."""
    handle = get_deployment_handle(name)
    st = handle.status()
    said = handle.broadcast()
    return {rid: {**said[rid], "ranks": r["rank"], "revision": r["revision"]} for rid, r in st["replicas"].items()}


def configured(greeting: str) -> dict | None:
    """``replicas()`` once every replica holds that greeting, else None."""
    now = replicas()
    return now if all(v["config"] == {"greeting": greeting} for v in now.values()) else None


def until(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def get(path: str) -> httpx.Response:
    host, port = ingress_address()  # type: ignore[misc]
    return httpx.get(f"http://{host}:{port}{path}", timeout=10)


def test_deploy_applies_the_docs_file_and_serves_both_applications(tmp_path: Path) -> None:
    out = deploy(tmp_path, config())
    assert out.exit_code == 0, out.output
    assert set(apps.applied_apps()) == {"echo", "hello"}
    reps = replicas()
    assert sorted(r["ranks"] for r in reps.values()) == [(0, 0, 0), (1, 0, 1)]
    assert {json.dumps(r["config"]) for r in reps.values()} == {'{"greeting": "hello"}'}
    assert get("/echo").json()["config"] == {"greeting": "hello"}
    assert get("/hello").json() == "bonjour"  # the builder got the file's args


def test_the_same_file_again_restarts_and_reconfigures_nothing(tmp_path: Path) -> None:
    before = replicas()
    deployed = apps.applied_apps()
    out = deploy(tmp_path, config())
    assert out.exit_code == 0, out.output
    assert replicas() == before  # same ids, pids, ranks, revision, reconfigure counts
    assert apps.applied_apps() == deployed  # (last_deployed_time_s kept too)


def test_a_user_config_change_reconfigures_in_place(tmp_path: Path) -> None:
    before = replicas()
    out = deploy(tmp_path, config(user_config={"greeting": "salut"}))
    assert out.exit_code == 0, out.output
    after = configured("salut")  # at once: "applied" means every replica has it (issue 64, defect 6)
    assert after, replicas()
    assert all(get("/echo").json()["config"] == {"greeting": "salut"} for _ in range(6))
    assert set(after) == set(before)
    for rid, r in after.items():
        assert (r["pid"], r["ranks"], r["revision"]) == (before[rid]["pid"], before[rid]["ranks"],
                                                         before[rid]["revision"])
        assert r["reconfigures"] == before[rid]["reconfigures"] + 1


def test_a_version_change_rolls_every_replica_onto_its_ranks(tmp_path: Path) -> None:
    before = replicas()
    out = deploy(tmp_path, config(user_config={"greeting": "salut"}, version="2"))
    assert out.exit_code == 0, out.output

    def rolled() -> dict | None:
        st = get_deployment_handle("Echo").status()
        done = st["healthy"] and all("v=2;" in r["revision"] for r in st["replicas"].values())
        return replicas() if done else None

    after = until(rolled)
    assert after, get_deployment_handle("Echo").status()
    assert not set(after) & set(before)  # every replica replaced
    assert sorted(r["ranks"] for r in after.values()) == sorted(r["ranks"] for r in before.values())
    assert {r["pid"] for r in after.values()}.isdisjoint({r["pid"] for r in before.values()})


def test_an_application_left_out_of_the_file_is_deleted(tmp_path: Path) -> None:
    out = deploy(tmp_path, config(user_config={"greeting": "salut"}, version="2", drop_hello=True))
    assert out.exit_code == 0, out.output
    assert set(apps.applied_apps()) == {"echo"}
    assert until(lambda: ask(get_controller(), "wait_deleted", "Hello", 1.0), 60)
    assert get("/hello").status_code == 404
    assert get("/echo").status_code == 200


def status_json() -> tuple[int, dict]:
    out = CliRunner().invoke(main, ["status", "--json"])
    return out.exit_code, json.loads(out.stdout)


def test_status_json_shows_ranks_and_its_exit_status_says_unhealthy(tmp_path: Path) -> None:
    code, view = status_json()
    assert code == 0 and view["healthy"]
    dep = view["applications"]["echo"]["deployments"]["Echo"]
    assert dep["status"] == "HEALTHY" and dep["target"] == 2
    assert [(r["rank"], r["node_rank"], r["local_rank"], r["state"], r["tier"]) for r in dep["replicas"]] == \
        [(0, 0, 0, "RUNNING", "hot"), (1, 0, 1, "RUNNING", "hot")]
    assert all("v=2;" in r["version"] for r in dep["replicas"])
    assert list(view["proxies"].values())[0]["status"] == "HEALTHY"
    broken = {"name": "broken", "route_prefix": None, "import_path": "tests.integration.operate_models:broken"}
    out = deploy(tmp_path, config(user_config={"greeting": "salut"}, version="2", drop_hello=True, extra=broken),
                 "--no-wait")
    assert out.exit_code == 0, out.output
    until(lambda: status_json()[0] != 0, 60)
    code, view = status_json()
    assert code == 1 and not view["healthy"]
    assert view["applications"]["broken"]["status"] == "UNHEALTHY"
    assert view["applications"]["echo"]["status"] == "RUNNING"
    assert any(f["event"] == "ReplicaCrashed" and f["cause"] == "error" for f in view["recent_faults"])
    out = CliRunner().invoke(main, ["status"])  # the tables, and what is wrong on stderr
    assert out.exit_code == 1 and "Echo#" in out.stdout and "unhealthy: application broken: UNHEALTHY" in out.stderr
    assert CliRunner().invoke(main, ["delete", "broken"]).exit_code == 0
    assert set(apps.applied_apps()) == {"echo"}
    assert until(lambda: status_json()[0] == 0, 30)
    out = CliRunner().invoke(main, ["delete", "broken"])
    assert out.exit_code == 2 and "unknown application 'broken'" in out.output


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (ray.serve's pydantic models, imported here)
def test_the_rest_paths(tmp_path: Path) -> None:
    try:  # Ray Serve's own model of the answer (its extras, pydantic among them, come with `.[bench]`)
        from ray.serve.schema import ServeInstanceDetails
    except ImportError:
        ServeInstanceDetails = None

    url = rest.rest_address()
    assert url is not None
    path = f"{url}/api/serve/applications/"
    got = httpx.get(path, timeout=30)
    assert got.status_code == 200
    body = got.json()
    if ServeInstanceDetails is not None:
        ServeInstanceDetails(**body)  # Ray Serve's own model of this answer accepts it
    # (and whether it is there or not, the fields Serve's models require, at every level)
    assert {"applications", "proxies"} <= set(body)
    for app in body["applications"].values():
        assert {"deployments", "docs_path", "external_scaler_enabled", "last_deployed_time_s", "message", "name",
                "route_prefix", "source", "status"} <= set(app), sorted(app)
        for dep in app["deployments"].values():
            assert {"deployment_config", "message", "name", "replicas", "required_resources", "status",
                    "status_trigger", "target_num_replicas"} <= set(dep), sorted(dep)
            for rep in dep["replicas"]:
                assert {"replica_id", "start_time_s", "state"} <= set(rep), sorted(rep)
    echo = body["applications"]["echo"]
    assert echo["status"] == "RUNNING" and echo["route_prefix"] == "/echo"
    assert echo["deployed_app_config"]["deployments"][0]["user_config"] == {"greeting": "salut"}
    assert sorted((r["rank"], r["node_rank"], r["local_rank"]) for r in echo["deployments"]["Echo"]["replicas"]) == \
        [(0, 0, 0), (1, 0, 1)]
    bad = config(num_replicas="two")
    got = httpx.put(path, json=bad, timeout=30)
    assert got.status_code == 400
    assert got.text == "request body: applications[0].deployments[0].num_replicas: expected an int or \"auto\", " \
                       "got str 'two'"
    got = httpx.put(path, json=config(extra={"name": "x", "route_prefix": "/x", "import_path": "no_such_mod:app"}),
                    timeout=30)
    assert got.status_code == 400 and "applications[2].import_path" in got.text
    assert set(apps.applied_apps()) == {"echo"}  # refused: nothing applied
    before = replicas()
    got = httpx.put(path, json=config(user_config={"greeting": "hej"}, version="2"), timeout=60)
    assert got.status_code == 200, got.text
    assert set(apps.applied_apps()) == {"echo", "hello"}
    after = until(lambda: configured("hej"))
    assert after and set(after) == set(before)  # in place, through REST too
    assert not ask(get_controller(), "state_errors")  # (no event the core refused, all along)
    got = httpx.delete(path, timeout=60)
    assert got.status_code == 200
    body = httpx.get(path, timeout=30).json()
    assert body["applications"] == {} and apps.applied_apps() == {}
    assert ask(get_controller(), "ranks", "Echo") == {}


def test_shutdown_deletes_every_application_and_stops_the_rest_server(tmp_path: Path) -> None:
    """``rankcore shutdown --yes``: every application deleted (no replica left), the REST server
    stopped (no actor, its port no longer answers); the controller stays usable (the next
    ``deploy`` works again); without ``--yes`` it asks, and a no changes nothing."""
    result = deploy(tmp_path, config())
    assert result.exit_code == 0, result.output
    url = rest.rest_address()
    assert url is not None and set(apps.applied_apps()) == {"echo", "hello"}
    no = CliRunner().invoke(main, ["shutdown"], input="n\n")
    assert no.exit_code == 1 and "Aborted" in no.output and set(apps.applied_apps()) == {"echo", "hello"}
    result = CliRunner().invoke(main, ["shutdown", "--yes"])
    assert result.exit_code == 0 and result.output.strip() == "shut down", result.output
    assert apps.applied_apps() == {} and ask(get_controller(), "ranks", "Echo") == {}
    assert rest.rest_address() is None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/api/serve/applications/", timeout=5)
    again = deploy(tmp_path, config(drop_hello=True))
    assert again.exit_code == 0, again.output
    assert set(apps.applied_apps()) == {"echo"}
