"""make_machine's bare call checks everything: placement, gangs, static placement
(issue 19: a wrapper dropping every GangChanged passed the README's machine)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import rankcore as rc
from rankcore.testing import CoreSubject, make_machine

#: quick and reproducible: no shrinking (the failure is reported as found)
QUICK = settings(max_examples=200, stateful_step_count=20, deadline=None, database=None, derandomize=True,
                 phases=[Phase.generate], report_multiple_bugs=False)


class GangMuter(CoreSubject):
    """A wrapper bug: it drops every GangChanged, so a restarted member's gang never hears of it."""

    def step(self, state, event):
        result = rc.step(state, event)
        return attrs.evolve(result, commands=tuple(c for c in result.commands if not isinstance(c, rc.GangChanged)))


def test_the_default_machine_catches_a_wrapper_dropping_gang_changes():
    # Either check may see the dropped GangChanged first: the gang rule itself, or (when a
    # deadline's Tick restarts a member inside an answer that carries the clock) the rule
    # that such a step starts with exactly the Tick's commands.
    with pytest.raises(rc.InvariantViolation,
                       match=r"gang \S+ got new members .* were not told|its first commands are not those of Tick"):
        run_state_machine_as_test(make_machine(GangMuter), settings=settings(QUICK, max_examples=500))


class GroupMuter(CoreSubject):
    """A wrapper bug: it drops a collective group's news for its last member, which never learns its epoch."""

    def step(self, state, event):
        result = rc.step(state, event)
        told = [c for c in result.commands if isinstance(c, rc.ReformGroup)]
        return attrs.evolve(result, commands=tuple(c for c in result.commands if not told or c is not told[-1]))


def test_the_default_machine_catches_a_wrapper_dropping_a_reform_group():
    with pytest.raises(rc.InvariantViolation, match=r"group \S+ epoch \d+ told .*; its members are"):
        run_state_machine_as_test(make_machine(GroupMuter), settings=settings(QUICK, max_examples=200))


def test_the_unmanaged_machine_is_an_opt_out_and_never_sees_gangs():
    run_state_machine_as_test(make_machine(GangMuter, managed=False), settings=QUICK)


def test_the_default_machine_passes_the_core():
    run_state_machine_as_test(make_machine(CoreSubject), settings=QUICK)


def test_groups_need_a_managed_machine():
    with pytest.raises(rc.InvalidConfig, match=r"groups=True.*needs managed=True"):
        make_machine(CoreSubject, managed=False, groups=True)

