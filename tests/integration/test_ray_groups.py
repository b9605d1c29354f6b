"""Collective groups on Ray (issue 67; local Ray, CPU, gloo): a data-parallel deployment whose
replicas all-reduce in a loop of their own. A member killed: its replacement joins on its rank and
the survivors re-form in place (same processes); a downscale re-forms at the smaller world, an
upscale at the larger one; the controller killed between a member's death and the re-form: the
recovered one re-forms the group. Every all-reduce after a re-form is right."""

from __future__ import annotations

import threading

import pytest
import ray

from examples.ray.data_parallel_group import DataParallel
from executors.ray_gpu import deployment, get_controller, run
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from executors.ray_gpu.replica.collective import GroupReforming
from tests.integration.waiting import reformed

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


class Trickle:
    """A call needing the group every 50 ms (``step_now``), from a thread, each bounded by 10 s."""

    def __init__(self, h) -> None:
        self.answers: list[float] = []
        self.errors: list[BaseException] = []
        self.hung = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(h,), daemon=True)
        self._thread.start()

    def _run(self, h) -> None:
        while not self._stop.is_set():
            try:
                self.answers.append(h.step_now.remote().result(timeout=10))
            except TimeoutError:
                self.hung += 1
            except Exception as exc:  # (the refusal, or the call a dying replica had)
                if "GroupReforming" in repr(exc) or "re-forming" in str(exc):
                    exc = GroupReforming(str(exc))
                self.errors.append(exc)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def deploy(n: int, **options):
    """The data-parallel example as deployment ``dp`` of ``n`` replicas, one collective group."""
    return run(deployment(DataParallel, name="dp", num_replicas=n, collective_group=True, ray_actor_options=OPTS,
                          **options).bind())


def kill(rid: str) -> None:
    ray.kill(ray.get_actor(actor_name("dp", rid), namespace=NAMESPACE), no_restart=True)


def test_a_data_parallel_group_re_forms_in_place_after_a_crash_a_downscale_and_an_upscale():
    ctl = get_controller()
    h = deploy(4)
    first = reformed(h, 4)
    epoch = first[0]["last"][0]
    assert all(r["group"][:3] == (epoch, k, 4) for k, r in first.items())
    (address,) = {r["address"] for r in first.values()}  # (one rendezvous, rank 0's store)
    assert address.rpartition(":")[2].isdigit()

    # a member killed under load: its replacement joins on rank 2, the three survivors re-form in the same
    # processes; every call that needed the group meanwhile was answered right or refused clearly
    calls = Trickle(h)
    kill(first[2]["rid"])
    after = reformed(h, 4, above=epoch)
    calls.stop()
    assert calls.answers and set(calls.answers) == {10.0}, calls.answers  # 0 wrong results
    assert not calls.hung and {type(e).__name__ for e in calls.errors} <= {"GroupReforming", "ReplicaDied",
                                                                         "RayActorError", "ActorDiedError"}
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
    h = deploy(3)
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


def test_a_member_that_cannot_follow_a_rank_move_is_restarted_and_joins():
    """``rank_moves="restart"``: a downscale that moves rank 3's holder to rank 1 stops it and starts a
    new replica there (a new process); the others re-form in place at world 3."""
    ctl = get_controller()
    h = deploy(4, rank_moves="restart")
    first = reformed(h, 4)
    ask(ctl, "scale", "dp", 3, (first[1]["rid"],))
    down = reformed(h, 3, above=first[0]["last"][0])
    assert (down[0]["pid"], down[2]["pid"]) == (first[0]["pid"], first[2]["pid"])  # in place
    assert down[1]["pid"] not in {r["pid"] for r in first.values()}  # rank 3's holder restarted on rank 1
    assert down[0]["group"][3] and down[2]["group"][3] and not down[1]["group"][3]

