"""The stateful property suite against the bare core."""

from rankcore.testing import CoreSubject, make_machine

TestCoreMachine = make_machine(CoreSubject, managed=False).TestCase

#: the same machine with the core placing replicas: nodes join, leave and
#: change capacity, placements fail or land elsewhere, the clock ticks
TestManagedCoreMachine = make_machine(CoreSubject, managed=True, groups=False).TestCase

# Static placement (a caller's group; bundles move and are lost) and gangs
# (all-or-nothing placement, whole-gang restarts and downscales), on the
# managed core.
TestGroupsCoreMachine = make_machine(CoreSubject, managed=True, groups=True).TestCase

#: GPU memory (issue 21): nodes declare devices and a CPU cache, models evict
#: each other, reload WARM or COLD, sleep and wake (rankcore.tiers.devices)
TestTiersCoreMachine = make_machine(CoreSubject, managed=True, groups=False, tiers=True).TestCase
