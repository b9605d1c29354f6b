"""The data plane's rules (rankcore/requests/dataplane.py, issue 65), case by case."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.requests import dataplane as dp

A = {"e#1": "127.0.0.1:9001", "e#2": "127.0.0.1:9002", "e#3": "127.0.0.1:9003"}


def _route(serving=("e#1", "e#2"), draining=(), addresses=A, max_ongoing=5, max_queued=-1):
    return dp.route("e", "/e", serving, draining, addresses, max_ongoing, max_queued, 60.0)


def test_serving_ready_draining_drain_unknown_left_out():
    r = _route(serving=("e#1", "e#4"), draining=("e#2",))
    assert [(s.replica_id, s.ready, s.maxconn) for s in r.servers] == [("e#1", True, 5), ("e#2", False, 5)]
    assert r.direct


def test_only_draining_or_no_address_goes_through_the_proxy():
    assert not _route(serving=(), draining=("e#1",)).direct
    assert not _route(serving=("e#9",)).direct


def test_an_asgi_app_goes_through_the_proxy():
    r = dp.route("e", "/e", ("e#1",), (), A, 5, -1, None, app_name="app", asgi=True)
    assert not r.direct and r.servers and r.app_name == "app"


def test_a_server_set_drain_then_removed_without_a_reload():
    t0 = dp.table([_route()])
    t1 = dp.table([_route(serving=("e#1",), draining=("e#2",))])
    t2 = dp.table([_route(serving=("e#1", "e#3"))])
    c1 = dp.changes(t0, t1)
    assert c1 == (dp.SetServer(deployment="e", server=t1.routes[0].servers[1]),)
    assert not c1[0].server.ready
    c2 = dp.changes(t1, t2)
    assert [type(c) for c in c2] == [dp.RemoveServer, dp.AddServer]
    assert dp.apply(t1, c2) == t2


def test_limits_change_at_run_time_routes_by_reload():
    t0 = dp.table([_route()])
    assert dp.changes(t0, dp.table([_route(max_queued=10)])) == (dp.SetQueue(deployment="e", max_queued=10),)
    assert all(isinstance(c, dp.SetServer) and c.server.maxconn == 7
               for c in dp.changes(t0, dp.table([_route(max_ongoing=7)])))
    other = dp.route("f", "/f", (), (), {}, 1, -1, None)
    assert dp.changes(t0, dp.table([_route(), other])) == (dp.Reload(table=dp.table([_route(), other])),)
    assert dp.changes(None, t0) == (dp.Reload(table=t0),)


def test_longest_prefix_first_and_names_unique():
    t = dp.table([dp.route("a", "/a", (), (), {}, 1, -1, None), dp.route("b", "/a/b", (), (), {}, 1, -1, None)])
    assert [r.prefix for r in t.routes] == ["/a/b", "/a"]
    assert dp.server_name("x#1") != dp.server_name("x_1")
    assert dp.server_name("x#1").startswith("x_1_") and dp.server_name("a-b.c").startswith("a_b_c_")


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"address": "nohost"}, "host:port"),
    ({"address": "h:0"}, "host:port"),
    ({"maxconn": 0}, "maxconn"),
    ({"ready": 1}, "ready"),
])
def test_bad_server_is_refused(kwargs, words):
    fields = {"replica_id": "e#1", "address": "127.0.0.1:1", "ready": True, "maxconn": 1, **kwargs}
    with pytest.raises((rc.InvalidConfig, TypeError), match=words):
        dp.Server(**fields)


@pytest.mark.parametrize(("prefix", "queued", "timeout"), [
    ("e", -1, None), ("/e/", -1, None), ("/e f", -1, None), ("/e", -2, None), ("/e", -1, 0.0),
    ("/e", -1, float("inf")),
])
def test_bad_route_is_refused(prefix, queued, timeout):
    with pytest.raises(rc.InvalidConfig, match="Route"):
        dp.route("e", prefix, (), (), {}, 1, queued, timeout)


def test_a_replica_twice_in_a_route_is_refused():
    server = dp.Server(replica_id="e#1", address="127.0.0.1:1", ready=True, maxconn=1)
    with pytest.raises(rc.InvalidConfig, match="replica 'e#1' is there twice"):
        dp.Route(deployment="e", prefix="/e", servers=(server, server), max_queued=-1, queue_timeout_s=None)
    assert len(dp.route("e", "/e", ["e#1", "e#1"], ["e#1"], A, 1, -1, None).servers) == 1


def test_two_routes_on_one_prefix_are_refused():
    with pytest.raises(rc.InvalidConfig, match="share the prefix '/e'"):
        dp.table([_route(), dp.route("f", "/e", (), (), {}, 1, -1, None)])


def test_a_command_for_an_unknown_route_is_refused():
    with pytest.raises(rc.InvalidConfig, match="no route for deployment 'zz'"):
        dp.apply(dp.table([_route()]), [dp.SetQueue(deployment="zz", max_queued=1)])


def test_a_servers_grpc_address_is_part_of_where_it_is():
    """A replica that starts serving gRPC (its gRPC address now known) is a new server: removed and added,
    as one whose HTTP address changed; a bad gRPC address is refused."""
    before = dp.table([dp.route("d", "/d", ["d#1"], [], {"d#1": "10.0.0.1:8001"}, 5, -1, None)])
    after = dp.table([dp.route("d", "/d", ["d#1"], [], {"d#1": "10.0.0.1:8001"}, 5, -1, None,
                               grpc_addresses={"d#1": "10.0.0.1:9001"})])
    cmds = dp.changes(before, after)
    assert [type(c).__name__ for c in cmds] == ["RemoveServer", "AddServer"]
    assert cmds[1].server.grpc_address == "10.0.0.1:9001" and dp.apply(before, cmds) == after
    assert after.routes[0].grpc_backend.startswith("g_") and after.routes[0].backend.startswith("d_")
    with pytest.raises(rc.InvalidConfig, match="grpc_address must be 'host:port'"):
        dp.Server(replica_id="d#1", address="10.0.0.1:8001", ready=True, maxconn=1, grpc_address="nowhere")


@pytest.mark.parametrize(("pending", "waited", "serving", "takes"), [
    (0, 0.0, True, True),  # (the table whole: at once)
    (2, 0.0, True, False),  # (addresses still awaited: the adopted balancer serves on)
    (2, dp.TAKE_OVER_WAIT_S - 0.01, True, False),
    (2, dp.TAKE_OVER_WAIT_S, True, True),  # (waited long enough: whatever it holds)
    (2, 0.0, False, True),  # (the adopted one has gone: nobody accepts meanwhile)
])
def test_an_adopted_balancer_is_replaced_once_the_table_is_whole_the_wait_is_over_or_it_is_gone(
        pending, waited, serving, takes):
    assert dp.takes_over(pending, waited, serving) is takes
