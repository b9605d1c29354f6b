"""The by-value transport's pieces without Ray (executors/ray_gpu/base/by_value.py): what travels, the
user's error as Ray raises it, and a call and its cancel over a real gRPC server in this process.
The Ray side (a router, replicas, a replica's death) is tests/integration/test_ray_requests.py's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
import ray
from ray.exceptions import RayTaskError

from executors.ray_gpu.base import by_value


def test_a_call_travels_pickled_and_what_plain_pickle_refuses_by_cloudpickle():
    call = ("__call__", (1, "x", {"a": [1.5, None]}), {"k": b"\x00"}, ("/r", "id", "app", ""), 7)
    assert by_value.decode(by_value.encode(call)) == call
    square = by_value.decode(by_value.encode(lambda x: x * x))  # (a lambda: cloudpickle's)
    assert square(7) == 49


def test_a_ray_object_ref_anywhere_inside_or_too_many_bytes_do_not_go_by_value():
    """Its router then sends the call as a Ray call: a ref's owner travels only with Ray's own
    serialisation; a large call is stopped as soon as it is too large, not pickled whole first."""
    ref = ray.ObjectRef(b"\x01" * 28)
    for call in (("f", (ref,), {}), ("f", ([{"deep": ref}],), {}), ("f", (), {"k": (1, ref)}),
                 ("f", (lambda: ref,), {})):  # (the last by cloudpickle: a closure holding it)
        with pytest.raises(by_value.NotByValue, match="ObjectRef"):
            by_value.encode(call)
    with pytest.raises(by_value.NotByValue, match="more than 1000 bytes"):
        by_value.encode(("f", (b"x" * 5000,), {}), most=1000)
    assert by_value.decode(by_value.encode(("f", (b"x" * 500,), {}), most=1000)) == ("f", (b"x" * 500,), {})


def test_the_users_error_comes_back_as_ray_raises_it_with_its_remote_traceback():
    def user_method() -> None:
        raise ValueError("bad input 3")

    try:
        user_method()
    except ValueError as exc:
        ok, err = by_value.decode(by_value.failure("Model.__call__", exc))
    assert ok is False and isinstance(err, RayTaskError)
    raised = err.as_instanceof_cause()
    assert isinstance(raised, ValueError) and type(raised).__name__ == "RayTaskError(ValueError)"
    assert "bad input 3" in str(raised) and "user_method" in str(raised)  # (the traceback, by name)


def test_an_error_that_does_not_pickle_comes_back_as_ray_sends_one_with_its_text():
    class Holding(Exception):
        def __init__(self) -> None:
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    ok, err = by_value.decode(by_value.failure("Model.f", Holding()))
    raised = err.as_instanceof_cause()  # (Ray's own: the cause said not serialisable, with its text)
    assert ok is False and isinstance(raised, RayTaskError)
    assert "holds a lock" in str(raised) and "Holding isn't serializable" in str(raised.cause)


def test_a_call_and_a_cancel_over_a_replicas_server():
    """The replica's side (``start_server``, on an event loop of its own thread here) and a router's
    (``channel``, gRPC's threaded client): an answer comes back; a call the caller cancels cancels
    the server's task for it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    cancelled = threading.Event()

    async def answer(data: bytes, began) -> bytes:
        if data == b"wait":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return data[::-1]

    server, address = asyncio.run_coroutine_threadsafe(by_value.start_server(answer, "127.0.0.1"), loop).result(10)
    ch = by_value.channel(address)
    try:
        call = ch.unary_unary(by_value.METHOD)
        assert call.future(b"abc").result(timeout=10) == b"cba"
        waiting = call.future(b"wait")
        time.sleep(0.2)
        assert waiting.cancel() and waiting.cancelled()
        assert cancelled.wait(10), "the server's task was not cancelled"
    finally:
        ch.close()
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


_SERVER = """
import asyncio, sys
from executors.ray_gpu.base import by_value

async def answer(data, began):
    if data == b"began":
        await began()  # (as a replica once the call holds a slot)
        print("began", flush=True)
    await asyncio.sleep(60)
    return data

async def main():
    server, address = await by_value.start_server(answer, "127.0.0.1")
    print(address, flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def test_a_call_cut_off_before_its_begin_marker_never_began_and_one_after_it_did():
    """``never_began``: the replica's server sends ``BEGAN`` once a call holds a slot; when its process
    is killed, a call that had it began (it may have run: never sent again) and one still waiting for
    a slot never did (it may go to another replica), both failing UNAVAILABLE alike."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        address = proc.stdout.readline().strip()
        ch = by_value.channel(address)
        call = ch.unary_unary(by_value.METHOD)
        began, waiting = call.future(b"began"), call.future(b"waiting")
        assert proc.stdout.readline().strip() == "began"  # (the marker is on its way)
        time.sleep(0.3)  # (gRPC's threaded future shows the metadata only once the call ended)
        proc.kill()
        for f in (began, waiting):
            with pytest.raises(grpc.RpcError) as err:
                f.result(timeout=10)
            assert err.value.code() == by_value.UNAVAILABLE and not by_value.never_sent(err.value)
        assert not by_value.never_began(began) and by_value.never_began(waiting)
        ch.close()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


def test_an_unreachable_server_is_unavailable_and_the_call_never_left():
    """``never_sent``: no connection could be made, so the router may send the call again (by Ray call)."""
    ch = by_value.channel("127.0.0.1:1")  # (nothing listens on port 1)
    try:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(by_value.METHOD).future(b"x", timeout=5).result()
        assert err.value.code() == by_value.UNAVAILABLE
        assert by_value.never_sent(err.value)
    finally:
        ch.close()
    assert not by_value.never_sent(RuntimeError("failed to connect"))  # (not a gRPC call's error)


def test_a_class_or_function_of_main_travels_by_value_not_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain pickle names a class of the caller's ``__main__``, which the replica's ``__main__`` lacks:
    such a class or function goes by cloudpickle, and a process without it reads it."""
    class Point:
        def __init__(self, x: int) -> None:
            self.x = x

    def square(v: int) -> int:
        return v * v

    for obj in (Point, square):  # (as a script's own: found in this process's ``__main__``)
        obj.__module__ = "__main__"
        obj.__qualname__ = obj.__name__
        monkeypatch.setattr(sys.modules["__main__"], obj.__name__, obj, raising=False)
    data = by_value.encode(("f", (Point(3), square), {}))
    code = ("import pickle, sys; _, (p, f), _ = pickle.loads(sys.stdin.buffer.read()); "
            "print(type(p).__name__, p.x, f(p.x))")
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == ["Point", "3", "9"]


@pytest.mark.parametrize(("env", "handles_by_reference", "proxies_by_reference"), [
    ({}, True, False),  # (Serve's handles; ours' proxies by value)
    ({"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1"}, False, False),
    ({"RAY_SERVE_PROXY_USE_GRPC": "0"}, True, True),
    ({"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1", "RAY_SERVE_PROXY_USE_GRPC": "0"}, False, True),
    ({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}, False, False),  # (Serve's fast mode: handles over gRPC)
    ({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_USE_GRPC_BY_DEFAULT": "0"}, True, False),
])
def test_serves_variables_choose_the_way_of_handles_and_proxies(env, handles_by_reference, proxies_by_reference):
    """Read where the module is imported (a proxy's or a replica's process: set them before Ray starts)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_SERVE_")}
    out = subprocess.run([sys.executable, "-c", "from executors.ray_gpu.base import by_value as b; "
                          "print(b.HANDLE_BY_REFERENCE, b.PROXY_BY_REFERENCE)"],
                         env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [str(handles_by_reference), str(proxies_by_reference)]


_AUTH_CHECK = """
import asyncio
import grpc
from executors.ray_gpu.base import by_value

async def main():
    async def answer(b, began):
        return b"ok:" + b
    server, address = await by_value.start_server(answer, "127.0.0.1")
    def calls():
        ours = by_value.channel(address).unary_unary(by_value.METHOD).future(b"x", timeout=10).result()
        try:
            grpc.insecure_channel(address).unary_unary(by_value.METHOD).future(b"y", timeout=10).result()
            plain = "accepted"
        except grpc.RpcError as e:
            plain = e.code().name
        return ours.decode(), plain
    print(*await asyncio.get_running_loop().run_in_executor(None, calls))
    await server.stop(None)

asyncio.run(main())
"""


@pytest.mark.parametrize(("mode", "plain"), [("token", "UNAUTHENTICATED"), ("disabled", "accepted")])
def test_with_rays_token_auth_the_server_takes_only_calls_that_carry_the_token(mode: str, plain: str) -> None:
    """Server and channel are made as Ray makes its own (``ray._private.grpc_utils``): under
    ``RAY_AUTH_MODE=token`` a channel without Ray's token is refused, the router's is answered."""
    env = {**os.environ, "RAY_AUTH_MODE": mode, "RAY_AUTH_TOKEN": "0123456789abcdef0123456789abcdef"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _AUTH_CHECK], env=env, cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok:x", plain]
