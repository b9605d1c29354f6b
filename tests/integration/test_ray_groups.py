"""Collective groups on Ray (issue 67; local Ray, CPU, gloo): a data-parallel deployment whose
replicas all-reduce in a loop of their own. A member killed: its replacement joins on its rank and
the survivors re-form in place (same processes); a downscale re-forms at the smaller world, an
upscale at the larger one; the controller killed between a member's death and the re-form: the
recovered one re-forms the group. Every all-reduce after a re-form is right."""

from __future__ import annotations

import pytest
import ray

from examples.ray.data_parallel_group import DataParallel
from executors.ray_gpu import deployment, get_controller, run
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


def settled(h, world: int) -> dict[int, dict] | None:
    """The replicas by rank once ``world`` of them all-reduced right in one epoch; else None."""
    got = {r["rank"]: r for r in h.broadcast(timeout=10).values()}
    lasts = {r["last"] for r in got.values()}
    if sorted(got) != list(range(world)) or len(lasts) != 1:
        return None
    (last,) = lasts
    if last is None or last[1] != world or last[2] != world * (world + 1) / 2:
        return None
    return got


def reformed(h, world: int, above: int = 0, timeout: float = 90.0) -> dict[int, dict]:
    """``settled`` at an epoch above ``above``, waiting up to ``timeout`` s (what it saw last, if not)."""
    seen: list = [None]

    def done() -> bool:
        try:
            got = settled(h, world)
        except Exception as exc:  # (a member dying under the call)
            seen[0] = exc
            return False
        seen[0] = got
        return got is not None and got[0]["last"][0] > above

    assert wait_for(done, timeout=timeout, every=0.2), f"not re-formed at world {world} above epoch {above}: {seen[0]}"
    return seen[0]


def kill(rid: str) -> None:
    ray.kill(ray.get_actor(actor_name("dp", rid), namespace=NAMESPACE), no_restart=True)


def test_a_data_parallel_group_re_forms_in_place_after_a_crash_a_downscale_and_an_upscale():
    ctl = get_controller()
    h = run(deployment(DataParallel, name="dp", num_replicas=4, collective_group=True,
                       ray_actor_options=OPTS).bind())
    first = reformed(h, 4)
    epoch = first[0]["last"][0]
    assert all(r["group"][:3] == (epoch, k, 4) for k, r in first.items())

    # a member killed: its replacement joins on rank 2, the three survivors re-form in the same processes
    kill(first[2]["rid"])
    after = reformed(h, 4, above=epoch)
    assert after[2]["rid"] != first[2]["rid"]
    assert {k: after[k]["pid"] for k in (0, 1, 3)} == {k: first[k]["pid"] for k in (0, 1, 3)}
    assert all(after[k]["group"][3] for k in (0, 1, 3)) and not after[2]["group"][3]  # in place / joined
    epoch = after[0]["last"][0]

    # a downscale 4 -> 3 (rank 1 stopped, rank 3 moved down): re-formed at world 3, nobody restarted
    ask(ctl, "scale", "dp", 3, (after[1]["rid"],))
    down = reformed(h, 3, above=epoch)
    assert {r["pid"] for r in down.values()} == {after[k]["pid"] for k in (0, 2, 3)}
    epoch = down[0]["last"][0]

    # an upscale 3 -> 5: the survivors keep their processes, the group re-forms once the new ones run
    ask(ctl, "scale", "dp", 5, ())
    up = reformed(h, 5, above=epoch)
    assert {r["pid"] for r in down.values()} <= {r["pid"] for r in up.values()}
    assert h.step_now.remote().result() == 15.0


def test_the_controller_killed_before_a_re_form_leaves_every_member_on_one_newest_epoch():
    ctl = get_controller()
    h = run(deployment(DataParallel, name="dp", num_replicas=3, collective_group=True,
                       ray_actor_options=OPTS).bind())
    first = reformed(h, 3)
    epoch = first[0]["last"][0]
    kill(first[1]["rid"])
    ray.kill(ctl, no_restart=False)  # (the controller restarts and recovers from the replicas' reports)
    after = reformed(h, 3, above=epoch, timeout=120)
    assert {after[k]["pid"] for k in (0, 2)} == {first[k]["pid"] for k in (0, 2)}
    assert len({r["group"][0] for r in after.values()}) == 1  # one epoch, every member on it


def test_the_example_runs_and_re_forms_after_a_kill(capsys):
    from examples.ray import data_parallel_group

    after = data_parallel_group.main()
    assert sorted(after) == [0, 1, 2, 3] and {r["last"][2] for r in after.values()} == {10.0}
    assert "re-formed at epoch" in capsys.readouterr().out
