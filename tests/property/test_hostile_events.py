"""Hostile input against the core and the request plane (issue 40, "Hostile input on every surface").

A hypothesis campaign mixing valid events with malformed, duplicated, reordered and stale ones,
over every module added since the first machine: requests, autoscaling metrics, tiers, weights,
spares, deletion (and proxies, gangs, static placement, multiplexed models). The contract
(``tests/hostile.py``, ``attempt``):

* ``rankcore.step(state, event)`` applies the event (every invariant then holds:
  ``check_state``, ``check_step(full=True)``) or raises a ``RankcoreError`` subclass (never
  ``InvariantViolation``) whose message names the field or the unknown replica / deployment /
  node; anything else it raises fails the test;
* the caller's state is never changed (every field of it, compared before and after, including
  when the step raised), nor are older states (a step on one of them, in the reordered rule);
* malformed events are built *without* their validators (``forge``: what pickle or a
  hand-made record gives), so the core's own boundary is tested, not only the constructors;
  the constructors are tested too: they build or raise ``InvalidConfig`` naming the field, and
  what they build the core's boundary takes;
* the request machine, the batcher and the model cache: hostile input either applies (then
  the machine still answers every read, loses nothing, and drains) or raises a
  ``RankcoreError`` naming the field, and leaves the machine as it was.

The stateful machines are ``rankcore.testing.make_machine``'s (so the states reached hold
gangs, static placement, autoscaling, rollouts, deletions, spares, weights pushes, GPU memory,
proxies) with hostile rules added; hostile events the core takes are adopted, so the valid
rules go on from the states they leave. The events tried are tallied (printed at the end of
this module; ``benchmarks/bench_hostile.py`` prints the same for a larger run).
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import rankcore as rc
import rankcore.requests as rq
from rankcore.base import events as ev
from rankcore.base.errors import InvalidConfig, InvalidEvent, RankcoreError
from rankcore.base.fields import check_record, shown
from rankcore.base.options import LEAVES
from rankcore.base.state import State
from rankcore.testing import CoreSubject, make_machine
from tests.hostile import (
    NOT_EVENTS,
    TALLY,
    NastyError,
    ReadySubclass,
    attempt,
    batcher_probe,
    batcher_view,
    cache_view,
    check_refusal,
    deep_view,
    extreme_events,
    forge,
    hostile_values,
    ids_of,
    malformed,
    names_what,
    not_events,
    not_request_events,
    recovery_of,
    request_probe,
    request_view,
    rich_states,
    scalars,
    stale_events,
    templates,
)
from tests.property.test_batcher import BatcherProps
from tests.property.test_model_cache import ModelCacheProps
from tests.property.test_requests import DEPS, RequestMachineProps

#: the sizes (CI runs the whole suite: this module stays within ~30 s on two cores)
MACHINE = settings(max_examples=60, stateful_step_count=30, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], print_blob=True)
GIVEN = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)


@pytest.fixture(scope="module", autouse=True)
def _report_tally(request: pytest.FixtureRequest) -> Any:
    """Print what was tried (issue 40: "Report events tried") once this module has run."""
    TALLY.clear()
    yield
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if reporter is None or capture is None or not TALLY.total():
        return  # (an xdist worker has no terminal)
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line("hostile events (tests/property/test_hostile_events.py):")
        for line in TALLY.lines(detail=False):
            reporter.write_line(line)


#: the largest clock a hostile event the core took may leave the machines at (about 31,700 years
#: of seconds: a float still counts milliseconds there)
SANE_CLOCK = 1e12


def _repr_ok(event: object) -> bool:
    """Whether ``repr(event)`` works (the machines' notes print every event they apply)."""
    try:
        repr(event)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- the core, stateful


def with_hostile_rules(base: Any) -> Any:
    """``base`` (a ``make_machine`` class) with hostile rules: malformed events (every type, its
    fields, nested records, tuple elements), the recovery event malformed on a fresh controller,
    duplicates of events already applied, two consecutive events replayed in the other order on
    the state before them, stale news, events with extreme values, things that are no event."""

    class Hostile(base):
        def __init__(self) -> None:
            super().__init__()
            self.history: list[tuple[State, object, State]] = []  # (before, event, after), the last few
            self.adopting: str | None = None

        def apply(self, event: object) -> Any:
            before = self.state
            result = super().apply(event)
            if self.adopting is None:
                TALLY.applied("valid", event)
            self.history.append((before, event, self.state))
            del self.history[:-12]
            return result

        def recover(self, event: Any) -> None:
            self.history.clear()  # (a new controller: the states before are another's)
            super().recover(event)

        def adopt(self, event: object, kind: str, result: Any) -> None:
            """A hostile event the core took: the machine goes on from the state it left. Not one
            moving the clock beyond ``SANE_CLOCK`` (there a timeout no longer moves a float, every
            deadline is due at once, and the valid rules' own expectations stop holding), one
            naming ids the valid rules cannot look for as printed, nor one making an unmanaged
            core managed (the valid rules of an unmanaged machine place anywhere); each was still
            checked against the contract."""
            now = getattr(event, "now", None)
            if not _repr_ok(event) or (now is not None and now > SANE_CLOCK) or not all(
                    i.isprintable() for i in ids_of(event)) or (
                    result.state.cluster.managed != self.state.cluster.managed):
                return
            self.adopting = kind
            try:
                self.apply(event)
            finally:
                self.adopting = None

        @rule(data=st.data())
        def malformed_event(self, data: st.DataObject) -> None:
            pool = templates(self.state) + [e for _, e, _ in self.history if not isinstance(e, ev.ControllerRecovered)]
            event = data.draw(st.sampled_from(pool), label="event to malform")
            bad, path = malformed(data, event)
            result = attempt(self.state, bad, "malformed", path)
            if result is not None and data.draw(st.booleans(), label="adopt"):
                self.adopt(bad, "malformed", result)

        @precondition(lambda self: len(self.state.deployments) > 0)
        @rule(data=st.data())
        def malformed_recovery(self, data: st.DataObject) -> None:
            """A restarted controller told a malformed recovery (reports, specs, nodes, copies)."""
            bad, path = malformed(data, recovery_of(self.state))
            attempt(State(), bad, "malformed-recovery", path)

        @precondition(lambda self: self.history)
        @rule(data=st.data())
        def duplicate(self, data: st.DataObject) -> None:
            """An event applied before, delivered again now (at-least-once delivery, late)."""
            _, event, _ = self.history[data.draw(st.integers(0, len(self.history) - 1), label="duplicate of")]
            result = attempt(self.state, event, "duplicate")
            if result is not None:
                self.adopt(event, "duplicate", result)

        @precondition(lambda self: len(self.history) >= 2)
        @rule(data=st.data())
        def reordered(self, data: st.DataObject) -> None:
            """Two consecutive events, in the other order, on the state before them (a side branch:
            the machine's state and the old one are left as they were)."""
            i = data.draw(st.integers(0, len(self.history) - 2), label="pair")
            (b0, e0, a0), (b1, e1, _) = self.history[i], self.history[i + 1]
            assert b1 is a0
            now, then = deep_view(self.state), deep_view(b0)
            first = attempt(b0, e1, "reordered")
            if first is not None:
                attempt(first.state, e0, "reordered")
            assert deep_view(self.state) == now, "a step on an older state changed the newest"
            assert deep_view(b0) == then, "a step on an older state changed it"

        @rule(data=st.data())
        def stale_news(self, data: st.DataObject) -> None:
            """News of replicas gone, deployments deleted, nodes never seen, clocks and versions past."""
            event, must_be_stale = data.draw(st.sampled_from(stale_events(self.state, self.retired)), label="stale")
            result = attempt(self.state, event, "stale")
            if result is None:
                return
            if must_be_stale:
                assert result.stale, f"{event!r} was not stale"
                if getattr(event, "now", None) is None:
                    assert result.commands == (), f"{event!r} gave commands: {result.commands}"
            self.adopt(event, "stale", result)

        @rule(data=st.data())
        def extreme(self, data: st.DataObject) -> None:
            """Events their constructors accept, with extreme values (huge counts, clocks, bytes)."""
            event = data.draw(st.sampled_from(extreme_events(self.state)), label="extreme")
            result = attempt(self.state, event, "extreme")
            if result is not None and data.draw(st.booleans(), label="adopt"):
                self.adopt(event, "extreme", result)

        @rule(thing=not_events, bad_state=st.booleans())
        def not_an_event(self, thing: object, bad_state: bool) -> None:
            """No event at all (or no state at all): InvalidEvent, nothing changed."""
            before = deep_view(self.state)
            state: Any = self.state
            event: Any = thing
            if bad_state:
                state, event = (None if isinstance(thing, State) else thing), rc.ReplicaReady(replica_id="llm#0")
            try:
                rc.step(state, event)
            except InvalidEvent as exc:
                said = "State" if bad_state else "not a rankcore event"
                assert said in str(exc), exc
                TALLY.refused("not-an-event", thing, exc)
            else:
                raise AssertionError(f"step took {shown(thing)}")
            assert deep_view(self.state) == before

    Hostile.__name__ = f"Hostile{base.__name__}"
    return Hostile


HostileGroups = with_hostile_rules(make_machine(CoreSubject, managed=True, groups=True, settings=MACHINE))
HostileTiers = with_hostile_rules(make_machine(CoreSubject, managed=True, groups=False, tiers=True, settings=MACHINE))
HostileUnmanaged = with_hostile_rules(make_machine(CoreSubject, managed=False, settings=MACHINE))
TestHostileGroups = HostileGroups.TestCase
TestHostileTiers = HostileTiers.TestCase
TestHostileUnmanaged = HostileUnmanaged.TestCase
TestHostileGroups.settings = TestHostileTiers.settings = TestHostileUnmanaged.settings = MACHINE


# --------------------------------------------------------------------------- the core, rich states


def _on_rich_state(data: st.DataObject) -> None:
    states = rich_states()
    state = data.draw(st.sampled_from(states), label="state")
    kind = data.draw(st.sampled_from(["malformed", "malformed", "recovery", "extreme", "stale"]), label="kind")
    if kind == "recovery":
        bad, path = malformed(data, recovery_of(state))
        attempt(State(), bad, "malformed-recovery", path)
    elif kind == "extreme":
        attempt(state, data.draw(st.sampled_from(extreme_events(state)), label="event"), "extreme")
    elif kind == "stale":
        older = [r for s in states for r in s.index] + ["llm#999", "gone#0"]
        event, _ = data.draw(st.sampled_from(stale_events(state, older)), label="event")
        attempt(state, event, "stale")
    else:
        bad, path = malformed(data, data.draw(st.sampled_from(templates(state)), label="event"))
        attempt(state, bad, "malformed", path)


@GIVEN
@given(data=st.data())
def test_hostile_events_on_states_holding_everything(data: st.DataObject) -> None:
    """Every event type, malformed, stale or extreme, on states with gangs, static placement,
    autoscaling, GPU memory, spares, a rollout and a deletion in flight, proxies, models."""
    _on_rich_state(data)


def _constructor_case(data: st.DataObject) -> None:
    state = data.draw(st.sampled_from(rich_states()), label="state")
    event = data.draw(st.sampled_from(templates(state)), label="event")
    cls = type(event)
    if cls is ev.DeploymentApplied and data.draw(st.booleans(), label="an option"):
        leaf = data.draw(st.sampled_from(sorted(LEAVES)), label="option")
        fields = {**event.flat(), leaf: data.draw(hostile_values, label=leaf)}
    else:
        leaf = data.draw(st.sampled_from([a.name for a in attrs.fields(cls)]), label="field")
        fields = {a.name: getattr(event, a.name) for a in attrs.fields(cls)}
        fields[leaf] = data.draw(hostile_values, label=leaf)
    try:
        built = cls(**fields)
    except NastyError as exc:  # (the value's own __iter__ / __eq__ raising, in a conversion)
        TALLY.refused("constructor", event, exc)
        return
    except RankcoreError as exc:
        assert isinstance(exc, InvalidConfig), f"{cls.__name__}({leaf}=...) raised {type(exc).__name__}: {exc}"
        assert leaf in str(exc), f"{cls.__name__}({leaf}=...) refused without naming it: {exc}"
        TALLY.refused("constructor", event, exc)
        return
    check_record(built)  # (what a constructor builds, the core's boundary takes)
    TALLY.applied("constructor", event)


@GIVEN
@given(data=st.data())
def test_constructors_build_or_name_the_field(data: st.DataObject) -> None:
    """Every event's constructor with one hostile field (or flat option): it builds a record the
    core's boundary takes, or raises InvalidConfig naming that field, nothing else."""
    _constructor_case(data)


def test_every_event_type_and_not_events_are_covered() -> None:
    """The campaign's templates hold every event type ``step`` takes (a new one must be added)."""
    from rankcore.core import _HANDLERS

    kinds = {type(e) for s in rich_states() for e in templates(s)} | {ev.ControllerRecovered}
    assert kinds == set(_HANDLERS), sorted(t.__name__ for t in set(_HANDLERS) ^ kinds)
    for thing in (*NOT_EVENTS, ReadySubclass(replica_id="llm#0")):
        with pytest.raises(InvalidEvent, match="not a rankcore event"):
            rc.step(State(), thing)


# --------------------------------------------------------------------------- the request machine


def _request_templates(m: Any) -> list[Any]:
    ids = m.ids or ["q0"]
    rid = ids[-1]
    reps = [v.replica_id for d in DEPS for v in m.m.pool(d)] or ["llm#0"]
    now = m.now + 1.0
    return [
        rq.Configure(deployment="llm", max_ongoing_requests=2, max_queued_requests=3, max_retries=1),
        rq.Submit(request_id=f"h{len(ids)}", deployment="llm", idempotent=True, deadline=now + 5, model_id="m1"),
        rq.Started(request_id=rid, replica_id=reps[0]),
        rq.Completed(request_id=rid, ok=False, replica_id=reps[0]),
        rq.NotDelivered(request_id=rid, replica_id=reps[0]),
        rq.Cancel(request_id=rid),
        rq.Tick(now=now),
        rc.Tick(now=now),
        rc.PoolChanged(deployment="llm", replica_id=reps[0], membership="draining"),
        rc.PoolReset(deployment="llm", serving=tuple(reps[:2]), draining=(), coming=True),
        rc.PoolComing(deployment="emb", coming=True),
        rq.ReplicaModels(deployment="llm", replica_id=reps[0], model_ids=("m1", "m2")),
    ]


class HostileRequests(RequestMachineProps):
    """The request machine's property machine, with hostile events tried on a copy of it."""

    def feed(self, event: Any, invalid: bool = False) -> list[Any]:
        out = super().feed(event, invalid)
        if self.log[-1][1] is rc.InvalidEvent:  # (the ordinary rules' own illegal events)
            TALLY.add("valid", event, "InvalidEvent")
        else:
            TALLY.applied("valid", event)
        return out

    def attempt(self, event: Any, kind: str, path: tuple[str, ...] = ()) -> None:
        m = copy.deepcopy(self.m)
        ids = [*self.ids, "h0", "never"]
        before = request_view(m, DEPS, ids)
        note(f"hostile ({kind}): handle({shown(event, 400)})")
        try:
            m.handle(event)
        except RankcoreError as exc:
            check_refusal(exc, event, path, f"RequestMachine.handle({type(event).__name__})")
            assert request_view(m, DEPS, ids) == before, "a refused event changed the request machine"
            TALLY.refused(f"requests-{kind}", event, exc)
            return
        TALLY.applied(f"requests-{kind}", event)
        request_probe(m, DEPS, ids)

    @rule(data=st.data())
    def hostile(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["malformed", "malformed", "duplicate", "not-an-event"]), label="kind")
        if kind == "duplicate" and self.log:
            event, _ = data.draw(st.sampled_from(self.log), label="again")
            self.attempt(event, "duplicate")
        elif kind == "not-an-event":
            self.attempt(data.draw(not_request_events, label="thing"), "not-an-event", ("request machine takes no",))
        else:
            event = data.draw(st.sampled_from(_request_templates(self)), label="event")
            bad, path = malformed(data, event)
            self.attempt(bad, "malformed", path)


HostileRequests.TestCase.settings = settings(MACHINE, max_examples=60, stateful_step_count=40)
TestHostileRequests = HostileRequests.TestCase


# --------------------------------------------------------------------------- the batcher


class HostileBatcher(BatcherProps):
    """The batcher's property machine, with hostile events tried on a copy of it."""

    def _do(self, ev: Any) -> list[Any]:
        try:
            out = super()._do(ev)
        except rc.InvalidEvent as exc:  # (the ordinary rules' own illegal events)
            TALLY.refused("valid", ev, exc)
            raise
        TALLY.applied("valid", ev)
        return out

    @rule(data=st.data())
    def hostile(self, data: st.DataObject) -> None:
        b = copy.deepcopy(self.b)
        now = self.now + 0.01
        running = sorted(b._running) or [0]
        pool: list[Any] = [rq.Enqueue(request_id=f"h{self.n}", now=now, size=2, model_id="a"), rq.Tick(now=now),
                           rq.Cancel(request_id=f"r{max(self.n - 1, 0)}"), rq.BatchDone(batch_id=running[0], now=now),
                           rq.SetBatchOptions(options=rq.BatchOptions(max_batch_size=3))]
        kind = data.draw(st.sampled_from(["malformed", "malformed", "duplicate", "not-an-event"]), label="kind")
        path: tuple[str, ...] = ()
        if kind == "duplicate" and self.log:
            event = data.draw(st.sampled_from(self.log), label="again")[0]
        elif kind == "not-an-event":
            event = data.draw(st.one_of(not_request_events, st.just(rc.Tick(now=now))), label="thing")
            path = ("batcher takes no",)
        else:
            kind = "malformed"
            event, path = malformed(data, data.draw(st.sampled_from(pool), label="event"))
        before = batcher_view(b)
        note(f"hostile ({kind}): handle({shown(event, 400)})")
        try:
            b.handle(event)
        except RankcoreError as exc:
            check_refusal(exc, event, path, f"Batcher.handle({type(event).__name__})")
            assert batcher_view(b) == before, "a refused event changed the batcher"
            TALLY.refused(f"batcher-{kind}", event, exc)
            return
        TALLY.applied(f"batcher-{kind}", event)
        batcher_probe(b)


HostileBatcher.TestCase.settings = settings(MACHINE, max_examples=60, stateful_step_count=30)
TestHostileBatcher = HostileBatcher.TestCase


def _options_case(data: st.DataObject) -> None:
    options = data.draw(hostile_values, label="options")
    field = data.draw(st.sampled_from(["max_batch_size", "batch_wait_timeout_s", "max_concurrent_batches", None]),
                      label="field")
    if field is None:
        cases: list[tuple[Any, Any]] = [(rq.Batcher, options), (rq.ModelCache, options)]
    else:
        cases = [(rq.Batcher, forge(rq.BatchOptions(), **{field: options})),
                 (rq.ModelCache, forge(rq.MultiplexOptions(), max_num_models_per_replica=options))]
    for make, opts in cases:
        try:
            made = make(opts)
        except RankcoreError as exc:
            assert isinstance(exc, InvalidConfig), exc
            assert "options" in str(exc) or (field is not None and (
                field in str(exc) or "max_num_models_per_replica" in str(exc))), exc
            TALLY.refused("options", opts, exc)
            continue
        TALLY.applied("options", opts)
        if isinstance(made, rq.Batcher):  # (taken: it works)
            made.handle(rq.Enqueue(request_id="a", now=0.0))
            batcher_probe(made)
        else:
            made.use("m")
            made.begin("m")
            made.loaded("m")


@GIVEN
@given(data=st.data())
def test_batcher_and_model_cache_refuse_malformed_options(data: st.DataObject) -> None:
    """A batcher or a model cache given malformed options (forged, or not options at all) refuses
    them at once, naming them; never a batcher that fails later."""
    _options_case(data)


# --------------------------------------------------------------------------- multiplexing


class HostileModelCache(ModelCacheProps):
    """The model cache's property machine, with hostile calls tried on a copy of it."""

    @rule(data=st.data())
    def hostile(self, data: st.DataObject) -> None:
        c = copy.deepcopy(self.c)
        method = data.draw(st.sampled_from(["use", "begin", "loaded", "failed", "gave_up"]), label="call")
        model = data.draw(st.one_of(hostile_values, st.sampled_from(("a", "b", "ghost"))), label="model_id")
        before = cache_view(c)
        note(f"hostile: ModelCache.{method}({shown(model)})")
        try:
            getattr(c, method)(model)
        except RankcoreError as exc:
            assert "model_id" in str(exc) or (type(model) is str and repr(model) in str(exc)), exc
            assert cache_view(c) == before, f"a refused {method} changed the cache"
            TALLY.refused("model-cache", model, exc)
            return
        assert type(model) is str and model, f"ModelCache.{method} took {shown(model)}"
        TALLY.applied("model-cache", model)
        c.resident()
        bound = c.options.max_num_models_per_replica
        assert bound == -1 or len(c.loaded_ids()) <= bound


HostileModelCache.TestCase.settings = settings(MACHINE, max_examples=60, stateful_step_count=30)
TestHostileModelCache = HostileModelCache.TestCase

_candidate = st.one_of(
    st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3), st.booleans(), st.integers(-1, 5)),
    st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 3), st.booleans(), st.integers(-1, 5)).map(list),
    st.tuples(*([scalars] * 5)),
    st.lists(scalars, max_size=6).map(tuple),
    scalars,
)


def _route_case(data: st.DataObject) -> None:
    candidates = data.draw(st.lists(_candidate, max_size=5), label="candidates")
    last = data.draw(st.one_of(st.integers(-1, 5), scalars), label="last")
    try:
        join = rq.route_model(iter(candidates), last)
    except NastyError as exc:  # (the value's own comparison raising)
        TALLY.refused("route_model", candidates, exc)
        return
    except RankcoreError as exc:
        assert "route_model" in str(exc) and ("candidates" in str(exc) or "last" in str(exc)), exc
        TALLY.refused("route_model", candidates, exc)
        return
    TALLY.applied("route_model", candidates)
    if not candidates:
        assert join is None
    else:  # (duck-typed: any five-item sequence is read as a candidate, a five-letter string too)
        assert any(_first_of_five(c, join) for c in candidates), (join, candidates)


def _first_of_five(candidate: Any, join: Any) -> bool:
    """Whether ``join`` is the join number (first item) of ``candidate``, a five-item sequence."""
    try:
        return len(candidate) == 5 and (candidate[0] is join or bool(candidate[0] == join))
    except (TypeError, NastyError):
        return False


@GIVEN
@given(data=st.data())
def test_route_model_answers_a_candidate_or_names_what_is_wrong(data: st.DataObject) -> None:
    """``route_model`` over hostile candidates: one of their join numbers (None for none), or a
    RankcoreError naming its candidates or ``last``."""
    _route_case(data)


def test_names_what_is_strict() -> None:
    """The contract's naming check refuses a message that names nothing of the event."""
    event = rc.ReplicaReady(replica_id="llm#3")
    assert names_what("ReplicaReady.replica_id must be a non-empty str", event, ("replica_id",))
    assert names_what("replica 'llm#3' is pending", event)
    assert not names_what("something went wrong", event, ("replica_id",))
    assert not names_what("unknown replica 'llm#4'", event)


#: every campaign of this module, for ``benchmarks/bench_hostile.py``: name -> a state machine
#: class, or a function of a hypothesis ``data`` object (one example)
CAMPAIGNS: dict[str, Any] = {
    "core: gangs, static placement, autoscaling, rollouts, deletion, spares, proxies": HostileGroups,
    "core: GPU memory tiers, sleep/wake, weights": HostileTiers,
    "core: unmanaged (executor places)": HostileUnmanaged,
    "core: rich states, every event type": _on_rich_state,
    "core: constructors": _constructor_case,
    "requests: RequestMachine": HostileRequests,
    "requests: Batcher": HostileBatcher,
    "requests: Batcher / ModelCache options": _options_case,
    "requests: ModelCache": HostileModelCache,
    "requests: route_model": _route_case,
}
