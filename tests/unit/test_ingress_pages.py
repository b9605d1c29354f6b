"""The proxy's own pages as scripts and load balancers read them (issue 64): ``/-/routes`` answers
503 while the proxy drains, as Ray Serve's, and ``/-/healthz`` says so too; no Ray needed (the
starlette app over an ``IngressState``)."""

from __future__ import annotations

from starlette.testclient import TestClient

from executors.ray_gpu.ingress.http import IngressState, make_app


def _client(draining: bool) -> TestClient:
    state = IngressState({"/a": "A", "/b": "B"}, {}, 1000, 5.0)
    state.draining = draining
    return TestClient(make_app(state))


def test_routes_answer_the_table_and_503_while_draining():
    with _client(draining=False) as c:
        r = c.get("/-/routes")
        assert r.status_code == 200 and r.json() == {"/a": "A", "/b": "B"}
    with _client(draining=True) as c:
        r = c.get("/-/routes")
        assert r.status_code == 503 and r.json()["error"] == "draining", r.text
        h = c.get("/-/healthz")
        assert h.status_code == 503 and "drained" in h.json()["detail"]


def test_an_unknown_path_is_serves_404_text_with_the_request_id():
    with _client(draining=False) as c:
        r = c.get("/nowhere", headers={"x-request-id": "rid-7"})
        assert r.status_code == 404
        assert r.text == "Path '/nowhere' not found. Ping http://.../-/routes for available routes."
        assert r.headers["x-request-id"] == "rid-7"
