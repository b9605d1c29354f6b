"""Ray Serve's CLI tests (``serve deploy``, ``status``, ``config``, ``shutdown``, ``build``, ``run``)
and the config files they deploy, run against rankcore's CLI (issue 64, "Prove it on Serve's own
tests").

Sources, ray-project/ray (the versions the search index holds; where it names no commit, its id):

* python/ray/serve/tests/test_cli.py, the newest version found (index id 2730335897: ``ray._common``,
  httpx; 19,536 characters), every case; and the cases an earlier version held that Serve has since
  moved out of it (index id 1721034501, 29,279 characters: ``test_deploy_basic`` ...
  ``test_deploy_from_import_path``), since that is where the deploy, config and status cases are;
* python/ray/serve/tests/test_cli_2.py (index id 1764402329, 32,459 characters): the cases not
  already above or in test_cli_3.py (``test_status_multi_app``, ``test_deployment_contains_utils``;
  the others are the same cases under the same names, ported once);
* python/ray/serve/tests/test_cli_3.py @ 0ac72ea174dd, every case (``TestRun``: ``serve run``);
* python/ray/serve/tests/test_config_files/: the files those cases deploy, re-expressed as the
  config each case writes (Serve's DAGs become small applications of this module, named by
  import path: ``tests.serve_parity.test_serve_cli:...``).

Each case is Serve's, under its own name and parameters, written anew from what it checks (not
copied). ``serve X`` is ``rankcore X`` run in this process (click's runner; Ray is already joined);
``serve deploy`` takes an import path or a config file, ``rankcore deploy`` a config file, so a case
that deploys an import path writes the config that names it. Ports: every config names the one free
port this module's proxies use (Serve's tests use 8000 and 8005). Deployment names are global in
rankcore (docs/operate.md), so each case's applications are built with names of their own (the
builders' ``tag``). Ray starts once for the module; what a case applied is deleted after it.

``serve run`` (test_cli_3.py, and ``TestRayReinitialization``) is ``rankcore serve MODULE:APP``
(docs/ray.md, HTTP ingress): its cases that give ``serve run`` a config file, builder arguments or
flags ``rankcore serve`` does not have skip with that documented difference; the others need a
subprocess with a Ray of its own each (~15 s a case here) and say what covers them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner, Result

from executors.cli import main
from executors.ray_gpu import serve
from executors.ray_gpu.api import apps, rest
from executors.ray_gpu.api import config as cf
from tests.integration.conftest import _local_ray, witness_dir  # noqa: F401 (fixtures of this module too)

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = ("python/ray/serve/tests/test_cli.py (index ids 2730335897 and 1721034501), test_cli_2.py (index id "
          "1764402329), test_cli_3.py @ 0ac72ea174dd3b50d82723aef916ef69d060b1b0")
MODULE = __name__
CPU = {"num_cpus": 0.01}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _free_port()


@pytest.fixture(scope="module", autouse=True)
def ray_cli():
    """One local Ray for the module; at its end the REST server stops and the controller forgets all."""
    gen = _local_ray(0, 128, "reset")
    next(gen)
    try:
        yield
    finally:
        rest.stop_rest()
        next(gen, None)


@pytest.fixture(autouse=True)
def _fresh_applications():
    yield
    for name in apps.applied_apps():
        apps.delete_app(name, wait=False)


# ------------------------------------------------------------------ the applications the configs name
@serve.deployment(ray_actor_options=CPU)
class Echo:
    def __init__(self, message: str):
        self._message = message

    def __call__(self, *args):
        return self._message


def echo(args: dict):
    """Serve's ``arg_builders.build_echo_app``: an Echo of ``message`` (default ``DEFAULT``)."""
    return Echo.options(name=f"Echo{args.get('tag', '')}").bind(args.get("message", "DEFAULT"))


@serve.deployment(ray_actor_options=CPU)
class F:
    def __call__(self, *args):
        return "wonderful world"


@serve.deployment(ray_actor_options=CPU)
class BasicDriver:
    def __init__(self, handle):
        self._h = handle

    async def __call__(self, *args):
        return await self._h.remote()


def graph(args: dict):
    """Serve's ``test_dag/basic_dag.DagNode``: a driver and the deployment it calls, two deployments."""
    tag = args.get("tag", "")
    return BasicDriver.options(name=f"BasicDriver{tag}").bind(F.options(name=f"f{tag}").bind())


@serve.deployment(ray_actor_options=CPU)
class Failing:
    def __init__(self, sleep_s: float):
        time.sleep(sleep_s)
        _ = 1 / 0

    def __call__(self, *args):
        return "never"


def failing(args: dict):
    """Serve's ``fail.py`` (``sleep_s`` 0) and ``fail_2.py`` (a constructor that takes a while, then raises)."""
    return Failing.options(name=f"A{args.get('tag', '')}").bind(float(args.get("sleep_s", 0)))


@serve.deployment(ray_actor_options=CPU, graceful_shutdown_timeout_s=1)
class DeleteBlocked:
    async def __del__(self):
        import asyncio

        while True:
            await asyncio.sleep(0.1)


delete_blocked = DeleteBlocked.bind()


@serve.deployment(ray_actor_options=CPU)
class D:
    def __call__(self, *args):
        return "d"


def placement(args: dict):
    return D.options(name=f"D{args.get('tag', '')}").bind()



# ------------------------------------------------------------------ helpers
def cli(*args: str, **kwargs: Any) -> Result:
    return CliRunner().invoke(main, list(args), **kwargs)


def write(path: Path, applications: list[dict], **top: Any) -> Path:
    path.write_text(yaml.safe_dump({"http_options": {"host": "127.0.0.1", "port": PORT}, **top,
                                    "applications": applications}, sort_keys=False))
    return path


def deploy(tmp_path: Path, applications: list[dict], *flags: str, name: str = "config.yaml", **top: Any) -> Result:
    return cli("deploy", str(write(tmp_path / name, applications, **top)), "--rest-port", "0", "--timeout", "60",
               *flags)


def app(name: str, attr: str, route_prefix: str | None = "/", **more: Any) -> dict:
    entry: dict = {"name": name, "route_prefix": route_prefix, "import_path": f"{MODULE}:{attr}"}
    return {**entry, **more}


def status() -> dict:
    return json.loads(cli("status", "--json").stdout)


def configs() -> list:
    return list(yaml.safe_load_all(cli("config").stdout))


def get(path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{PORT}{path}", timeout=10, **kwargs)


def until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except (KeyError, httpx.HTTPError):
            got = None
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


# ================================================================== deploy refused before any cluster
def test_deploy_duplicate_apps(tmp_path):
    out = deploy(tmp_path, [app("app1", "graph", "/a"), app("app1", "graph", "/b")])
    assert out.exit_code == 2 and "applications[1].name: application 'app1' is also applications[0]" in out.output


def test_deploy_duplicate_routes(tmp_path):
    out = deploy(tmp_path, [app("app1", "graph", "/alice"), app("app2", "graph", "/alice")])
    assert out.exit_code == 2 and "applications[1].route_prefix: '/alice' is also applications[0]'s" in out.output


def test_deploy_bad_v2_config(tmp_path):
    entries = [app("app1", "graph", "/app1", deployments=[{"name": "Multiplier", "user_config": {"factor": 1}}]),
               app("app2", "graph", "/app1", deployments=[{"name": "Multiplier", "user_config": {"factor": 2}}])]
    out = deploy(tmp_path, entries)
    # (Serve: "ValidationError ... ServeDeploySchema ... Please ensure each application's route_prefix is unique")
    assert out.exit_code == 2 and "applications[1].route_prefix: '/app1' is also" in out.output
    assert out.output.count("\n") == 1 and "Traceback" not in out.output


def test_start_shutdown_without_ray_running():
    # (in a process of its own: this one has joined this module's Ray)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-m", "executors.cli", "shutdown", "-y", "--address",
                          f"127.0.0.1:{_free_port()}", "--connect-timeout", "5"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    # (Serve: "Unable to shutdown Serve on the cluster", exit 0; rankcore: exit 2 naming the address)
    assert out.returncode == 2 and "no Ray cluster at 127.0.0.1:" in out.stderr, out.stderr


def test_build_multi_app(tmp_path):
    # (rankcore names each application by its ingress deployment, at /<name>; Serve's app1, app2)
    out = cli("build", f"{MODULE}:graph", "-o", str(tmp_path / "one.yaml"))
    assert out.exit_code == 0 and "wrote" in out.output, out.output
    assert [a.import_path for a in cf.load(tmp_path / "one.yaml").applications] == [f"{MODULE}:graph"]
    out = cli("build", f"{MODULE}:graph", f"{MODULE}:echo", "-o", str(tmp_path / "two.yaml"),
              "--grpc-servicer-functions", "tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server")
    assert out.exit_code == 0, out.output
    two = cf.load(tmp_path / "two.yaml")
    assert [(a.name, a.route_prefix, a.import_path) for a in two.applications] == [
        ("BasicDriver", "/BasicDriver", f"{MODULE}:graph"), ("Echo", "/Echo", f"{MODULE}:echo")]
    assert two.grpc_options.grpc_servicer_functions == (
        "tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server",)
    out = cli("build", f"{MODULE}:echo", f"{MODULE}:echo")  # (two applications of one name)
    assert out.exit_code == 2 and "both application 'Echo'" in out.output, out.output


def test_deploy_from_import_path(tmp_path):
    # (the proxies on this module's port first: an import path's deploy keeps the running proxies as they are)
    assert deploy(tmp_path, [app("default", "echo")]).exit_code == 0 and get("/").text == "DEFAULT"
    out = cli("deploy", f"{MODULE}:echo", "message=redeployed!")
    assert out.exit_code == 0, out.output
    assert until(lambda: get("/").text == "redeployed!")  # (application default, at /, the builder's args)
    assert "default" in status()["applications"]
    out = cli("deploy", f"{MODULE}:echo", "message")
    assert out.exit_code == 2 and "arguments are KEY=VALUE, got 'message'" in out.output


# ================================================================== deploy, status, config, shutdown
def test_start_shutdown(tmp_path):
    out = deploy(tmp_path, [app("default", "echo")])
    assert out.exit_code == 0 and "applied 1 application(s)" in out.output, out.output
    assert get("/").text == "DEFAULT"
    out = cli("shutdown", "-y")
    assert out.exit_code == 0 and out.output.strip() == "shut down"
    assert status()["applications"] == {}
    out = cli("shutdown", "-y")  # when nothing runs (Serve: "No Serve instance found running")
    assert out.exit_code == 0


def test_start_shutdown_without_serve_running():
    out = cli("shutdown", "-y")
    assert out.exit_code == 0 and out.output.strip() == "shut down"


def test_shutdown(tmp_path):
    assert cli("shutdown", "-y").exit_code == 0  # when nothing runs
    for iteration in (1, 2):  # (idempotent)
        out = deploy(tmp_path, [app("default", "graph", args={"tag": "_shutdown"})])
        assert out.exit_code == 0, out.output
        assert len(status()["applications"]["default"]["deployments"]) == 2
        assert configs() and status()["applications"]
        assert cli("shutdown", "-y").exit_code == 0
        assert cli("config").output == "No configuration was found.\n", iteration
        assert status()["applications"] == {}


def test_deploy_with_http_options(tmp_path):
    entry = app("default", "graph", "/", args={"tag": "_http"})
    out = deploy(tmp_path, [entry])
    assert out.exit_code == 0, out.output
    assert until(lambda: get("/").text == "wonderful world")
    (info,) = configs()
    assert info == entry


def test_deploy_basic():
    pytest.skip("needs a Serve cluster harness: covered by tests/integration/test_ray_operate.py::"
                "test_deploy_applies_the_docs_file_and_serves_both_applications and ::"
                "test_the_same_file_again_restarts_and_reconfigures_nothing (a config deployed and served over "
                "HTTP, then deployed again: nothing restarted); Serve's arithmetic.yaml fetches its code from GitHub")


def test_deploy_multi_app_basic():
    pytest.skip("needs a Serve cluster harness: covered by tests/integration/test_ray_operate.py::"
                "test_deploy_applies_the_docs_file_and_serves_both_applications, ::"
                "test_a_version_change_rolls_every_replica_onto_its_ranks and ::"
                "test_an_application_left_out_of_the_file_is_deleted (two applications, one changed, one left out)")


def test_deploy_multi_app_builder_with_args(tmp_path):
    entries = [app("untyped_default", "echo", "/untyped_default"),
               app("untyped_hello", "echo", "/untyped_hello", args={"message": "hello"})]
    out = deploy(tmp_path, entries)
    assert out.exit_code == 2 and "deployment 'Echo' is in applications 'untyped_default' and 'untyped_hello'" \
        in out.output
    pytest.skip("differs on purpose: deployment names are global in rankcore, two applications holding a deployment "
                "of one name are refused (docs/operate.md, 'What applying does'); builders with args: "
                "tests/integration/test_ray_operate.py (hello_builder), and typed (pydantic) args: "
                "test_serve_api.py::TestAppBuilder::test_args_typed")


def test_config_multi_app(tmp_path):
    assert cli("config").exit_code == 0  # works with nothing deployed
    entries = [app("app1", "graph", "/app1", args={"tag": "_cfg1"}),
               app("app2", "echo", "/app2", args={"tag": "_cfg2"}, deployments=[{"name": "Echo_cfg2",
                                                                                  "num_replicas": 1}])]
    assert deploy(tmp_path, entries, "--no-wait").exit_code == 0
    assert configs() == entries  # at once


def test_cli_without_config_deploy():
    @serve.deployment(name="fn_cli", ray_actor_options=CPU)
    class Fn:
        def __call__(self, *args):
            return "hi"

    serve.run(Fn.bind(), route_prefix=None)
    try:
        assert cli("config").output == "No configuration was found.\n"
        fetched = status()["applications"]["default"]
        assert fetched["status"] == "RUNNING" and fetched["deployments"]["fn_cli"]["status"] == "HEALTHY"
    finally:
        serve.delete("default")


def test_config_with_deleting_app(tmp_path):
    both = [app("app1", "graph", "/app1", args={"tag": "_del1"}), app("app2", "delete_blocked", "/app2")]

    def check(expected: list, running: int) -> bool:
        return configs() == expected and sum(a["status"] == "RUNNING" for a in status()["applications"].values()) \
            == running

    assert deploy(tmp_path, both).exit_code == 0
    assert until(lambda: check(both, 2))
    assert deploy(tmp_path, both[:1]).exit_code == 0  # app2 deleting: its __del__ never returns
    assert until(lambda: check(both[:1], 1))


def test_status_basic(tmp_path):
    assert cli("status").exit_code == 0  # works with nothing deployed
    started = time.time()
    assert deploy(tmp_path, [app("default", "graph", args={"tag": "_status"})]).exit_code == 0
    default = status()["applications"]["default"]
    assert set(default["deployments"]) == {"BasicDriver_status", "f_status"}
    for d in default["deployments"].values():
        assert d["status"] in ("HEALTHY", "UPDATING") and "message" in d
        assert [r["state"] for r in d["replicas"]] in (["RUNNING"], ["STARTING"])
    assert default["status"] in ("DEPLOYING", "RUNNING") and started - 1 < default["last_deployed_time_s"] < time.time()
    assert all(p["status"] == "HEALTHY" for p in status()["proxies"].values())
    pytest.skip("differs on purpose: no status_trigger (docs/operate.md, The REST API: 'status_trigger (always "
                "UNSPECIFIED)'); replicas are listed one by one with their ranks, not counted by state")


def test_status_multi_app(tmp_path):
    assert cli("status").exit_code == 0
    entries = [app("app1", "graph", "/app1", args={"tag": "_multi1"}), app("app2", "echo", "/app2",
                                                                          args={"tag": "_multi2"})]
    assert deploy(tmp_path, entries).exit_code == 0
    statuses = status()["applications"]
    assert set(statuses["app1"]["deployments"]) == {"BasicDriver_multi1", "f_multi1"}
    assert set(statuses["app2"]["deployments"]) == {"Echo_multi2"}
    for a in statuses.values():
        assert all(d["status"] in ("HEALTHY", "UPDATING") and "message" in d for d in a["deployments"].values())
        assert a["status"] in ("DEPLOYING", "RUNNING") and time.time() > a["last_deployed_time_s"]


def failed_status(deployment: str, timeout: float = 30.0) -> dict | None:
    def failed() -> dict | None:
        a = status()["applications"]["default"]
        return a if "ZeroDivisionError" in a["deployments"][deployment]["message"] else None

    return until(failed, timeout)


def failing_once(tag: str) -> dict:
    """Serve's deployment_fail.yaml: a constructor that raises (here UNHEALTHY after its first failure:
    ``max_constructor_retry_count: 1``, so the case does not wait for three)."""
    return app("default", "failing", args={"tag": tag},
               deployments=[{"name": f"A{tag}", "max_constructor_retry_count": 1}])


DEPLOY_FAILED = ("differs on purpose: a deployment whose replicas keep failing to start is UNHEALTHY and retried, "
                 "not DEPLOY_FAILED (docs/ray.md, the option table: max_constructor_retry_count), and there is no "
                 "status_trigger (docs/operate.md, The REST API)")


def test_status_error_msg_format(tmp_path):
    assert deploy(tmp_path, [failing_once("_fail1")], "--no-wait").exit_code == 0
    assert failed_status("A_fail1")
    cli_app = status()["applications"]["default"]
    api_app = serve.status()["applications"]["default"]
    assert cli_app["message"] and cli_app["message"] == api_app["message"]  # the CLI's message is the API's
    assert until(lambda: status()["applications"]["default"]["deployments"]["A_fail1"]["status"] == "UNHEALTHY")
    assert status()["applications"]["default"]["status"] == "UNHEALTHY"
    pytest.skip(DEPLOY_FAILED)


def test_status_invalid_runtime_env(tmp_path):
    entry = app("default", "echo", args={"tag": "_env"}, runtime_env={"working_dir": "s3://does_not_exist.zip"})
    assert deploy(tmp_path, [entry], "--no-wait").exit_code == 0

    def failed() -> dict | None:
        a = status()["applications"]["default"]
        return a if "RuntimeEnvSetupError" in a["message"] else None

    assert until(failed)
    assert "Failed to set up runtime environment" in status()["applications"]["default"]["message"]


def test_status_syntax_error(tmp_path, monkeypatch):
    (tmp_path / "syntax_error.py").write_text("from executors.ray_gpu import serve\n\nx = (1 + 2\n")
    monkeypatch.chdir(tmp_path)
    out = deploy(tmp_path, [{"name": "default", "import_path": "syntax_error:app"}])
    assert out.exit_code == 2 and "cannot import 'syntax_error': SyntaxError" in out.output
    assert "syntax_error.py, line 3" in out.output
    pytest.skip("differs on purpose: every import is checked before anything is applied, a bad one refused in one "
                "line naming it (docs/operate.md, 'What applying does', 'Every error is one line'); Serve applies, "
                "then reports DEPLOY_FAILED with the traceback")


def test_status_constructor_error(tmp_path):
    assert deploy(tmp_path, [failing_once("_fail2")], "--no-wait").exit_code == 0
    a = failed_status("A_fail2")
    assert a, status()["applications"]
    assert "ZeroDivisionError" in a["deployments"]["A_fail2"]["message"]
    pytest.skip(DEPLOY_FAILED)


def test_status_constructor_retry_error(tmp_path):
    # (Serve's fail_2.py sleeps 5 s in __init__, then raises; 0.5 s here)
    entry = app("default", "failing", args={"tag": "_retry", "sleep_s": 0.5})
    assert deploy(tmp_path, [entry], "--no-wait").exit_code == 0

    def failed_once() -> bool:
        return any(f["event"] == "ReplicaCrashed" and f["replica_id"].startswith("A_retry#")
                   for f in status()["recent_faults"])

    assert until(failed_once)  # (its first start failed: it retries)
    a = status()["applications"]["default"]
    assert a["status"] == "DEPLOYING" and a["deployments"]["A_retry"]["status"] == "UPDATING"
    assert "ZeroDivisionError" in a["deployments"]["A_retry"]["message"]
    pytest.skip("differs on purpose: no status_trigger (docs/operate.md, The REST API: 'status_trigger (always "
                "UNSPECIFIED)'); the rest (DEPLOYING, UPDATING, the error while it retries) as Serve's")


def test_status_package_unavailable_in_controller():
    pytest.skip("not ported: installs PyMySQL and sqlalchemy from PyPI into a replica's runtime_env (pip), and this "
                "suite reaches no network; a constructor's error in rankcore status is checked by "
                "test_status_constructor_error")


def test_max_replicas_per_node(tmp_path):
    entries = [app("valid", "placement", "/valid", args={"tag": "_valid"}),
               app("invalid", "placement", "/invalid", args={"tag": "_invalid"},
                   deployments=[{"name": "D_invalid", "max_replicas_per_node": 2}])]
    out = deploy(tmp_path, entries)
    assert out.exit_code == 2 and "applications[1].deployments[0].max_replicas_per_node: not supported" in out.output
    pytest.skip("differs on purpose: max_replicas_per_node is refused, naming why (docs/operate.md, Keys: refused), "
                "and the whole file with it: nothing is applied (docs/operate.md, 'What applying does')")


def test_replica_placement_group_options(tmp_path):
    valid = app("valid", "placement", "/valid", args={"tag": "_valid"},
                deployments=[{"name": "D_valid", "placement_group_bundles": [{"CPU": 1}],
                              "placement_group_strategy": "STRICT_PACK"}])
    invalid = app("invalid_bundles", "placement", "/invalid_bundles", args={"tag": "_invalid"},
                  deployments=[{"name": "D_invalid", "placement_group_bundles": [{"CPU": 0.001}]}])
    out = deploy(tmp_path, [valid, invalid])
    assert out.exit_code == 2 and "applications[1].deployments[0].placement_group_bundles" in out.output
    assert "which has 0.001 CPU" in out.output  # (Serve's: 0.1 CPU for a replica of 1; ours asks 0.01)
    pytest.skip("differs on purpose: an option the code refuses is refused when the file is applied, nothing applied "
                "(docs/operate.md, 'What applying does' and The REST API: 'Ray Serve answers 200 and reports "
                "DEPLOY_FAILED later'); Serve runs the valid application and fails the other")


def test_deploy_with_access_to_current_directory(tmp_path, monkeypatch):
    (tmp_path / "use_current_working_directory.py").write_text(
        "from executors.ray_gpu import serve\n\n\n"
        "@serve.deployment(name='CurrentDirectory', ray_actor_options={'num_cpus': 0.01})\n"
        "class Hello:\n    def __call__(self, *args):\n        return 'hello'\n\n\napp = Hello.bind()\n")
    monkeypatch.chdir(tmp_path)
    out = deploy(tmp_path, [{"name": "default", "import_path": "use_current_working_directory:app"}],
                 name="use_current_working_directory.yaml")
    assert out.exit_code == 0, out.output
    assert until(lambda: status()["applications"]["default"]["status"] == "RUNNING", 5)


def test_deployment_contains_utils(tmp_path, monkeypatch):
    (tmp_path / "cli_utils_module.py").write_text("def hello():\n    return 'hello_from_utils'\n")
    (tmp_path / "uses_utils.py").write_text(
        "import cli_utils_module\nfrom executors.ray_gpu import serve\n\n\n"
        "@serve.deployment(name='UsesUtils', ray_actor_options={'num_cpus': 0.01})\n"
        "class UsesUtils:\n    def __call__(self, *args):\n        return cli_utils_module.hello()\n\n\n"
        "app = UsesUtils.bind()\n")
    monkeypatch.chdir(tmp_path)
    out = deploy(tmp_path, [{"name": "default", "route_prefix": "/", "import_path": "uses_utils:app"}])
    assert out.exit_code == 0, out.output
    assert until(lambda: get("/").text == "hello_from_utils")


# ================================================================== Serve's own controller, gRPC, serve run
@pytest.mark.parametrize("use_command", [True, False])
def test_idempotence_after_controller_death(use_command):
    pytest.skip("needs a Serve cluster harness: covered by tests/integration/test_ray_operate.py::"
                "test_shutdown_deletes_every_application_and_stops_the_rest_server (deploy, rankcore shutdown, "
                "nothing left, deploy again); serve.shutdown() is the same call (api.apps.delete_all)")


GRPC = ("not ported: Serve's gRPC test services (its generated UserDefinedService and FruitService stubs); "
        "rankcore's gRPC front is checked by tests/integration/test_ray_grpc.py (ListApplications, Healthz, unary "
        "and streaming calls) but not model multiplexing or composition over gRPC")


def test_serving_request_through_grpc_proxy():
    pytest.skip(GRPC)


def test_grpc_proxy_model_composition():
    pytest.skip(GRPC)


def test_control_c_shutdown_serve_components():
    pytest.skip("differs on purpose: rankcore serve on an existing cluster (--address) leaves the deployment and the "
                "ingress serving after Ctrl-C; without it its local Ray goes with it (docs/ray.md, 'rankcore serve "
                "MODULE:APP'; tests/integration/test_ray_http.py::test_rankcore_serve_command)")


RUN_CONFIG = ("differs on purpose: rankcore serve takes MODULE:APP, an application or a deployment bound with no "
              "arguments (docs/ray.md, 'rankcore serve MODULE:APP'); a config file is applied by rankcore deploy "
              "(docs/operate.md)")
RUN_SUBPROCESS = ("needs a Serve cluster harness (a rankcore serve subprocess with a Ray of its own, ~15 s): covered "
                  "by tests/integration/test_ray_http.py::test_rankcore_serve_command (rankcore serve MODULE:APP, "
                  "answered over HTTP, Ctrl-C exits 0)")


class TestRayReinitialization:
    REASON = ("not ported: rankcore serve imports MODULE before it joins or starts Ray, and a module that called "
              "ray.init itself is not handled apart; each case needs a subprocess with a Ray of its own (~15 s)")

    def test_run_without_address(self):
        pytest.skip(self.REASON)

    def test_run_with_address_same_address(self):
        pytest.skip(self.REASON)

    def test_run_with_address_different_address(self):
        pytest.skip(self.REASON)

    def test_run_with_auto_address(self):
        pytest.skip(self.REASON)


class TestRun:
    @pytest.mark.parametrize("proxy_location,expected", [(None, "EveryNode"), ("EveryNode", "EveryNode"),
                                                        ("HeadOnly", "HeadOnly"), ("Disabled", "Disabled")])
    def test_proxy_location(self, proxy_location, expected):
        pytest.skip(RUN_CONFIG + "; proxy_location from a config: tests/integration/test_ray_operate.py (HeadOnly)")

    @pytest.mark.parametrize("number_of_kill_signals", (1, 2))
    def test_run_application(self, number_of_kill_signals):
        pytest.skip(RUN_CONFIG + " (its first half); its second half's parrot reads a starlette Request")

    def test_run_multi_app(self):
        pytest.skip(RUN_CONFIG)

    def test_run_deployment_node(self):
        pytest.skip(RUN_SUBPROCESS)

    @pytest.mark.parametrize("import_path", ["build_echo_app", "build_echo_app_typed"])
    def test_run_builder_with_args(self, import_path):
        pytest.skip(RUN_CONFIG + ": no builder arguments")

    def test_run_runtime_env(self):
        pytest.skip("differs: rankcore serve has no --runtime-env-json nor --working-dir (docs/ray.md, its flags); "
                    "the case also fetches its code from GitHub")

    @pytest.mark.parametrize("config_file", ["basic_graph.yaml", "basic_multi.yaml"])
    def test_run_config_port1(self, config_file):
        pytest.skip(RUN_CONFIG)

    @pytest.mark.parametrize("config_file", ["basic_graph_http.yaml", "basic_multi_http.yaml"])
    def test_run_config_port2(self, config_file):
        pytest.skip(RUN_CONFIG)

    def test_run_teardown(self):
        pytest.skip("not ported: a rankcore serve subprocess whose constructor always fails (rankcore serve waits for "
                    "a healthy deployment up to 120 s before it says so)")

    def test_run_route_prefix_and_name_default(self):
        pytest.skip("differs: rankcore serve routes /<deployment name> by default (its --route-prefix help), and an "
                    "application of rankcore serve has no name (docs/ray.md, 'rankcore serve MODULE:APP')")

    def test_run_route_prefix_and_name_override(self):
        pytest.skip("differs: rankcore serve has --route-prefix but no --name (docs/ray.md, its flags); "
                    + RUN_SUBPROCESS)

    def test_run_config_request_timeout(self):
        pytest.skip(RUN_CONFIG + "; http_options.request_timeout_s (408) is checked by tests/integration/"
                    "test_ray_http.py::test_timeout_408")

    def test_run_reload_basic(self):
        pytest.skip("differs: rankcore serve has no --reload (docs/ray.md, its flags); a changed module is deployed "
                    "again with rankcore deploy (docs/rollouts.md)")
