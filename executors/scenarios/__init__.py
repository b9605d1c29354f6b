"""What every executor shares about scenarios: the YAML format (``format``),
latency models, the metrics a run keeps and the expectation checks. The
simulator (``executors/sim``) and the Ray scenario runner
(``executors/ray_gpu/scenario.py``) both stand on this package; neither
imports the other."""

from .expectations import ExpectationResult, check_expectation
from .format import Expectation, Scenario, ScenarioError, load_scenario, parse_scenario
from .latency import Latency, parse_latency
from .metrics import Metrics
from .timeline import ACTIONS, Action, Desired, Target

__all__ = [
    "Action", "Expectation", "Scenario", "ScenarioError", "load_scenario", "parse_scenario",
    "Latency", "parse_latency", "Metrics", "ExpectationResult", "check_expectation",
    "ACTIONS", "Desired", "Target",
]
