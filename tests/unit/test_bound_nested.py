"""A bound deployment anywhere in ``bind()``'s arguments is deployed and replaced by its handle, as
Serve's ``_PyObjScanner`` finds them (``api.deployments.map_bound``): in lists, tuples, dicts and the
user's own objects; ``Application.graph`` lists them. No Ray: ``map_bound`` is given the replacement."""

from __future__ import annotations

import threading

from executors.ray_gpu import serve
from executors.ray_gpu.api.deployments import map_bound


@serve.deployment(name="nested_f")
class F:
    def __call__(self) -> str:
        return "f"


@serve.deployment(name="nested_g")
class G:
    def __call__(self) -> str:
        return "g"


class Wrapper:
    """The user's own object holding a bound deployment (Serve's ``HandleWrapper``)."""

    def __init__(self, inner: object, more: object = None) -> None:
        self.inner, self.more = inner, more


def _name(app: object) -> str:
    return f"handle:{app.deployment.name}"  # type: ignore[attr-defined]


def test_each_bound_deployment_at_any_depth_is_replaced():
    f, g = F.bind(), G.bind()
    assert map_bound(f, _name) == "handle:nested_f"
    assert map_bound([1, (f, {"g": g})], _name) == [1, ("handle:nested_f", {"g": "handle:nested_g"})]
    w = map_bound(Wrapper(f, [Wrapper(g)]), _name)
    assert type(w) is Wrapper and w.inner == "handle:nested_f" and w.more[0].inner == "handle:nested_g"


def test_what_holds_none_is_returned_itself_not_a_copy():
    for x in ([1, "a"], {"k": (2, 3)}, Wrapper(5), Wrapper(threading.Lock())):  # (the last one does not pickle)
        assert map_bound(x, _name) is x


def test_the_graph_lists_deployments_bound_inside_objects_ingress_first():
    @serve.deployment(name="nested_driver")
    class Driver:
        def __init__(self, wrapper: Wrapper, handles: dict) -> None:
            self.wrapper, self.handles = wrapper, handles

    app = Driver.bind(Wrapper(F.bind()), {"g": [G.bind()]})
    assert [d.name for d in app.graph()] == ["nested_driver", "nested_f", "nested_g"]
