"""Ray Serve's own batching and multiplexing tests, re-expressed against rankcore (issue 64,
"Prove it on Serve's own tests"): docs/testing.md, "Ray Serve's own tests (tests/serve_parity/)".

Serve runs its ``async def`` tests with pytest-asyncio; rankcore's environment has no such plugin,
so this folder runs them itself: each on a fresh event loop, bounded by ``deadline_s`` (default
20 s, a hung case fails with ``TimeoutError`` instead of stalling the suite; the streaming cases,
whose streams would wait out a 1000 s batch timeout if they did not form one batch at once, set a
short one). The multiplexing state of this process (every loader's models,
what a replica would be told) is emptied around each test, as a fresh replica would start.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from executors.ray_gpu.replica import multiplex

DEFAULT_DEADLINE_S = 20.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "asyncio: an async def test of Serve's (run here on a fresh event loop)")
    config.addinivalue_line("markers", "deadline_s(seconds): the most an async def test of this folder may run")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    test = pyfuncitem.obj
    if not inspect.iscoroutinefunction(test):
        return None
    mark = pyfuncitem.get_closest_marker("deadline_s")
    deadline = float(mark.args[0]) if mark is not None else DEFAULT_DEADLINE_S
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(asyncio.wait_for(test(**kwargs), deadline))
    return True


@pytest.fixture(autouse=True)
def _fresh_multiplexers():
    """No loader's models, and no report sink, left over from another test."""
    multiplex._sink.clear()
    multiplex._every.clear()
    multiplex._plain.clear()
    yield
    multiplex._sink.clear()
    multiplex._every.clear()
    multiplex._plain.clear()
