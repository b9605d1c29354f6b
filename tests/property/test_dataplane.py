"""The data plane's table (rankcore/requests/dataplane.py, issue 65): whatever two tables, the
commands ``changes`` gives turn the first into the second, with a reload only when routes differ."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rankcore.requests import dataplane as dp

_IDS = [f"d#{i}" for i in range(6)]
_ADDRS = [f"10.0.0.{i}:{p}" for i in range(1, 3) for p in (8001, 8002)]


@st.composite
def routes(draw, deployment: str, prefix: str) -> dp.Route:
    ids = draw(st.lists(st.sampled_from(_IDS), unique=True, max_size=5))
    split = draw(st.integers(0, len(ids)))
    addresses = {rid: draw(st.sampled_from(_ADDRS)) for rid in ids if draw(st.booleans())}
    grpc = {rid: draw(st.sampled_from(_ADDRS)) for rid in addresses if draw(st.booleans())}  # (some serve gRPC)
    return dp.route(deployment, prefix, ids[:split], ids[split:], addresses,
                    draw(st.integers(1, 4)), draw(st.integers(-1, 3)), draw(st.sampled_from([None, 30.0])),
                    grpc_addresses=grpc)


@st.composite
def tables(draw) -> dp.Table:
    names = draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3))
    return dp.table([draw(routes(n, draw(st.sampled_from([f"/{n}", f"/x/{n}"])))) for n in names])


@settings(max_examples=300, deadline=None)
@given(old=st.none() | tables(), new=tables())
def test_changes_turn_old_into_new(old, new):
    cmds = dp.changes(old, new)
    assert dp.apply(old, cmds) == new
    reloads = [c for c in cmds if isinstance(c, dp.Reload)]
    same_routes = old is not None and [r.shape() for r in old.routes] == [r.shape() for r in new.routes]
    assert (not reloads) == same_routes
    if reloads:
        assert len(cmds) == 1


@settings(max_examples=200, deadline=None)
@given(t=tables())
def test_no_change_no_command(t):
    assert dp.changes(t, t) == ()


@settings(max_examples=200, deadline=None)
@given(t=tables())
def test_a_route_is_direct_while_a_server_is_ready(t):
    for r in t.routes:
        assert r.direct == any(s.ready for s in r.servers)
        assert len({s.name for s in r.servers}) == len(r.servers)
