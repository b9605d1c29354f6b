"""The timeline machine from rankcore.testing driving the simulator."""

from executors.sim.subject import SimSubject
from rankcore.testing import make_timeline_machine

TestSimTimelines = make_timeline_machine(SimSubject).TestCase
