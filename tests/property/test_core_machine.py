"""The stateful property suite against the bare core."""

from rankcore.testing import CoreSubject, make_machine

TestCoreMachine = make_machine(CoreSubject).TestCase
