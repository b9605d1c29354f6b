"""The deployment's options, declared once (rankcore/base/options.py): every surface reads their
names, defaults and checks from there, and refuses an unknown one by name."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import attrs
import pytest

import rankcore as rc
from executors.ray_gpu import deployment
from executors.ray_gpu.api.deployments import CORE_OPTIONS, Deployment
from executors.scenarios.format import ScenarioError, parse_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import options_table

OPT = rc.options
#: a value other than the default, for each option (a new option needs one here)
OTHER = {
    "resources": (("GPU", 2.0),), "placement": "pack", "placement_timeout_s": 3.0, "start_timeout_s": 7.0,
    "restart_backoff_s": 2.0, "restart_backoff_max_s": 8.0, "max_constructor_retry_count": 4,
    "health_check_period_s": 1.5, "health_check_timeout_s": 4.0, "health_check_failure_threshold": 5,
    "force_stop_unhealthy_replicas": True,
    "graceful_shutdown_wait_loop_s": 0.5, "graceful_shutdown_timeout_s": 6.0,
    "static_placement": rc.StaticPlacement.from_mapping("pg", ["n0", "n1"], {0: [0], 1: [1]}),
    "gang_size": 2, "gang_placement": "spread", "gang_failure": "restart_replica", "collective_group": True, "rank_moves": "restart",
    "spare_processes": 1,
    "model_bytes": 1 << 30, "multiplexed_bytes": 1 << 28, "dedicated": True, "min_deployment_time_s": 60.0,
    "max_ongoing_requests": 2, "max_queued_requests": 100, "max_retries": 0,
    "request_router": "consistent_hash", "request_router_kwargs": (("block_chars", 8),),
    "autoscaling": True, "min_replicas": 0, "initial_replicas": 3, "target_ongoing_requests": 4.0,
    "upscale_delay_s": 5.0, "downscale_delay_s": 60.0, "downscale_to_zero_delay_s": 120.0, "upscaling_factor": 2.0,
    "downscaling_factor": 0.5, "metrics_interval_s": 2.0, "look_back_period_s": 10.0, "aggregation_function": "max",
    "burst": True, "policy": "replica_queue_length_autoscaling_policy",
    "version": "v2", "max_unavailable": 3, "max_surge": 2, "update_mode": "blue_green",
}


#: how a scenario file writes a value of OTHER whose str() is no YAML (keywords: a mapping)
YAML = {"request_router_kwargs": "{block_chars: 8}"}

#: what an option needs beside it to be valid (multiplexed_bytes is booked with model_bytes)
WITH: dict[str, dict] = {"multiplexed_bytes": {"model_bytes": 1 << 30}}


class Model:
    def __call__(self) -> int:
        return 1


def scenario(deployment_yaml: str, top: str = "") -> rc.DeploymentApplied:
    text = (f"name: t\nduration: 100\ncluster: {{nodes: [{{name: n0, gpus: 4}}, {{name: n1, gpus: 4}}]}}\n{top}"
            f"timeline: []\ndeployments:\n  llm:\n{deployment_yaml}")
    return parse_scenario(text).deployments["llm"].applied()


def test_the_table_covers_every_option_once_and_names_are_flat_and_unique() -> None:
    assert tuple(OPT.LEAVES) == OPT.OPTION_NAMES == tuple(OTHER)
    for name, group in OPT.LEAVES.items():
        assert name in attrs.fields_dict(type(getattr(OPT.DEFAULTS, group)))
        assert OPT.leaf_doc(name).strip()
    assert set(OPT.OPTION_NAMES).isdisjoint(a.name for a in attrs.fields(rc.DeploymentApplied))


@pytest.mark.parametrize("name", OPT.OPTION_NAMES)
def test_each_option_reads_the_same_nested_and_flat_on_every_record(name: str) -> None:
    n = 2 if name in ("gang_size", "static_placement") else 4
    e = rc.DeploymentApplied(name="llm", num_replicas=n, **WITH.get(name, {}), **{name: OTHER[name]})
    group = OPT.LEAVES[name]
    assert getattr(getattr(e.config, group), name) == getattr(e.config, name) == getattr(e, name) == OTHER[name]
    assert e.config.changed() == {**WITH.get(name, {}), name: OTHER[name]}
    dep = rc.Deployment.applied(e)
    assert dep.config == e.config
    assert (dep.static if name == "static_placement" else getattr(dep, name)) == OTHER[name]
    assert dep.spec() == e and rc.DeploymentApplied(**e.flat()) == e
    assert eval(repr(e), {"DeploymentApplied": rc.DeploymentApplied, "StaticPlacement": rc.StaticPlacement}) == e
    assert attrs.evolve(e, num_replicas=0).config == e.config  # flat and nested keywords compose
    assert attrs.evolve(rc.DeploymentApplied(name="llm", num_replicas=n, **WITH.get(name, {})),
                        **{name: OTHER[name]}) == e


def test_a_changed_static_placement_is_the_deployments_live_one_in_its_spec() -> None:
    static = OTHER["static_placement"]
    dep = rc.Deployment.applied(rc.DeploymentApplied(name="llm", num_replicas=2, static_placement=static))
    moved = attrs.evolve(dep, static=static.lose("n1"))
    assert moved.spec().static_placement == static.lose("n1") and moved.config.static_placement == static


def test_the_core_keeps_the_options_a_new_deployment_applied_gives() -> None:
    # (a live deployment keeps its static mapping, gang size and model size: refused below, elsewhere;
    # blue-green and autoscaling do not mix: refused in test_rollouts_bluegreen)
    state = rc.step(rc.State(), rc.DeploymentApplied(name="llm", num_replicas=1)).state
    changed = {k: v for k, v in OTHER.items()
               if k not in ("static_placement", "gang_size", "resources", "model_bytes", "multiplexed_bytes",
                            "update_mode")}
    state = rc.step(state, rc.DeploymentApplied(name="llm", num_replicas=1, **changed)).state
    dep = state.deployment("llm")
    assert dep.config.changed() == changed and dep.options is dep.config


# ------------------------------------------------------------------ defaults on every surface
def test_the_decorator_takes_as_is_options_by_name_and_spells_the_rest_with_the_same_default() -> None:
    assert set(CORE_OPTIONS) == set(OPT.as_is("ray"))
    params = inspect.signature(deployment).parameters
    fields = attrs.fields_dict(Deployment)
    d = deployment(Model)
    assert d.core_options == {}  # nothing given: the core's defaults
    for name in OPT.OPTION_NAMES:
        spelt = OPT.spelling(name, "ray")
        if spelt is None:
            value, also = OTHER[name], WITH.get(name, {})
            assert deployment(**also, **{name: value})(Model).core_options == {**also, name: value}
            assert d.options(**also, **{name: value}).core_options == {**also, name: value}
            assert name not in params  # (taken by **core_options, checked against CORE_OPTIONS)
            continue
        assert spelt.key in params, f"@deployment has no keyword {spelt.key!r} for the option {name}"
        if spelt.default is None:  # the surface keeps the config's default
            default = getattr(OPT.DEFAULTS, name)
            assert params[spelt.key].default == default, name
            assert fields[spelt.key].default == default, name


def test_a_scenario_takes_as_is_options_by_name_and_spells_the_rest_with_the_same_default() -> None:
    plain = scenario("    replicas: 1\n")
    for name in OPT.OPTION_NAMES:
        spelt = OPT.spelling(name, "scenario")
        if spelt is None:
            assert getattr(plain, name) == getattr(OPT.DEFAULTS, name), name
            value = OTHER[name]
            fixed = "" if name == "autoscaling" else "    replicas: 1\n"  # (autoscaled: no fixed count)
            fixed += "".join(f"    {k}: {v}\n" for k, v in WITH.get(name, {}).items())
            assert getattr(scenario(f"{fixed}    {name}: {YAML.get(name, value)}\n"), name) == value
        elif spelt.default is None:
            assert getattr(plain, name) == getattr(OPT.DEFAULTS, name), name
    assert plain.resources == (("GPU", 1.0),) and plain.start_timeout_s == 300.0  # their own defaults (docs)
    spelt = scenario("    replicas: 2\n    gpus: 2\n    placement: pack\n    gang: {size: 2, placement: spread, "
                     "failure: restart_replica}\n", top="faults: {start_timeout: 7}\n")
    assert {k: getattr(spelt, k) for k in ("resources", "placement", "gang_size", "gang_placement",
                                           "gang_failure", "start_timeout_s")} == \
        {k: OTHER[k] for k in ("resources", "placement", "gang_size", "gang_placement", "gang_failure",
                               "start_timeout_s")}


def test_the_docs_tables_are_generated_from_the_declaration() -> None:
    assert options_table.stale() == [], "run: .venv/bin/python tools/options_table.py --write"
    for surface in OPT.SURFACES:
        text = options_table.table(surface)
        for name in OPT.OPTION_NAMES:
            spelt = OPT.spelling(name, surface)
            assert f"`{spelt.key if spelt else name}`" in text


# ------------------------------------------------------------------ an unknown option, everywhere
def test_an_unknown_option_is_refused_naming_it_and_listing_the_options_on_every_surface() -> None:
    with pytest.raises(rc.InvalidConfig, match=r"DeploymentApplied\('llm'\): unknown option\(s\) gang_sise "
                                               r"\(options: resources, placement, .*spare_processes, model_bytes, multiplexed_bytes, dedicated, "
                                               r"min_deployment_time_s, "
                                               r"max_ongoing_requests, max_queued_requests, max_retries, request_router, request_router_kwargs, autoscaling, .*, policy, version, max_unavailable, max_surge, update_mode\)"):
        rc.DeploymentApplied(name="llm", num_replicas=2, gang_sise=2)
    with pytest.raises(rc.InvalidConfig, match=r"unknown option\(s\) gang_sise"):
        OPT.DeploymentConfig.of({"gang_sise": 2})
    with pytest.raises(rc.InvalidConfig, match=r"@deployment\(\.\.\.\): unknown option\(s\) health_check_perod_s"):
        deployment(health_check_perod_s=1.0)
    with pytest.raises(rc.InvalidConfig, match=r"deployment 'Model': .*does not take health_check_perod_s"):
        deployment(Model).options(health_check_perod_s=1.0)
    with pytest.raises(ScenarioError, match="health_check_perod_s"):
        scenario("    replicas: 1\n    health_check_perod_s: 1\n")


@pytest.mark.parametrize("name, value, words", [
    ("health_check_period_s", 0, "health_check_period_s must be > 0"),
    ("gang_placement", "ring", "gang_placement must be one of pack, spread, got 'ring'"),
    ("restart_backoff_max_s", 0.5, "restart_backoff_max_s=0.5 is below restart_backoff_s=1.0"),
    ("static_placement", {"group": "pg"}, "static_placement must be a rankcore.StaticPlacement, got dict"),
])
def test_a_bad_value_names_the_deployment_and_the_option(name: str, value: object, words: str) -> None:
    with pytest.raises(rc.InvalidConfig) as exc:
        rc.DeploymentApplied(name="llm", num_replicas=1, **{name: value})
    assert str(exc.value).startswith(f"DeploymentApplied('llm').{name}") and words in str(exc.value)
    with pytest.raises(rc.InvalidConfig, match=f"^DeploymentConfig.{name}"):  # built directly: its own name
        OPT.DeploymentConfig.of({name: value})
