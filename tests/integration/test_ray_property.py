"""The property suite's timeline machine, run against the Ray executor: random
deploy / scale / update_config / crash / controller-crash timelines on real
replica actors, every snapshot checked, healthy and contiguous after settling,
each replica's own context agreeing with the core (a few short examples: each
step is real Ray work)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from executors.ray_gpu.api import ask, get_controller
from executors.ray_gpu.subject import RaySubject
from rankcore.testing import make_timeline_machine

pytestmark = pytest.mark.usefixtures("local_ray")


def test_random_timelines_on_ray():
    machine = make_timeline_machine(RaySubject, max_replicas=4)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=5, stateful_step_count=8, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck)))
    assert ask(get_controller(), "state_errors") == []
