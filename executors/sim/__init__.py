"""The in-memory discrete-event simulator: virtual time, latency and fault
models, scenario files, expectations, traces, metrics and plots."""

from ..scenarios import Scenario, ScenarioError, load_scenario, parse_scenario
from .runner import RunResult, Simulation, run_scenario

__all__ = ["Simulation", "RunResult", "run_scenario", "Scenario", "ScenarioError", "load_scenario", "parse_scenario"]
