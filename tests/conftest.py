"""Hypothesis profiles: the ones rankcore.testing registers, under short names too:
``ci`` (default), ``thorough`` (``--hypothesis-profile=thorough``) and ``dev``."""

from hypothesis import HealthCheck, settings

from rankcore.testing import PROFILES

for name, kw in PROFILES.items():
    settings.register_profile(name.removeprefix("rankcore-"), deadline=None,
                              suppress_health_check=[HealthCheck.too_slow], print_blob=True, **kw)
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
