"""The stateful property suite against the bare core."""

from rankcore.testing import CoreSubject, make_machine

TestCoreMachine = make_machine(CoreSubject).TestCase

#: the same machine with the core placing replicas: nodes join, leave and
#: change capacity, placements fail or land elsewhere, the clock ticks
TestManagedCoreMachine = make_machine(CoreSubject, managed=True).TestCase
