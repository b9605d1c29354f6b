"""Routers: which of a deployment's candidate replicas a request goes to (issue 68).

The request machine computes the candidates itself, as it always has (serving, not excluded or
quiet, under ``max_ongoing_requests``), and asks the deployment's router to pick one; the queue,
back-pressure, retries and the candidates stay the machine's. A router may only pick among the
candidates (``RequestMachine`` refuses any other answer with ``RouterError``, the request kept at
the head of its queue); it may keep state (a prefix store per replica), bounded, and forgets a
replica that left its pool (``forget``). Without one (``Configure.request_router`` "") the
machine's own rule applies: the replica holding fewest, ties round-robin in pool-join order.

Built in, by name (``ROUTERS``; ``register_router`` adds a user's):

* ``power_of_two_choices``: Ray Serve's default: two candidates drawn (here by a hash of the
  request id: the machine stays deterministic), the one holding fewer;
* ``consistent_hash``: session affinity: rendezvous hashing of ``Submit.routing_key`` (the request
  id when empty) over the candidates, so a key keeps its replica while that one can take it;
* ``prefix_affinity``: Ray Serve's ``PrefixCacheAffinityRouter``: the candidate whose store holds
  the longest run of the request's prefix blocks (``Submit.prefix`` cut in blocks of
  ``block_chars``), while the load imbalance among the candidates is at most
  ``imbalance_threshold`` and the match covers at least ``match_rate_threshold`` of the prefix;
  else power of two choices. Each replica's store keeps at most ``max_blocks`` blocks (least
  recently routed dropped first).

Internal module: import its public names from ``rankcore.requests``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from ..base.errors import InvalidConfig, RankcoreError

__all__ = ["Candidate", "RouteRequest", "Router", "RouterError", "ROUTERS", "register_router", "make_router",
           "PowerOfTwoChoices", "ConsistentHash", "PrefixAffinity"]


class RouterError(RankcoreError):
    """A router broke the machine's contract: it picked a replica that is no candidate (or raised)."""


@attrs.frozen
class Candidate:
    """A replica that can take the request now: its id, how many requests it holds, its place in
    the pool's join order (a stable tie-break) and the multiplexed models it holds."""

    replica_id: str
    in_flight: int
    join: int
    models: tuple[str, ...] = ()


@attrs.frozen
class RouteRequest:
    """What a router may read of a request (``Submit``'s): its id, ``routing_key``, ``prefix`` and
    multiplexed ``model_id``."""

    request_id: str
    routing_key: str = ""
    prefix: str = ""
    model_id: str = ""


class Router(Protocol):
    """A deployment's routing policy: ``choose`` a candidate's id (None: the machine's own rule),
    learn where a request went (``dispatched``), forget a replica that left the pool."""

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None: ...

    def dispatched(self, replica_id: str, request: RouteRequest) -> None: ...

    def forget(self, replica_id: str) -> None: ...


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest(), "big")


def _least(cands: Sequence[Candidate]) -> Candidate:
    return min(cands, key=lambda c: (c.in_flight, c.join))


class PowerOfTwoChoices:
    """Two candidates drawn by a hash of the request id (and its attempt's candidates), the one
    holding fewer (ties: the earlier in pool-join order)."""

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None:
        return _two(candidates, request.request_id).replica_id

    def dispatched(self, replica_id: str, request: RouteRequest) -> None:
        pass

    def forget(self, replica_id: str) -> None:
        pass


def _two(candidates: Sequence[Candidate], seed: str) -> Candidate:
    n = len(candidates)
    if n == 1:
        return candidates[0]
    x = _h(seed, "p2c")
    i = x % n
    j = (i + 1 + (x >> 32) % (n - 1)) % n
    return _least((candidates[i], candidates[j]))


class ConsistentHash:
    """Rendezvous hashing of the request's ``routing_key`` (its id when empty): the candidate whose
    hash with the key is highest, so a key stays on its replica while that one can take it, and a
    replica's departure moves only its own keys."""

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None:
        key = request.routing_key or request.request_id
        return max(candidates, key=lambda c: (_h(key, c.replica_id), -c.join)).replica_id

    def dispatched(self, replica_id: str, request: RouteRequest) -> None:
        pass

    def forget(self, replica_id: str) -> None:
        pass


class PrefixAffinity:
    """Ray Serve's ``PrefixCacheAffinityRouter`` in the core: per replica a bounded store of the
    prefix blocks routed to it; a request goes to the candidate holding the longest run of its
    blocks while the candidates' loads are within ``imbalance_threshold`` of each other and the
    match is at least ``match_rate_threshold`` of its blocks; else power of two choices."""

    def __init__(self, block_chars: int = 16, max_blocks: int = 10_000, imbalance_threshold: int = 10,
                 match_rate_threshold: float = 0.1) -> None:
        if type(block_chars) is not int or block_chars < 1:
            raise InvalidConfig(f"prefix_affinity: block_chars must be an int >= 1, got {block_chars!r}")
        if type(max_blocks) is not int or max_blocks < 1:
            raise InvalidConfig(f"prefix_affinity: max_blocks must be an int >= 1, got {max_blocks!r}")
        if type(imbalance_threshold) is not int or imbalance_threshold < 0:
            raise InvalidConfig(f"prefix_affinity: imbalance_threshold must be an int >= 0, "
                                f"got {imbalance_threshold!r}")
        if not isinstance(match_rate_threshold, (int, float)) or not 0 <= match_rate_threshold <= 1:
            raise InvalidConfig(f"prefix_affinity: match_rate_threshold must be in [0, 1], "
                                f"got {match_rate_threshold!r}")
        self.block_chars, self.max_blocks = block_chars, max_blocks
        self.imbalance_threshold, self.match_rate_threshold = imbalance_threshold, float(match_rate_threshold)
        #: replica id -> its blocks (a chained hash of each block with all before it), least recent first
        self.stores: dict[str, OrderedDict[int, None]] = {}

    def blocks(self, prefix: str) -> list[int]:
        """The prefix's whole blocks, each hashed with every block before it (so a block matches only
        after the same beginning, as a KV cache's pages do)."""
        out, h = [], 0
        for i in range(0, len(prefix) - self.block_chars + 1, self.block_chars):
            h = _h(str(h), prefix[i:i + self.block_chars])
            out.append(h)
        return out

    def matched(self, replica_id: str, blocks: Sequence[int]) -> int:
        store = self.stores.get(replica_id)
        n = 0
        if store:
            for b in blocks:
                if b not in store:
                    break
                n += 1
        return n

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None:
        blocks = self.blocks(request.prefix)
        loads = [c.in_flight for c in candidates]
        if blocks and max(loads) - min(loads) <= self.imbalance_threshold:
            best = max(candidates, key=lambda c: (self.matched(c.replica_id, blocks), -c.in_flight, -c.join))
            if self.matched(best.replica_id, blocks) >= max(1.0, self.match_rate_threshold * len(blocks)):
                return best.replica_id
        return _two(candidates, request.request_id).replica_id

    def dispatched(self, replica_id: str, request: RouteRequest) -> None:
        blocks = self.blocks(request.prefix)
        if not blocks:
            return
        store = self.stores.setdefault(replica_id, OrderedDict())
        for b in blocks:
            store[b] = None
            store.move_to_end(b)
        while len(store) > self.max_blocks:
            store.popitem(last=False)

    def forget(self, replica_id: str) -> None:
        self.stores.pop(replica_id, None)


#: the routers by name: a factory taking the router's config as keywords
ROUTERS: dict[str, Callable[..., Router]] = {
    "power_of_two_choices": PowerOfTwoChoices,
    "consistent_hash": ConsistentHash,
    "prefix_affinity": PrefixAffinity,
}


def register_router(name: str, factory: Callable[..., Router]) -> None:
    """Make a router choosable by ``name`` (``Configure.request_router``): ``factory(**config)``
    builds one per deployment. A name already taken is refused."""
    if not isinstance(name, str) or not name:
        raise InvalidConfig(f"register_router: the name must be a non-empty str, got {name!r}")
    if name in ROUTERS:
        raise InvalidConfig(f"register_router: a router named {name!r} exists already")
    if not callable(factory):
        raise InvalidConfig(f"register_router({name!r}): the factory must be callable, got {factory!r}")
    ROUTERS[name] = factory


def make_router(name: str, config: Mapping[str, Any] | None = None) -> Router:
    """The router ``name`` with ``config``; ``InvalidConfig`` naming what is wrong (an unknown name,
    a keyword it does not take, a bad value, or an object without ``choose``)."""
    factory = ROUTERS.get(name)
    if factory is None:
        raise InvalidConfig(f"unknown request router {name!r} (routers: {', '.join(sorted(ROUTERS))}; "
                            f"rankcore.requests.register_router adds one)")
    try:
        router = factory(**dict(config or {}))
    except TypeError as exc:
        raise InvalidConfig(f"request router {name!r}: {exc}") from None
    for hook in ("choose", "dispatched", "forget"):
        if not callable(getattr(router, hook, None)):
            raise InvalidConfig(f"request router {name!r} has no {hook}() method (rankcore.requests.Router)")
    return router
