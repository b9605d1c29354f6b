"""Hypothesis profiles: ``ci`` (default) and ``thorough`` (``--hypothesis-profile=thorough``)."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=30, stateful_step_count=30, deadline=None)
settings.load_profile("ci")
