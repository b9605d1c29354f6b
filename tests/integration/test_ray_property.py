"""The property suite's timeline machine, run against the Ray executor: random
deploy / scale / update_config / crash / controller-crash timelines on real
replica actors, every snapshot checked, healthy and contiguous after settling,
each replica's own context agreeing with the core, and the whole trace passing
``check-trace`` (no rejected event, no replica gone unexplained).

It explores: every run draws new timelines (not derandomised), up to
``EXAMPLES`` of them in batches of ``BATCH``, and stops starting batches once
``BUDGET_S`` seconds are spent (each step is real Ray work: ~5 s an example
here). Each batch's seed is printed, and named in the failure; replay one with
``RANKCORE_RAY_PROPERTY_SEED=<seed>`` (or pytest's ``--hypothesis-seed``).
Failing examples are not shrunk (each replay costs seconds of Ray work):
hypothesis prints the failing steps as they ran.
"""

from __future__ import annotations

import os
import random
import time

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from executors.ray_gpu.api.deployments import ask, get_controller
from executors.ray_gpu.subject import RaySubject
from rankcore.testing import make_timeline_machine

pytestmark = pytest.mark.usefixtures("local_ray")

EXAMPLES = 9
BATCH = 3
BUDGET_S = 120.0
STEPS = 8


def test_random_timelines_on_ray():
    machine = make_timeline_machine(RaySubject, max_replicas=4)
    fixed = os.environ.get("RANKCORE_RAY_PROPERTY_SEED")
    forced = hypothesis.core.global_force_seed  # pytest --hypothesis-seed
    t0 = time.monotonic()
    ran = 0
    # a seed given: one batch (the same seed twice would replay the same timelines); the
    # environment's replays exactly a printed batch, pytest's --hypothesis-seed runs them all
    batch = BATCH if fixed else EXAMPLES if forced is not None else BATCH
    while ran < EXAMPLES and time.monotonic() - t0 < BUDGET_S:
        seed = int(fixed) if fixed else forced if forced is not None else random.SystemRandom().randrange(2**32)
        print(f"Ray property batch: seed {seed}, {batch} examples")
        try:
            run_state_machine_as_test(hypothesis.seed(seed)(machine), settings=settings(
                max_examples=batch, stateful_step_count=STEPS, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck)))
        except BaseException as exc:
            exc.add_note(f"Ray property run: seed {seed}; replay with RANKCORE_RAY_PROPERTY_SEED={seed}")
            raise
        ran += batch
        if fixed or forced is not None:
            break
    print(f"Ray property run: {ran} examples in {time.monotonic() - t0:.0f}s")
    assert ran >= BATCH
    assert ask(get_controller(), "state_errors") == []
