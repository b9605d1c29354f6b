"""Hypothesis profiles: the ones rankcore.testing registers, under short names too:
``ci`` (default), ``thorough`` (``--hypothesis-profile=thorough``) and ``dev``."""

from hypothesis import HealthCheck, settings

from rankcore.testing import PROFILES

for name, kw in PROFILES.items():
    settings.register_profile(name.removeprefix("rankcore-"), deadline=None,
                              suppress_health_check=[HealthCheck.too_slow], print_blob=True, **kw)
settings.load_profile("ci")
