"""The route label of a request to an ASGI deployment (``ingress.words.route_pattern``): the declared
route of its app that the request matched, as Serve's proxy labels it (``match_route_pattern``), read
from the class by ``base.exposed.route_patterns`` as Serve's ``extract_route_patterns`` reads an app;
the route prefix when the app declares none or none matches."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from starlette.applications import Starlette
from starlette.routing import Route

from executors.ray_gpu import serve
from executors.ray_gpu.base.exposed import reachable, route_patterns
from executors.ray_gpu.ingress.words import route_pattern


def _app() -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/")
    def root() -> str:
        return "root"

    @app.get("/users/{user_id}")
    def user(user_id: str) -> str:
        return user_id

    @app.post("/users/{user_id}")
    def set_user(user_id: str) -> str:
        return user_id

    router = APIRouter()

    @router.get("/{item_id}/details")
    def details(item_id: str) -> str:
        return item_id

    app.include_router(router, prefix="/items")

    async def deep(request: object) -> None:
        return None
    app.mount("/static", Starlette(routes=[Route("/deep", deep)]))
    return app


def test_the_patterns_are_every_declared_route_with_its_methods():
    assert route_patterns(_app()) == (
        ("/", ("GET",)), ("/items/{item_id}/details", ("GET",)), ("/static/deep", ("GET", "HEAD")),
        ("/users/{user_id}", ("GET", "POST")))


def test_an_apps_root_path_is_in_front_and_what_is_no_app_has_none():
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.root_path = "/v1/"  # (as the constructor's deprecated root_path sets it)

    @app.get("/x")
    def x() -> None:
        return None
    assert route_patterns(app) == (("/v1/x", ("GET",)),)
    assert route_patterns(lambda: app) == () and route_patterns(None) == ()


def test_a_request_is_labelled_with_its_matched_route_under_its_prefix():
    p = route_patterns(_app())
    assert route_pattern("/api", p, "/api/users/123", "GET") == "/api/users/{user_id}"
    assert route_pattern("/api", p, "/api/users/123", "POST") == "/api/users/{user_id}"
    assert route_pattern("/api", p, "/api/items/abc/details", "GET") == "/api/items/{item_id}/details"
    assert route_pattern("/api", p, "/api/", "GET") == "/api/"
    assert route_pattern("/api", p, "/api", "GET") == "/api"  # (Serve's too: "" matches no route, its redirect "")
    assert route_pattern("/", p, "/users/7", "GET") == "/users/{user_id}"
    assert route_pattern("/api", p, "/api/static/deep", "GET") == "/api/static/deep"


def test_a_slash_too_many_or_missing_matches_as_starlette_redirects_it():
    p = route_patterns(_app())
    assert route_pattern("/api", p, "/api/users/123/", "GET") == "/api/users/{user_id}/"


def test_no_match_or_no_patterns_is_the_prefix():
    p = route_patterns(_app())
    assert route_pattern("/api", p, "/api/admin/settings", "GET") == "/api"
    assert route_pattern("/api", p, "/api/users/123", "DELETE") == "/api"  # (a method it does not take)
    assert route_pattern("/api", (), "/api/users/123", "GET") == "/api"


def test_an_ingress_class_carries_its_apps_patterns_and_a_plain_one_none():
    app = _app()

    @serve.ingress(app)
    class Api:
        pass

    class Plain:
        def __call__(self) -> str:
            return "x"
    assert reachable(Api).routes == route_patterns(app) and reachable(Api).asgi
    assert reachable(Plain).routes == ()
