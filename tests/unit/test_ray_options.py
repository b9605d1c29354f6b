"""Bad options of the Ray executor's ``@deployment`` / ``.options()`` /
``handle.scale()`` fail where they are written, with the core's own rules and
its typed error (``rankcore.InvalidConfig`` naming the option and the value),
not later inside ``run()``. No Ray cluster is needed."""

from __future__ import annotations

import threading

import pytest

import rankcore as rc
from executors.ray_gpu import deployment
from executors.ray_gpu.api.deployments import DeploymentHandle


class Model:
    def __call__(self):
        return 1


@pytest.mark.parametrize("options, words", [
    ({"num_replicas": -1}, "num_replicas must be a non-negative int, got -1"),
    ({"num_replicas": "4"}, "num_replicas must be a non-negative int, got '4'"),
    ({"num_replicas": 2.0}, "num_replicas must be a non-negative int, got 2.0"),
    ({"num_replicas": True}, "num_replicas must be a non-negative int, got True"),
    ({"num_replicas": 200_000}, "num_replicas=200000 is above max_replicas=100000"),
    ({"num_replicas": 5, "max_replicas": 4}, "num_replicas=5 is above max_replicas=4"),
    ({"max_replicas": 0}, "max_replicas must be a positive int, got 0"),
    ({"name": ""}, "name must be a non-empty str, got ''"),
    ({"name": 7}, "name must be a non-empty str, got 7"),
    ({"user_config": threading.Lock()}, "user_config cannot be serialised"),
    ({"user_config": {"f": lambda: 1}}, "user_config must equal a pickled copy of itself"),
    ({"max_ongoing_requests": 0}, "max_ongoing_requests must be an int >= 1"),
    ({"max_ongoing_requests": "8"}, "max_ongoing_requests must be an int >= 1, got '8'"),
    ({"ray_actor_options": [("num_gpus", 1)]}, "ray_actor_options must be a dict"),
    ({"ray_actor_options": {"num_gpus": "1"}}, "ray_actor_options['num_gpus'] must be a number >= 0, got '1'"),
    ({"ray_actor_options": {"max_restarts": 3}}, "ray_actor_options may not set 'max_restarts'"),
    ({"ray_actor_options": {"name": "x"}}, "ray_actor_options may not set 'name'"),
    ({"ray_actor_options": {"runtime_env": "conda"}}, "ray_actor_options: The type of keyword 'runtime_env'"),
    ({"ray_actor_options": {"resources": {"GPU": 1}}}, "ray_actor_options: Use the 'num_cpus' and 'num_gpus'"),
    ({"ray_actor_options": {"scheduling_strategy": "SPREAD"}}, "may not set scheduling_strategy"),
    ({"replica_placement": "everywhere"}, "replica_placement must be one of spread, pack, rank_packed, got 'everywhere'"),
    ({"placement_group_bundles": []}, "placement_group_bundles must be a non-empty list"),
])
def test_bad_options_fail_at_the_decorator_and_at_options(options, words):
    with pytest.raises(rc.InvalidConfig) as exc:
        deployment(**options)(Model)
    assert words in str(exc.value)
    if "name" not in options:
        assert str(exc.value).startswith("@deployment(...): ")  # where it was written: no class (no name) yet
        with pytest.raises(rc.InvalidConfig) as exc:  # with a name given, the error names the deployment
            deployment(name="llm", **options)(Model)
        assert words in str(exc.value) and str(exc.value).startswith("deployment 'llm': ")
    with pytest.raises(rc.InvalidConfig) as exc:  # .options() checks the same way
        deployment(Model).options(**options)
    assert words in str(exc.value)
    assert str(exc.value).startswith("deployment 'Model': " if "name" not in options else "deployment ")


@pytest.mark.parametrize("options", [{"ray_actor_options": [("num_gpus", 1)]},
                                     {"ray_actor_options": {"num_gpus": "1"}},
                                     {"ray_actor_options": {"runtime_env": "conda"}}, {"is_xlang": True}])
def test_a_wrong_type_or_an_unknown_option_is_a_type_error_too_wherever_it_is_written(options):
    """As Ray Serve's decorator raises TypeError for these (a ported ``except TypeError`` still catches them),
    and still ``rankcore.InvalidConfig``: with no class yet, with a name, and through ``.options()``."""
    for make in (lambda: deployment(**options), lambda: deployment(name="llm", **options)(Model)):
        with pytest.raises(TypeError) as exc:
            make()
        assert isinstance(exc.value, rc.InvalidConfig)
    if "is_xlang" not in options:
        with pytest.raises(TypeError):
            deployment(Model).options(**options)
    with pytest.raises(rc.InvalidConfig) as bad:  # (a bad value is no TypeError)
        deployment(ray_actor_options={"num_gpus": -1})
    assert not isinstance(bad.value, TypeError)


def test_the_decorator_with_arguments_checks_before_it_gets_the_class():
    with pytest.raises(rc.InvalidConfig, match="num_replicas must be a non-negative int, got -1"):
        deployment(num_replicas=-1)  # (no class yet)
    with pytest.raises(rc.InvalidConfig, match="takes a class"):
        deployment(lambda: 1)


def test_good_options_pass_and_keep_their_values():
    d = deployment(num_replicas=3, user_config={"m": [1, 2.5, "x", None]}, max_ongoing_requests=8,
                   ray_actor_options={"num_cpus": 0.5, "num_gpus": 1, "resources": {"accel": 1},
                                      "runtime_env": {"env_vars": {"A": "1"}}}, max_replicas=10)(Model)
    assert (d.name, d.num_replicas, d.max_replicas, d.max_ongoing_requests) == ("Model", 3, 10, 8)
    assert d.options(num_replicas=10).num_replicas == 10
    with pytest.raises(rc.InvalidConfig, match="num_replicas=11 is above max_replicas=10"):
        d.options(num_replicas=11)
    with pytest.raises(rc.InvalidConfig, match="does not take num_replica"):
        d.options(num_replica=2)  # a typo is not silently ignored


@pytest.mark.parametrize("n, words", [
    (-1, "must be a non-negative int, got -1"),
    ("4", "must be a non-negative int, got '4'"),
    (None, "must be a non-negative int, got None"),
])
def test_handle_scale_with_a_bad_count_raises_at_the_call(n, words):
    handle = DeploymentHandle("llm", controller=None)  # never reached: the count is checked first
    with pytest.raises(rc.InvalidConfig) as exc:
        handle.scale(n)
    assert words in str(exc.value) and "handle.scale" in str(exc.value)
    with pytest.raises(rc.InvalidConfig, match="names a replica twice"):
        handle.scale(1, victims=["llm#0", "llm#0"])


def test_options_takes_autoscaling_config_as_the_decorator_does():
    class M:
        pass

    fixed = deployment(M, num_replicas=2)
    auto = fixed.options(autoscaling_config={"min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 1.0})
    assert (auto.num_replicas, auto.max_replicas) == (1, 3)
    assert auto.core_options == {"autoscaling": True, "min_replicas": 1, "upscale_delay_s": 1.0}
    assert fixed.options(num_replicas="auto").max_replicas == 100  # (Ray Serve's num_replicas="auto")
    with pytest.raises(rc.InvalidConfig, match="unknown key"):
        fixed.options(autoscaling_config={"smoothing_factor": 1.0})
    with pytest.raises(rc.InvalidConfig, match="do not mix"):
        fixed.options(num_replicas=3, autoscaling_config={"min_replicas": 1})
    assert fixed.core_options == {} and fixed.options(num_replicas=5).num_replicas == 5  # (the original unchanged)
