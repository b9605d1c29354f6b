"""Serve's two HTTP ingress shapes in the replica, in process (``executors.ray_gpu.replica.asgi``):
``__call__(self, request)`` of a ``serve.deployment`` class and ``@serve.ingress(app)``. The proxy
side and a real Ray are tests/integration/test_ray_serve_port.py."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.responses import JSONResponse, StreamingResponse

import rankcore as rc
from executors.ray_gpu import serve
from executors.ray_gpu.base.exposed import reachable
from executors.ray_gpu.replica import asgi


def _scope(method: str, path: str, root: str = "", query: bytes = b"", headers: tuple = ()) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query, "root_path": root,
            "headers": [(b"host", b"test"), *headers], "client": ("10.0.0.1", 4242), "server": ("test", 80)}


async def _batches(obj: object, scope: dict, body: bytes = b"") -> list[list[dict]]:
    await asgi.started(obj)
    try:
        return [batch async for batch in asgi._answer(obj, scope, body)]
    finally:
        await asgi.stopped(obj)


def _answer(batches: list[list[dict]]) -> tuple[int, dict, bytes]:
    messages = [m for b in batches for m in b]
    start = messages[0]
    assert start["type"] == "http.response.start"
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in messages[1:])


def run(coro):
    return asyncio.run(coro)


class Echo:
    def __init__(self):
        self.calls = 0

    async def __call__(self, request):
        self.calls += 1
        return {"method": request.method, "path": request.url.path, "root_path": request.scope["root_path"],
                "query": dict(request.query_params), "body": (await request.body()).decode(), "calls": self.calls}


def test_call_gets_a_starlette_request_for_any_path_and_method():
    serve.deployment(Echo)  # (Serve's decorator marks the class: HTTP reaches __call__ with a Request)
    assert reachable(Echo).asgi and reachable(Echo).refusal("Echo", "any", "http") is None
    e = Echo()
    status, headers, body = _answer(run(_batches(e, _scope("PUT", "/echo/v1/predict", "/echo", b"k=v"), b"hi")))
    assert status == 200 and headers["content-type"] == "application/json"
    assert body == (b'{"method":"PUT","path":"/echo/v1/predict","root_path":"/echo","query":{"k":"v"},'
                    b'"body":"hi","calls":1}')


@pytest.mark.parametrize(("value", "status", "ctype", "body"), [
    ("héllo", 200, "text/plain; charset=utf-8", "héllo".encode()),
    (b"\x00raw", 200, "text/plain", b"\x00raw"),
    (None, 200, "text/plain", b""),
    ({"a": [1, 2.5]}, 200, "application/json", b'{"a":[1,2.5]}'),
    (JSONResponse({"made": True}, status_code=418), 418, "application/json", b'{"made":true}'),
])
def test_what_call_returns_is_answered_as_serve_answers_it(value, status, ctype, body):
    class Returns:
        def __call__(self, request):  # (a sync __call__ runs on a thread)
            return value

    asgi.request_ingress(Returns)
    got = _answer(run(_batches(Returns(), _scope("GET", "/r", "/r"))))
    assert (got[0], got[1]["content-type"].split(";")[0], got[2]) == (status, ctype.split(";")[0], body)
    assert got[1]["content-type"] == ctype


def test_a_call_that_takes_no_argument_gets_no_request():
    class NoArgs:
        def __call__(self):
            return "no request"

    class Star:
        async def __call__(self, *args):
            return len(args)

    asgi.request_ingress(NoArgs)
    asgi.request_ingress(Star)
    assert _answer(run(_batches(NoArgs(), _scope("GET", "/n", "/n")))) [2] == b"no request"
    assert _answer(run(_batches(Star(), _scope("GET", "/s", "/s"))))[2] == b"1"


def test_a_generator_from_call_is_a_clear_error_and_a_streaming_response_streams():
    class Gen:
        async def __call__(self, request):
            if request.url.path.endswith("/stream"):
                return StreamingResponse((f"{i}\n" for i in range(3)), media_type="text/plain")
            return (i for i in range(3))

    asgi.request_ingress(Gen)
    with pytest.raises(TypeError, match="returned a generator: over HTTP, return a starlette StreamingResponse"):
        run(_batches(Gen(), _scope("GET", "/g", "/g")))
    batches = run(_batches(Gen(), _scope("GET", "/g/stream", "/g")))
    assert len(batches) >= 4  # (each chunk its own list, as the app sends it: it streams)
    assert _answer(batches)[2] == b"0\n1\n2\n"


class Payload(BaseModel):
    x: list[float]


def test_a_fastapi_ingress_is_a_class_based_view_with_its_lifespan():
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("startup")
        yield
        events.append("shutdown")

    app = FastAPI(lifespan=lifespan)

    @asgi.ingress(app)
    class Api:
        def __init__(self):
            self.word = "mine"

        @app.post("/v1/predict")
        async def predict(self, payload: Payload, scale: float = 1.0):
            return {"sum": sum(payload.x) * scale, "word": self.word}

        @app.get("/items/{i}")
        def item(self, i: int):
            return {"i": i, "word": self.word}

    assert reachable(Api).asgi
    obj = Api()
    json_body = ((b"content-type", b"application/json"),)
    got = _answer(run(_batches(obj, _scope("POST", "/p/v1/predict", "/p", b"scale=2", json_body), b'{"x": [1, 2.5]}')))
    assert got[0] == 200 and got[2] == b'{"sum":7.0,"word":"mine"}'
    assert events == ["startup", "shutdown"]
    assert _answer(run(_batches(obj, _scope("GET", "/p/items/3", "/p"))))[2] == b'{"i":3,"word":"mine"}'
    assert _answer(run(_batches(obj, _scope("GET", "/p/items/three", "/p"))))[0] == 422  # (FastAPI's check)
    assert _answer(run(_batches(obj, _scope("GET", "/p/absent", "/p"))))[0] == 404


def test_a_failed_lifespan_startup_fails_the_start():
    @contextlib.asynccontextmanager
    async def lifespan(app):
        raise RuntimeError("no model file")
        yield

    app = FastAPI(lifespan=lifespan)

    @asgi.ingress(app)
    class Broken:
        @app.get("/")
        def root(self):
            return 1

    with pytest.raises(RuntimeError, match="lifespan startup of 'Broken' failed"):
        run(asgi.started(Broken()))


def test_ingress_refuses_what_serve_refuses():
    with pytest.raises(rc.InvalidConfig, match=r"serve\.ingress takes an ASGI app"):
        serve.ingress(42)
    with pytest.raises(rc.InvalidConfig, match="decorates a class"):
        serve.ingress(FastAPI())(lambda: None)

    class HasCall:
        def __call__(self):
            return 1

    with pytest.raises(rc.InvalidConfig, match="may not have a __call__ method"):
        serve.ingress(FastAPI())(HasCall)
    app = FastAPI()

    class NoSelf:
        @app.get("/")
        def root():  # (the mistake under test: no self)
            return 1

    with pytest.raises(rc.InvalidConfig, match="must take self"):
        serve.ingress(app)(NoSelf)


def test_rankcores_own_deployment_keeps_json_calls():
    class Plain:
        def __call__(self, x):
            return x

    rc_plain = reachable(Plain)
    assert not rc_plain.asgi and rc_plain.refusal("Plain", "other", "http") is not None
    assert not hasattr(Plain, asgi.ENTRY)


def test_a_function_deployment_is_a_class_that_calls_the_function_as_it_is_written():
    """Serve's ``@serve.deployment`` on a ``def``: a class named as the function whose ``__call__`` calls it
    (HTTP gives it the Request), awaited when it is ``async``, its items relayed when it is a generator."""
    def plain(request):
        return f"plain {request.url.path}"

    async def awaited(x):
        return x * 2

    def counted(n):
        yield from range(n)

    async def streamed(n):
        for i in range(n):
            yield i

    d = serve.deployment(plain)
    assert d.name == "plain" and isinstance(d.cls, type) and reachable(d.cls).asgi
    status, _, body = _answer(run(_batches(d.cls(), _scope("GET", "/fn/x", "/fn"))))
    assert (status, body) == (200, b"plain /fn/x")
    assert run(serve.deployment(num_replicas=2)(awaited).cls()(3)) == 6
    assert list(serve.deployment(counted).cls()(3)) == [0, 1, 2]

    async def items():
        return [i async for i in serve.deployment(streamed).cls()(3)]
    assert run(items()) == [0, 1, 2]
    with pytest.raises(rc.InvalidConfig):  # (an instance is still refused, as Serve refuses it)
        serve.deployment(Echo())
