"""Model tiers: HOT / WARM / COLD per GPU device, eviction, the WARM cache,
sleep / wake and weight versions (docs/tiers.md).

``choice`` (NDIF's placement preferences and eviction rules, pure over a
node's devices), ``devices`` (GPU memory booked in the cluster model),
``residency`` (sleep, wake, weight versions) and ``evictions`` (the
end-of-step passes that send evictions and retry waiting wakes).

``rankcore.tiers`` is also the public namespace of the tier choices
(``rankcore.tiers.choose``, ``Tier``, ``NodeTiers``, ...), as before, and of
``device_bytes`` (what a replica books on its devices).
"""

from .choice import *  # noqa: F403  (the public namespace: choice.__all__)
from .choice import __all__ as _choice_all
from .devices import device_bytes

__all__ = [*_choice_all, "device_bytes"]
