"""Hypothesis profiles: the ones rankcore.testing registers, under short names too:
``ci`` (default), ``thorough`` (``--hypothesis-profile=thorough``) and ``dev``; and ``mutate`` (below).
No terminal size in the environment (below)."""

import os

# No Ray is started behind a test's back: a Ray call made where none is initialised (a router's
# long-poll thread that outlived its module's Ray, say) raises instead of starting a local Ray, which
# raced the next module's own ray.init in CI ("Perhaps you called ray.init twice"). Read by Ray when it
# is imported: set before anything imports it.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")

from hypothesis import HealthCheck, Phase, settings

import executors.ray_gpu  # noqa: F401  (first: gRPC's fork handlers off before anything imports grpc)
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

# The CLI's tables take COLUMNS as a terminal's width. pytest-xdist's workers (`make test` runs two)
# have COLUMNS=80 and LINES=24 in their environment, a shell may export its own: every test sees
# what a plain run from a pipe sees, no size, and a test that wants one says so (CliRunner's env).
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _unfreeze_gc():
    """executors.driver.Driver may gc.freeze() after a big state change; keep that
    from outliving the test that caused it."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests clean up what they make: the HAProxy folders of proxy actors the tests killed (or whose
    Ray was shut down under them) never ran ``HAProxy.stop``; those whose owner is dead go now. Their
    HAProxys, which outlive a dead proxy a while (``ingress/warden.py``), are stopped by the session
    that ran every test (not by one of xdist's workers while another may be adopting one)."""
    from executors.ray_gpu.ingress.haproxy import sweep_workdirs

    sweep_workdirs(stop_orphans=not hasattr(session.config, "workerinput"))
