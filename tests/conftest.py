"""Hypothesis profiles: the ones rankcore.testing registers, under short names too:
``ci`` (default), ``thorough`` (``--hypothesis-profile=thorough``) and ``dev``; and ``mutate`` (below)."""

from hypothesis import HealthCheck, Phase, settings

from rankcore.testing import PROFILES

for name, kw in PROFILES.items():
    settings.register_profile(name.removeprefix("rankcore-"), deadline=None,
                              suppress_health_check=[HealthCheck.too_slow], print_blob=True, **kw)
# ``mutate``: what ``make mutate`` runs for each mutant (pyproject.toml, [tool.mutmut]): ``dev``'s
# sizes, and only the phases that find a failure. A mutant is killed by the first failing example;
# shrinking it and hypothesis's ``explain`` phase (20-40 s for a stateful machine) say nothing more.
settings.register_profile("mutate", parent=settings.get_profile("dev"),
                          phases=(Phase.explicit, Phase.reuse, Phase.generate))
settings.load_profile("ci")


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _unfreeze_gc():
    """executors.driver.Driver may gc.freeze() after a big state change; keep that
    from outliving the test that caused it."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
