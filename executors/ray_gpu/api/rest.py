"""The control plane's REST API, on Ray Serve's paths: a small starlette app in a uvicorn server
of its own actor (``rankcore-rest``, detached, ``num_cpus=0``, on the head node), never on the
data path (the HTTP ingress serves requests; this serves operators and scripts).

* ``GET /api/serve/applications/``: the applications as Ray Serve's ``ServeInstanceDetails``
  (``apps.details``);
* ``PUT /api/serve/applications/``: the body is a config (the file's schema, as JSON); checked
  first (400 naming the key path, nothing applied), then applied (``apps.apply_config``: it
  returns once applied, not once healthy, as Ray Serve's does); an import or option the code
  refuses is a 400 too (Ray Serve answers 200 and reports DEPLOY_FAILED later);
* ``DELETE /api/serve/applications/``: every application deleted and the controller reset
  (Ray Serve's ``serve.shutdown``); this server keeps running.

Ray Serve serves these on the dashboard (``http://localhost:8265``); ours listens on
``DEFAULT_PORT`` (8266) of 127.0.0.1 unless told otherwise (``rankcore deploy --rest-port``).

Hostile clients meet the HTTP ingress's limits, its constants and its code (``ingress/http.py``:
declared there once): a body above ``MAX_BODY_BYTES`` is 413 (by its Content-Length before it is
read, else as it streams), a body still arriving after ``REQUEST_TIMEOUT_S`` 408, JSON nested
deeper than ``MAX_JSON_DEPTH``, not JSON, NaN or a number past a double, or not an object 400;
and on the connection (``guarded``, the ingress's uvicorn protocol): a request head within
``HEADER_TIMEOUT_S`` (408, or closed when nothing came) and ``MAX_HEADER_BYTES`` (431), at most
``MAX_CONNECTIONS`` open (503). Those connection-level answers are the ingress's JSON errors; the
app's own are one line of text.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import ray

import rankcore as rc

from ..base.replicas import NAMESPACE
from ..ingress.actor import server_stack
from ..ingress.http import (
    HEADER_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    REQUEST_TIMEOUT_S,
    ClientGone,
    IngressState,
    Reply,
    check_connection_limits,
    check_limits,
    guarded,
    read_json,
)
from . import apps
from . import config as cf

__all__ = ["REST_NAME", "DEFAULT_HOST", "DEFAULT_PORT", "RestServer", "limits", "config_of", "make_app", "start_rest",
           "stop_rest", "rest_address"]


REST_NAME = "rankcore-rest"
DEFAULT_HOST = "127.0.0.1"
#: beside the Ray dashboard's 8265, where Ray Serve serves these paths
DEFAULT_PORT = 8266
PATH = "/api/serve/applications/"


def limits(*, max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float | None = REQUEST_TIMEOUT_S,
           header_timeout_s: float | None = HEADER_TIMEOUT_S, max_header_bytes: int = MAX_HEADER_BYTES,
           max_connections: int | None = MAX_CONNECTIONS) -> IngressState:
    """The REST server's limits, held as the HTTP ingress holds its own (an ``IngressState`` with no
    route: what its body reader and connection guard read, and the answers they counted), so the
    two servers share one definition of each limit and one piece of code enforcing it."""
    check_limits(max_body_bytes, body_timeout_s)
    check_connection_limits(header_timeout_s, max_header_bytes, max_connections)
    held = IngressState({}, {}, max_body_bytes, body_timeout_s)
    held.header_timeout_s, held.max_header_bytes, held.max_connections = header_timeout_s, max_header_bytes, \
        max_connections
    return held


def config_of(body: bytes) -> Any:
    """A PUT's body -> the JSON object it holds; ``Reply`` 400 naming what is wrong: empty (it
    would have deleted every application), not UTF-8 JSON, NaN or Infinity, a number past a double,
    nested deeper than ``MAX_JSON_DEPTH`` (a loop checks it: nothing recurses that deep), or not an
    object."""
    if not body.strip():
        raise Reply(400, "bad_request", "request body: empty: send the config, a JSON object with "
                                        "`applications` (`[]` deletes every application)")
    data = read_json(body, "not valid JSON: {}", "a number is beyond a 64-bit float", prefix="request body: ")
    if not isinstance(data, dict):
        raise Reply(400, "bad_request", f"request body: must be a JSON object (the config), got "
                                        f"{type(data).__name__ if data is not None else 'null'}")
    return data


def make_app(held: IngressState | None = None) -> Any:
    """The starlette app (its handlers call ``apps``; each runs in starlette's thread pool: they
    wait on Ray); ``held``: its limits (``limits()``'s defaults when None)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    held = held if held is not None else limits()

    async def applications(request: Request) -> Response:
        if request.method in ("GET", "HEAD"):
            return JSONResponse(await run_in_threadpool(apps.details))
        if request.method == "DELETE":
            await run_in_threadpool(apps.delete_all)
            return Response(status_code=200)
        try:  # PUT
            data = config_of(await held._body(request))  # (413 past the body cap, 408 when it stops arriving)
        except Reply as exc:
            # (answered maybe before the body's end: the connection closed, so a trickled rest holds nothing)
            return PlainTextResponse(exc.detail, status_code=exc.status,
                                     headers={"Connection": "close"} if exc.status != 400 else None)
        except ClientGone:  # (its client closed before the body's end: nobody to answer)
            return Response(status_code=499)
        try:
            cfg = cf.parse(data, "request body")
            await run_in_threadpool(apps.apply_config, cfg)
        except rc.InvalidConfig as exc:
            return PlainTextResponse(str(exc), status_code=400)
        except rc.InvalidEvent as exc:
            return PlainTextResponse(str(exc), status_code=409)
        return Response(status_code=200)

    methods = ["GET", "HEAD", "PUT", "DELETE"]
    return Starlette(routes=[Route(PATH, applications, methods=methods),
                             Route(PATH.rstrip("/"), applications, methods=methods)])


class RestServer:
    """The actor: binds its port when created (in use: the creation fails, naming it) and serves
    on a thread of its own; ``limit``: ``limits()``'s keywords (the tests' shorter timeouts)."""

    def __init__(self, host: str, port: int, **limit: Any) -> None:
        import socket

        import uvicorn

        self.limits = limits(**limit)  # (checked, like the parser's choice, before the port is taken)
        parser = server_stack()[1]
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise rc.InvalidConfig(f"the REST server cannot listen on {host}:{port}: {exc}") from None
        sock.listen(64)
        self.address = (host, sock.getsockname()[1])

        class Server(uvicorn.Server):
            def install_signal_handlers(self) -> None:  # the actor's process keeps Ray's handlers
                pass

            def capture_signals(self) -> Any:
                import contextlib

                return contextlib.nullcontext()

        if parser == "httptools":  # (the parser the ingress would use, guarded as it is)
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as protocol
        else:
            from uvicorn.protocols.http.h11_impl import H11Protocol as protocol  # type: ignore[assignment]
        # ws="none": no route takes a WebSocket; timeout_keep_alive: uvicorn's wait for a next request
        self.server = Server(uvicorn.Config(make_app(self.limits), log_level="warning", access_log=False,
                                            lifespan="off", http=guarded(protocol, self.limits), ws="none",
                                            timeout_keep_alive=5))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[sock])),
                                       name=REST_NAME, daemon=True)
        self.thread.start()

    def ready(self, timeout: float = 30.0) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the REST server did not start on {self.address}")
            time.sleep(0.01)
        return self.address

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def start_rest(host: str | None = None, port: int | None = None) -> str:
    """The REST server's URL: the running one's, or one started (on the head node, like the
    controller). A running one elsewhere than ``host``/``port`` raises ``InvalidConfig``."""
    from ray.exceptions import RayActorError

    actor: Any
    try:
        actor = ray.get_actor(REST_NAME, namespace=NAMESPACE)
    except ValueError:
        actor = ray.remote(RestServer).options(
            name=REST_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, max_restarts=-1,
            max_concurrency=8, num_cpus=0, resources={"node:__internal_head__": 0.001},
        ).remote(host or DEFAULT_HOST, DEFAULT_PORT if port is None else port)
    try:
        h, p = ray.get(actor.ready.remote())
    except RayActorError as exc:
        ray.kill(actor, no_restart=True)
        raise rc.InvalidConfig(f"the REST server did not start: {getattr(exc, 'cause', None) or exc}") from None
    if (host is not None and host != h) or (port not in (None, 0) and port != p):
        raise rc.InvalidConfig(f"the REST server already runs on {h}:{p}, not {host or h}:{port or p}")
    return f"http://{h}:{p}"


def rest_address() -> str | None:
    """The running REST server's URL, or None."""
    try:
        actor = ray.get_actor(REST_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
    h, p = ray.get(actor.ready.remote())
    return f"http://{h}:{p}"


def stop_rest(timeout: float = 10.0) -> None:
    """Stop the REST server, if one runs (its port is free once this returns)."""
    try:
        actor = ray.get_actor(REST_NAME, namespace=NAMESPACE)
    except ValueError:
        return
    try:
        ray.get(actor.stop.remote(), timeout=timeout)
    except Exception:
        pass
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(REST_NAME, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.05)
