"""Ray Serve's Python API tests (``serve.run``, ``serve.delete``, ``serve.status``,
``serve.get_app_handle``, ``serve.get_deployment_handle``, ``@serve.deployment`` options, application
builders), run against ``from executors.ray_gpu import serve`` on one local Ray (issue 64, "Prove it
on Serve's own tests").

Source: ray-project/ray, python/ray/serve/tests/test_api.py @ 00f2529afe64 (the version the search
index holds; 33,473 characters). Each case here is that file's, under its own name and parameters,
re-expressed from what it checks (written anew, not copied). The HTTP cases (``test_e2e``, the six
``test_starlette_response_*``, ``test_deploy_function_no_params*``, ``test_deploy_class_no_params``,
``test_scaling_replicas``, ``test_starlette_request``, ``test_deploy_application_basic``) send their
requests with httpx to the proxy (``ingress_address()``) where Serve's go to 127.0.0.1:8000: ``__call__``
gets a starlette ``Request`` and its answer is made by Serve's rules (executors/ray_gpu/replica/asgi.py).

Adapted, as said at each case: Serve's function deployments (``@serve.deployment def f``) are classes
with ``__call__`` here (written before ``@serve.deployment`` took functions: tests/unit/test_asgi_ingress.py
and tests/integration/test_ray_serve_port.py check those; a function with no parameter is a
``__call__(self)``, given no Request over HTTP as in Serve); deployment names are global in rankcore, so a case's
deployments are named apart from other cases' (``.options(name=...)`` where Serve reuses one);
requests follows redirects, httpx when told (``follow_redirects=True``); ``serve.status()`` is
``rankcore status --json``'s dict (docs/ray.md, "Porting a Serve app"), read by key; Serve's ``RayServeException`` is a ``rankcore.RankcoreError`` naming the same thing;
Serve's private ``serve._run(..., _blocking=False)`` is what ``rankcore deploy --no-wait`` does
(``api.apps.apply_config`` of a config naming a module-level application here) and Serve's
private ``call_user_app_builder_with_args_if_necessary`` is ``api.apps.import_app`` (a config's
``import_path`` and ``args``). Ray starts once for the module (~6 s); every case deletes what it ran.

Tally (2026-11-28): 46 cases, Serve's whole file: 41 pass, 4 skipped (documented differences, a pip
install), 1 xfail (rankcore defects or gaps, strict, the reason at each case); ~3 min on 2 shared cores.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import pytest
import ray
import starlette.responses
from fastapi import FastAPI
from ray import cloudpickle

import rankcore as rc
from executors.ray_gpu import serve
from executors.ray_gpu.api import apps
from executors.ray_gpu.api import config as cf
from executors.ray_gpu.api.deployments import ask, get_controller
from tests.integration.conftest import _local_ray, witness_dir  # noqa: F401 (fixtures of this module too)

ORIGIN = "python/ray/serve/tests/test_api.py @ 00f2529afe64d7685ed9657c77e10febd991e557"
MODULE = __name__  # (import paths of this module's applications: tests.serve_parity.test_serve_api)
CPU = {"num_cpus": 0.01}


@pytest.fixture(scope="module", autouse=True)
def ray_serve():
    """One local Ray, the proxies on a free port; at the end the controller forgets everything."""
    gen = _local_ray(0, 128, "reset")
    next(gen)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0})
        yield
    finally:
        next(gen, None)


@pytest.fixture(autouse=True)
def _fresh_applications():
    """What a case ran is deleted after it (Serve's ``serve_instance`` fixture's clean-up): the
    applications ``serve.run`` named in this process, then those applied from a config."""
    yield
    for name in list(serve._APPS):
        try:
            serve.delete(name, _blocking=False)
        except rc.RankcoreError:
            pass
    for name in apps.applied_apps():
        apps.delete_app(name, wait=False)


def base() -> str:
    from executors.ray_gpu.ingress.http import ingress_address

    host, port = ingress_address()  # type: ignore[misc]
    return f"http://{host}:{port}"


def until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def apply(*applications: dict, wait_s: float | None = None) -> None:
    """``rankcore deploy`` of a config holding these applications (``--no-wait``: returns at once)."""
    from executors.ray_gpu.ingress.http import ingress_address

    port = ingress_address()[1]  # type: ignore[index]
    apps.apply_config(cf.parse({"http_options": {"host": "127.0.0.1", "port": port},
                                "applications": list(applications)}, "config"), wait_s=wait_s)


def deployed(name: str) -> Any:
    """Deployment ``name`` as the controller holds it (its config)."""
    return cloudpickle.loads(ask(get_controller(), "state")).deployments[name]


# ------------------------------------------------------------------ applications named by import path
@serve.deployment(name="FailingA", ray_actor_options=CPU, max_constructor_retry_count=1)
class FailingA:
    def __init__(self):
        _ = 1 / 0

    def __call__(self, *args):
        return "never"


@serve.deployment(name="FailingA", ray_actor_options=CPU)
class FixedA:
    def __call__(self, *args):
        return "fixed"


failing_app, fixed_app = FailingA.bind(), FixedA.bind()

SIGNAL = "serve-parity-signal"


@ray.remote(num_cpus=0)
class Signal:
    """Serve's ``SignalActor`` and counter, in one: ``send`` is counted, ``wait`` returns once sent."""

    def __init__(self):
        self.sent = 0

    def send(self):
        self.sent += 1

    def count(self):
        return self.sent


@serve.deployment(name="HangingStart", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.01)
class HangingStart:
    async def __init__(self):
        import asyncio

        self.signal = ray.get_actor(SIGNAL, namespace="rankcore-serve-parity")
        await self.signal.send.remote()
        await asyncio.sleep(10000)

    async def __del__(self):
        await self.signal.send.remote()


hanging_app = HangingStart.bind()


# ------------------------------------------------------------------ Serve's module-level deployments
@serve.deployment(name="sync_d", ray_actor_options=CPU)
class SyncD:  # (Serve's function deployment ``def sync_d()``: no parameter)
    def __call__(self):
        return "sync!"


@serve.deployment(name="async_d", ray_actor_options=CPU)
class AsyncD:  # (Serve's ``async def async_d()``)
    async def __call__(self):
        return "async!"


@serve.deployment(name="Counter", ray_actor_options=CPU)
class Counter:
    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1
        return {"count": self.count}


@serve.deployment(name="AsyncCounter", ray_actor_options=CPU)
class AsyncCounter:
    async def __init__(self):
        import asyncio

        await asyncio.sleep(0.01)
        self.count = 0

    async def __call__(self):
        import asyncio

        self.count += 1
        await asyncio.sleep(0.01)
        return {"count": self.count}


# ================================================================== cases
def test_e2e():
    @serve.deployment(name="api", ray_actor_options=CPU)
    class Function:  # (Serve's ``def function(starlette_request)``)
        def __call__(self, starlette_request):
            return {"method": starlette_request.method}

    serve.run(Function.bind())
    assert httpx.get(f"{base()}/api", timeout=30).json()["method"] == "GET"
    assert httpx.post(f"{base()}/api", timeout=30).json()["method"] == "POST"


def test_starlette_response_basic():
    @serve.deployment(name="basic", ray_actor_options=CPU)
    class Basic:
        def __call__(self):
            return starlette.responses.Response("Hello, world!", media_type="text/plain")

    serve.run(Basic.bind())
    assert httpx.get(f"{base()}/", timeout=30).text == "Hello, world!"


def test_starlette_response_html():
    @serve.deployment(name="html", ray_actor_options=CPU)
    class Html:
        def __call__(self):
            return starlette.responses.HTMLResponse("<html><body><h1>Hello, world!</h1></body></html>")

    serve.run(Html.bind())
    assert httpx.get(f"{base()}/", timeout=30).text == "<html><body><h1>Hello, world!</h1></body></html>"


def test_starlette_response_plain_text():
    @serve.deployment(name="plain_text", ray_actor_options=CPU)
    class PlainText:
        def __call__(self):
            return starlette.responses.PlainTextResponse("Hello, world!")

    serve.run(PlainText.bind())
    assert httpx.get(f"{base()}/", timeout=30).text == "Hello, world!"


def test_starlette_response_json():
    @serve.deployment(name="json", ray_actor_options=CPU)
    class Json:
        def __call__(self):
            return starlette.responses.JSONResponse({"hello": "world"})

    serve.run(Json.bind())
    assert httpx.get(f"{base()}/json", timeout=30).json()["hello"] == "world"


def test_starlette_response_redirect():
    home = f"{base()}/"  # (Serve's http://127.0.0.1:8000/: the proxy's address here)

    @serve.deployment(name="basic_redirect", ray_actor_options=CPU)
    class Basic:
        def __call__(self):
            return starlette.responses.Response("Hello, world!", media_type="text/plain")

    @serve.deployment(name="redirect", ray_actor_options=CPU)
    class Redirect:
        def __call__(self):
            return starlette.responses.RedirectResponse(url=home)

    serve.run(Basic.bind(), name="app1", route_prefix="/")
    serve.run(Redirect.bind(), name="app2", route_prefix="/redirect")
    # (requests follows a redirect by default; httpx when told)
    assert httpx.get(f"{base()}/redirect", timeout=30, follow_redirects=True).text == "Hello, world!"


def test_starlette_response_streaming():
    @serve.deployment(name="streaming", ray_actor_options=CPU)
    class Streaming:
        def __call__(self):
            import asyncio

            async def slow_numbers():
                for number in range(1, 4):
                    yield str(number)
                    await asyncio.sleep(0.01)

            return starlette.responses.StreamingResponse(slow_numbers(), media_type="text/plain", status_code=418)

    serve.run(Streaming.bind())
    resp = httpx.get(f"{base()}/", timeout=30)
    assert resp.text == "123"
    assert resp.status_code == 418


# (Serve's sync_d / async_d are function deployments; here the classes SyncD / AsyncD, whose
# ``__call__(self)`` takes no parameter: Serve calls such a one with no Request over HTTP)
@pytest.mark.parametrize("use_async", [False, True])
def test_deploy_function_no_params(use_async):
    if use_async:
        expected_output, deployment_cls = "async!", AsyncD
    else:
        expected_output, deployment_cls = "sync!", SyncD
    handle = serve.run(deployment_cls.bind())
    assert httpx.get(f"{base()}/{deployment_cls.name}", timeout=30).text == expected_output
    assert handle.remote().result(timeout=30) == expected_output


@pytest.mark.parametrize("use_async", [False, True])
def test_deploy_function_no_params_call_with_param(use_async):
    if use_async:
        expected_output, deployment_cls = "async!", AsyncD
    else:
        expected_output, deployment_cls = "sync!", SyncD
    deployment_cls = deployment_cls.options(name=f"{deployment_cls.name}_param")  # (names are global here)
    handle = serve.run(deployment_cls.bind())
    assert httpx.get(f"{base()}/{deployment_cls.name}", timeout=30).text == expected_output
    # (Serve's function says "() takes 0 positional arguments but 1 was given"; a method counts its self)
    with pytest.raises(TypeError, match=r"\(\) takes 1 positional argument but 2 were given"):
        handle.remote(1).result(timeout=30)
    with pytest.raises(TypeError, match=r"\(\) got an unexpected keyword argument"):
        handle.remote(key=1).result(timeout=30)


@pytest.mark.parametrize("use_async", [False, True])
def test_deploy_class_no_params(use_async):
    deployment_cls = AsyncCounter if use_async else Counter
    handle = serve.run(deployment_cls.bind())
    assert httpx.get(f"{base()}/{deployment_cls.name}", timeout=30).json() == {"count": 1}
    assert httpx.get(f"{base()}/{deployment_cls.name}", timeout=30).json() == {"count": 2}
    assert handle.remote().result(timeout=30) == {"count": 3}


def test_user_config():
    @serve.deployment(name="counter", num_replicas=2, user_config={"count": 123, "b": 2}, ray_actor_options=CPU)
    class Counter:
        def __init__(self):
            self.count = 10

        def __call__(self, *args):
            return self.count, os.getpid()

        def reconfigure(self, config):
            self.count = config["count"]

    def seen(handle: Any, value: int, replicas: int) -> bool:
        pids = set()
        for _ in range(100):
            count, pid = handle.remote().result(timeout=30)
            if count != value:
                return False
            pids.add(pid)
        return len(pids) == replicas

    handle = serve.run(Counter.bind(), route_prefix=None)
    assert until(lambda: seen(handle, 123, 2))
    Counter = Counter.options(num_replicas=3)
    handle = serve.run(Counter.bind(), route_prefix=None)
    assert until(lambda: seen(handle, 123, 3))
    Counter = Counter.options(user_config={"count": 456})
    handle = serve.run(Counter.bind(), route_prefix=None)
    assert until(lambda: seen(handle, 456, 3))
    # Serve's case names the deployment as @serve.deployment("counter", ...): a first argument that is not
    # callable, which Serve's decorator ignores (the deployment keeps its class's name)
    named = serve.deployment("counter", num_replicas=2)(type("Counter", (), {}))
    assert (named.name, named.num_replicas) == ("Counter", 2)


def test_user_config_empty():
    @serve.deployment(name="EmptyConfig", user_config={}, ray_actor_options=CPU)
    class Counter:
        def __init__(self):
            self.count = 0

        def __call__(self, *args):
            return self.count

        def reconfigure(self, config):
            self.count += 1

    assert serve.run(Counter.bind(), name="empty", route_prefix=None).remote().result(timeout=30) == 1


def test_scaling_replicas():
    @serve.deployment(name="counter_scaling", num_replicas=2, ray_actor_options=CPU)
    class Counter:
        def __init__(self):
            self.count = 0

        def __call__(self, _):
            self.count += 1
            return self.count

    serve.run(Counter.bind())
    counter_result = [httpx.get(f"{base()}/counter", timeout=30).json() for _ in range(10)]
    assert max(counter_result) < 10  # (shared by two replicas: neither counted all ten)
    serve.run(Counter.options(num_replicas=1).bind())
    counter_result = [httpx.get(f"{base()}/counter", timeout=30).json() for _ in range(10)]
    assert max(counter_result) - min(counter_result) > 6  # (most by the one replica left)


def test_starlette_request():
    @serve.deployment(name="api_echo", ray_actor_options=CPU)
    class EchoBody:  # (Serve's ``async def echo_body(starlette_request)``, named "api" as test_e2e's)
        async def __call__(self, starlette_request):
            return await starlette_request.body()

    serve.run(EchoBody.bind())
    uvicorn_high_water_mark = 65536  # (max bytes in one message: a body of many)
    long_string = "x" * 10 * uvicorn_high_water_mark
    assert httpx.post(f"{base()}/api", content=long_string, timeout=60).text == long_string


def test_shutdown_destructor():
    signal = Signal.remote()

    @serve.deployment(name="WithDestructor", ray_actor_options=CPU)
    class A:
        def __init__(self, signal):
            self.signal = signal

        def __call__(self, *args):
            return "a"

        def __del__(self):
            self.signal.send.remote()

    serve.run(A.bind(signal), name="A", route_prefix=None)
    serve.delete("A")
    assert until(lambda: ray.get(signal.count.remote(), timeout=10) == 1, timeout=10)


def test_run_get_ingress_node():
    @serve.deployment(name="Driver", ray_actor_options=CPU)
    class Driver:
        def __init__(self, handle):
            self._h = handle

        async def __call__(self, *args):
            return await self._h.remote()

    @serve.deployment(name="f_ingress", ray_actor_options=CPU)
    class F:
        def __call__(self, *args):
            return "got f"

    handle = serve.run(Driver.bind(F.bind()), route_prefix=None)
    assert handle.remote().result(timeout=30) == "got f"


def test_deploy_application_basic():
    @serve.deployment(name="f_basic", ray_actor_options=CPU)
    class F:
        def __call__(self):
            return "got f"

    @serve.deployment(name="g_basic", ray_actor_options=CPU)
    class G:
        def __call__(self):
            return "got g"

    @serve.deployment(name="h_basic", ray_actor_options=CPU)
    class H:
        def __call__(self):
            return "got h"

    app = FastAPI()

    @serve.deployment(name="MyFastAPIDeployment", ray_actor_options=CPU)
    @serve.ingress(app)
    class MyFastAPIDeployment:
        @app.get("/")
        def root(self):
            return "Hello, world!"

    f_handle = serve.run(F.bind(), name="app_f")
    assert f_handle.remote().result(timeout=30) == "got f"
    assert httpx.get(f"{base()}/", timeout=30).text == "got f"
    g_handle = serve.run(G.bind(), name="app_g", route_prefix="/app_g")
    assert g_handle.remote().result(timeout=30) == "got g"
    assert httpx.get(f"{base()}/app_g", timeout=30).text == "got g"
    h_handle = serve.run(H.bind(), name="app_h", route_prefix="/my_prefix")
    assert h_handle.remote().result(timeout=30) == "got h"
    assert httpx.get(f"{base()}/my_prefix", timeout=30).text == "got h"
    serve.run(MyFastAPIDeployment.bind(), name="FastAPI", route_prefix="/hello")
    # (requests follows redirects: the 307 from /hello to /hello/ that starlette answers for a route "/" under a
    # root_path, httpx when told)
    assert httpx.get(f"{base()}/hello", timeout=30, follow_redirects=True).text == '"Hello, world!"'


def test_delete_application():
    @serve.deployment(name="f_del", ray_actor_options=CPU)
    class F:
        def __call__(self, *args):
            return "got f"

    @serve.deployment(name="g_del", ray_actor_options=CPU)
    class G:
        def __call__(self, *args):
            return "got g"

    f_handle = serve.run(F.bind(), name="app_f")
    g_handle = serve.run(G.bind(), name="app_g", route_prefix="/app_g")
    assert f_handle.remote().result(timeout=30) == "got f"
    assert httpx.get(f"{base()}/", timeout=10).text == "got f"
    serve.delete("app_f")
    assert "Path '/' not found" in httpx.get(f"{base()}/", timeout=10).text
    assert g_handle.remote().result(timeout=30) == "got g"  # (no effect on app_g: checked before the 2nd delete)
    assert httpx.get(f"{base()}/app_g", timeout=10).text == "got g"
    serve.delete("app_f")  # again: no exception expected


def test_delete_while_initializing():
    signal = Signal.options(name=SIGNAL, namespace="rankcore-serve-parity").remote()
    try:
        apply({"name": "hanging", "route_prefix": None, "import_path": f"{MODULE}:hanging_app"})
        assert until(lambda: ray.get(signal.count.remote(), timeout=10) == 1)  # __init__ started
        apps.delete_app("hanging")
        assert until(lambda: ray.get(signal.count.remote(), timeout=10) == 2, timeout=4)  # __del__ ran once
    finally:
        ray.kill(signal)


def test_deployment_name_with_app_name():
    pytest.skip("differs on purpose: deployment names are global in rankcore, not per application (docs/ray.md, "
                "'Porting a Serve app'; docs/operate.md): a replica is not named by its application")


def test_deploy_application_with_same_name():
    @serve.deployment(name="Model_same", ray_actor_options=CPU)
    class Model:
        def __call__(self, *args):
            return "got model"

    @serve.deployment(name="Model1_same", ray_actor_options=CPU)
    class Model1:
        def __call__(self, *args):
            return "got model1"

    handle = serve.run(Model.bind(), name="app")
    assert handle.remote().result(timeout=30) == "got model"
    assert httpx.get(f"{base()}/", timeout=10).text == "got model"
    handle = serve.run(Model1.bind(), name="app")
    assert handle.remote().result(timeout=30) == "got model1"
    assert httpx.get(f"{base()}/", timeout=10).text == "got model1"
    assert ask(get_controller(), "wait_deleted", "Model_same", 30.0, timeout=60)
    serve.run(Model1.bind(), name="app", route_prefix="/my_app")
    assert httpx.get(f"{base()}/my_app", timeout=10).text == "got model1"
    assert httpx.get(f"{base()}/", timeout=10).status_code == 404


def test_deploy_application_with_route_prefix_conflict():
    @serve.deployment(name="Model_conflict", ray_actor_options=CPU)
    class Model:
        def __call__(self, *args):
            return "got model"

    @serve.deployment(name="Model1_conflict", ray_actor_options=CPU)
    class Model1:
        def __call__(self, *args):
            return "got model1"

    handle = serve.run(Model.bind(), name="app")
    assert handle.remote().result(timeout=30) == "got model"
    assert httpx.get(f"{base()}/", timeout=10).text == "got model"
    with pytest.raises(rc.RankcoreError, match="route_prefix '/' already routes"):  # (Serve: RayServeException)
        serve.run(Model1.bind(), name="app1")
    handle = serve.run(Model1.bind(), name="app1", route_prefix="/model1")
    assert handle.remote().result(timeout=30) == "got model1"
    assert httpx.get(f"{base()}/model1", timeout=10).text == "got model1"
    assert httpx.get(f"{base()}/", timeout=10).text == "got model"


# ------------------------------------------------------------------ application builders
@serve.deployment(name="BuilderA", ray_actor_options=CPU)
class BuilderA:
    def __init__(self, *args):
        self.args = args


@serve.deployment(name="BuilderF", ray_actor_options=CPU)
class BuilderF:  # (Serve's function deployment f)
    pass


built_a, built_f = BuilderA.bind(), BuilderF.bind()


class ThisShouldBeAFunction:
    pass


def builder_with_two_args(args1, args2):
    return BuilderF.bind()


def return_none(args):
    BuilderF.bind()


def return_unbound_deployment(args):
    return BuilderF


def build_function(args):
    return BuilderA.bind()


def build_class(args):
    return BuilderF.bind()


def build_args_dict(args):
    assert len(args) == 2 and args["message"] == "hiya" and args["num_replicas"] == "3"
    return BuilderA.options(num_replicas=int(args["num_replicas"])).bind(args["message"])


def build_untyped(args):
    return BuilderA.options(num_replicas=int(args["num_replicas"])).bind(args["message"])


def build_dict_hint(args: dict[str, str]):
    return BuilderA.options(num_replicas=int(args["num_replicas"])).bind(args["message"])


class ForwardRef:
    def build(args: ForwardRef):  # (Serve's case: a builder with a forward reference as its hint)
        return BuilderA.options(num_replicas=int(args["num_replicas"])).bind(args["message"])


build_forward_ref = ForwardRef.build


def _typed_args() -> type:
    from pydantic import BaseModel

    class TypedArgs(BaseModel):
        message: str
        num_replicas: int | None = None

    return TypedArgs


TypedArgs = _typed_args()


def build_typed(args: TypedArgs):  # type: ignore[valid-type]
    assert isinstance(args, TypedArgs), f"args type: {type(args)}"
    assert args.message == "hiya" and args.num_replicas == 3
    return BuilderA.options(num_replicas=args.num_replicas).bind(args.message)


def _cat_builder(use_v1_patch: bool):
    if use_v1_patch:
        from pydantic.v1 import BaseModel
    else:
        from pydantic import BaseModel

    class Cat(BaseModel):
        color: str
        age: int

    def build(args: Cat):
        assert isinstance(args, Cat), f"args type: {type(args)}"
        assert (args.color, args.age) == ("orange", 10)
        return BuilderA.bind(f"My {args.color} cat is {args.age} years old.")

    return build


build_cat_v1, build_cat_v2 = _cat_builder(True), _cat_builder(False)


def built(attr: str, args: dict | None = None) -> serve.Application:
    """What ``rankcore deploy`` makes of ``import_path: <this module>:attr`` with ``args``."""
    return apps.import_app(f"{MODULE}:{attr}", args or {})


class TestAppBuilder:
    def test_prebuilt_app(self):
        assert built("built_a") == built_a
        assert built("built_f") == built_f
        with pytest.raises(rc.InvalidConfig, match="args are for a builder function"):  # (a ValueError, as Serve's)
            built("built_f", {"key": "val"})

    def test_invalid_builder(self):
        with pytest.raises(rc.InvalidConfig, match=r"not an application .* a deployment or a builder function"):
            built("ThisShouldBeAFunction")

    def test_invalid_signature(self):
        with pytest.raises(rc.InvalidConfig, match=r"the builder .*builder_with_two_args raised TypeError"):
            built("builder_with_two_args")

    def test_builder_returns_bad_type(self):
        with pytest.raises(rc.InvalidConfig, match="returned a NoneType, not an application"):
            built("return_none")
        assert built("return_unbound_deployment").deployment is BuilderF
        pytest.skip("differs on purpose: wherever an application is expected rankcore binds a deployment with no "
                    "arguments (docs/operate.md, 'What applying does': an application, a deployment, or a builder "
                    "function); Serve refuses a builder that returns an unbound deployment")

    def test_basic_no_args(self):
        assert isinstance(built("build_function"), serve.Application)
        assert isinstance(built("build_class"), serve.Application)

    def test_args_dict(self):
        app = built("build_args_dict", {"message": "hiya", "num_replicas": "3"})
        assert isinstance(app, serve.Application) and app.deployment.num_replicas == 3

    def test_args_typed(self):
        args = {"message": "hiya", "num_replicas": "3"}
        for attr in ("build_untyped", "build_dict_hint", "build_forward_ref"):
            assert isinstance(built(attr, args), serve.Application), attr
        assert isinstance(built("build_typed", args), serve.Application)

    @pytest.mark.parametrize("use_v1_patch", [True, False])
    def test_pydantic_version_compatibility(self, use_v1_patch: bool):
        attr = "build_cat_v1" if use_v1_patch else "build_cat_v2"
        assert isinstance(built(attr, {"color": "orange", "age": 10}), serve.Application)


# ------------------------------------------------------------------ options, status, handles
def test_no_slash_route_prefix():
    @serve.deployment(name="f_no_slash", ray_actor_options=CPU)
    class F:
        def __call__(self, *args):
            return "f"

    with pytest.raises(ValueError, match="route_prefix must be a string starting with '/', got 'no_slash'"):
        serve.run(F.bind(), route_prefix="no_slash")
    from executors.ray_gpu.api.deployments import delete

    try:  # (the refused run left its deployment running: reported with issue 64's port)
        delete("f_no_slash", wait=False)
    except rc.InvalidEvent:
        pass


def test_mutually_exclusive_max_replicas_per_node_and_placement_group_bundles():
    with pytest.raises(rc.InvalidConfig, match="max_replicas_per_node"):
        serve.deployment(max_replicas_per_node=3, placement_group_bundles=[{"CPU": 1}])(type("f", (), {}))
    g = serve.deployment(type("g", (), {}))
    with pytest.raises(rc.InvalidConfig, match="max_replicas_per_node"):
        g.options(max_replicas_per_node=3, placement_group_bundles=[{"CPU": 1}])
    pytest.skip("differs on purpose: max_replicas_per_node is not supported by rankcore's Ray executor (docs/"
                "operate.md, Keys: refused); as an option in code it is refused as unknown (docs/ray.md, 'Options "
                "are checked where they are written')")


def test_status_basic():
    deadline = time.monotonic() + 60  # (an application an earlier case deleted without waiting: gone first)
    while serve.status()["applications"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(serve.status()["applications"]) == 0

    @serve.deployment(name="A_status", ray_actor_options={"num_cpus": 0.1})
    class A:
        def __call__(self, val: int):
            return val + 1

    @serve.deployment(name="f_status", ray_actor_options={"num_cpus": 0.1})
    class F:
        def __call__(self, *args):
            return "hello world"

    @serve.deployment(name="MyDriver_status", ray_actor_options={"num_cpus": 0.1})
    class MyDriver:
        def __init__(self, handle):
            self._h = handle

        async def __call__(self, *args):
            return await self._h.remote()

    handle_1 = serve.run(A.bind(), name="plus", route_prefix="/a")
    assert "plus" in serve.status()["applications"]  # (asked before the second run: the xfail costs one start)
    handle_2 = serve.run(MyDriver.bind(F.bind()), name="hello", route_prefix="/b")
    assert handle_1.remote(8).result(timeout=30) == 9
    assert handle_2.remote().result(timeout=30) == "hello world"
    applications = serve.status()["applications"]
    assert set(applications) == {"plus", "hello"}
    assert set(applications["plus"]["deployments"]) == {"A_status"}
    assert set(applications["hello"]["deployments"]) == {"MyDriver_status", "f_status"}
    for app in applications.values():
        for d in app["deployments"].values():
            assert d["status"] == "HEALTHY" and [r["state"] for r in d["replicas"]] == ["RUNNING"]
    assert all(p["status"] == "HEALTHY" for p in serve.status()["proxies"].values())


def test_status_constructor_error():
    apply({"name": "default", "route_prefix": "/", "import_path": f"{MODULE}:failing_app"})

    def failed() -> dict | None:
        app = serve.status()["applications"]["default"]
        message = app["deployments"]["FailingA"]["message"]
        return app if "ZeroDivisionError: division by zero" in message or "ZeroDivisionError('division by zero')" \
            in message else None

    app = until(failed)
    assert app, serve.status()["applications"]
    # (Serve says DEPLOY_FAILED; rankcore UNHEALTHY, and it keeps retrying: docs/ray.md, the option table,
    # max_constructor_retry_count)
    assert app["status"] == "UNHEALTHY" and app["deployments"]["FailingA"]["status"] == "UNHEALTHY"
    try:
        r = httpx.post(f"{base()}/", timeout=3)
    except httpx.TimeoutException:
        pytest.fail("a request to the failed application got no answer within 3 s")
    assert r.status_code == 503 and "unavailable" in r.text
    apply({"name": "default", "route_prefix": "/", "import_path": f"{MODULE}:fixed_app"}, wait_s=60)
    app = serve.status()["applications"]["default"]
    assert app["status"] == "RUNNING" and app["deployments"]["FailingA"]["status"] == "HEALTHY"


def test_status_package_unavailable_in_controller():
    pytest.skip("not ported: installs PyMySQL and sqlalchemy from PyPI into a replica's runtime_env (pip), and this "
                "suite reaches no network; a constructor's error in serve.status() is checked by "
                "test_status_constructor_error")


def test_get_app_handle_basic():
    @serve.deployment(name="M_handle", ray_actor_options={"num_cpus": 0.1})
    class M:
        def __call__(self, val: int):
            return val + 1

    @serve.deployment(name="f_handle", ray_actor_options={"num_cpus": 0.1})
    class F:
        def __call__(self, *args):
            return "hello world"

    @serve.deployment(name="MyDriver_handle", ray_actor_options={"num_cpus": 0.1})
    class MyDriver:
        def __init__(self, handle):
            self._h = handle

        async def __call__(self, *args):
            return await self._h.remote()

    serve.run(M.bind(), name="A", route_prefix="/a")
    serve.run(MyDriver.bind(F.bind()), name="B", route_prefix="/b")
    assert serve.get_app_handle("A").remote(8).result(timeout=30) == 9
    assert serve.get_app_handle("B").remote().result(timeout=30) == "hello world"


def test_get_app_handle_dne():
    with pytest.raises(rc.RankcoreError) as e:  # (Serve: RayServeException "Application 'random' does not exist")
        serve.get_app_handle("random")
    assert "no application 'random'" in str(e.value)


def test_get_app_handle_within_deployment_async():
    @serve.deployment(name="a_within", ray_actor_options=CPU)
    class A:
        def __init__(self, handle):
            self.handle = handle

        def __call__(self, val: int):
            return val + 2

    @serve.deployment(name="b_within", ray_actor_options=CPU)
    class B:
        def __call__(self, val: int):
            return val

    @serve.deployment(name="f_within", ray_actor_options=CPU)
    class F:
        async def __call__(self, val):
            handle = serve.get_app_handle("default")
            return f"The answer is {await handle.remote(val)}"

    serve.run(A.bind(B.bind()), route_prefix="/math")
    serve.run(F.bind(), name="call", route_prefix=None)
    assert serve.get_app_handle("call").remote(7).result(timeout=30) == "The answer is 9"


def test_get_deployment_handle_basic():
    @serve.deployment(name="f_dephandle", ray_actor_options={"num_cpus": 0.1})
    class F:
        def __call__(self, *args):
            return "hello world"

    @serve.deployment(name="MyDriver_dephandle", ray_actor_options={"num_cpus": 0.1})
    class MyDriver:
        def __init__(self, handle):
            self._h = handle

        async def __call__(self, *args):
            return f"{await self._h.remote()}!!"

    serve.run(MyDriver.bind(F.bind()), route_prefix=None)
    handle = serve.get_deployment_handle("f_dephandle", "default")
    assert isinstance(handle, serve.DeploymentHandle) and handle.remote().result(timeout=30) == "hello world"
    app_handle = serve.get_app_handle("default")
    assert isinstance(app_handle, serve.DeploymentHandle)
    assert app_handle.remote().result(timeout=30) == "hello world!!"


class HandleWrapper:
    def __init__(self, handle: serve.DeploymentHandle):
        self._handle = handle

    def get(self) -> serve.DeploymentHandle:
        return self._handle


def test_deployment_handle_nested_in_obj():
    @serve.deployment(name="f_nested", ray_actor_options=CPU)
    class F:
        def __call__(self) -> str:
            return "hi"

    @serve.deployment(name="MyDriver_nested", ray_actor_options=CPU)
    class MyDriver:
        def __init__(self, handle_wrapper: HandleWrapper):
            self.handle_wrapper = handle_wrapper

        async def __call__(self) -> str:
            return await self.handle_wrapper.get().remote()

    h = serve.run(MyDriver.bind(HandleWrapper(F.bind())), route_prefix=None)
    assert h.remote().result(timeout=30) == "hi"


def test_max_ongoing_requests_none():
    class A:
        def __call__(self, *args):
            return "a"

    with pytest.raises(ValueError):
        serve.deployment(max_ongoing_requests=None)(A).bind()
    with pytest.raises(ValueError):
        serve.deployment(A).options(max_ongoing_requests=None).bind()

    def max_ongoing() -> int:
        return deployed("A").config.requests.max_ongoing_requests

    serve.run(serve.deployment(A).bind(), route_prefix=None)
    assert max_ongoing() == rc.options.DEFAULTS.max_ongoing_requests == 5
    serve.run(serve.deployment(max_ongoing_requests=8, graceful_shutdown_timeout_s=2)(A).bind(), route_prefix=None)
    assert max_ongoing() == 8
    serve.run(serve.deployment(A).options(max_ongoing_requests=12).bind(), route_prefix=None)
    assert max_ongoing() == 12


@pytest.mark.xfail(strict=True, reason="differs on purpose: request_router_class is no keyword of @serve.deployment "
                                       "(Serve 2.60 takes request_router_config, as rankcore does), and module."
                                       "FakeRequestRouter cannot be imported: a router must exist (docs/routing.md)")
def test_deploy_app_with_custom_request_router():
    @serve.deployment(name="CustomRouter", request_router_class="module.FakeRequestRouter", ray_actor_options=CPU)
    class AppWithCustomRequestRouter:
        def __call__(self) -> str:
            return "Hello, world!"

    assert serve.run(AppWithCustomRequestRouter.bind(), route_prefix=None).remote().result(timeout=30) == \
        "Hello, world!"
