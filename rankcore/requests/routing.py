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
* ``locality``: Ray Serve's ``LocalityMixin``: the candidates on the caller's node
  (``Submit.caller_node``), else those in its availability zone (``caller_zone``), else all; power
  of two choices among them. A replica's node and zone come from ``ReplicaLocated``;
* ``consistent_hash``: session affinity: rendezvous hashing of ``Submit.routing_key`` (the request
  id when empty) over the candidates, so a key keeps its replica while that one can take it;
* ``prefix_affinity``: Ray Serve's ``PrefixCacheAffinityRouter``, with its keywords: while the
  candidates' loads differ by at most ``imbalanced_threshold``, the candidate whose store holds the
  longest run of the request's prefix blocks (``Submit.prefix`` cut in blocks of ``block_chars``)
  when that covers at least ``match_rate_threshold`` of the prefix, else the candidate whose store
  is smallest; power of two choices when the loads are imbalanced. Each replica's store is bounded:
  past ``eviction_threshold_chars`` it drops its least recently routed blocks down to
  ``eviction_target_chars`` (default 90% of the threshold; Serve evicts only with ``do_eviction``;
  here always).

``serve_router`` reads Ray Serve's ``request_router_config`` (its class paths and keywords) as
one of these.

Internal module: import its public names from ``rankcore.requests``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from ..base.errors import InvalidConfig, RankcoreError

__all__ = ["Candidate", "RouteRequest", "Router", "RouterError", "ROUTERS", "register_router", "make_router",
           "PowerOfTwoChoices", "Locality", "ConsistentHash", "PrefixAffinity", "ZONE_LABEL", "zone_of", "SERVE_ROUTERS",
           "serve_router"]

#: the node label whose value is a node's availability zone (Ray's default label; ``ReplicaLocated.zone``)
ZONE_LABEL = "ray.io/availability-zone"


def zone_of(labels: Iterable[tuple[str, str]]) -> str:
    """A node's availability zone from its labels (``Node.labels``' pairs): its ``ZONE_LABEL``, "" none."""
    return dict(labels).get(ZONE_LABEL, "")


class RouterError(RankcoreError):
    """A router broke the machine's contract: it picked a replica that is no candidate (or raised)."""


@attrs.frozen
class Candidate:
    """A replica that can take the request now: its id, how many requests it holds, its place in
    the pool's join order (a stable tie-break), the multiplexed models it holds, and its node and
    availability zone ("" unknown: ``ReplicaLocated``)."""

    replica_id: str
    in_flight: int
    join: int
    models: tuple[str, ...] = ()
    node_id: str = ""
    zone: str = ""


@attrs.frozen
class RouteRequest:
    """What a router may read of a request (``Submit``'s): its id, ``routing_key``, ``prefix``,
    multiplexed ``model_id``, and the caller's node and zone."""

    request_id: str
    routing_key: str = ""
    prefix: str = ""
    model_id: str = ""
    caller_node: str = ""
    caller_zone: str = ""


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


class Locality:
    """Ray Serve's ``LocalityMixin`` (with ``prefer_local_node_routing`` and ``prefer_local_az_routing``):
    the candidates on the caller's node, else in its zone, else all; power of two choices among them.
    A candidate can take the request now, so a busy local replica is passed over at once (Serve tries
    the node once, then widens)."""

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None:
        return _two(_local(candidates, request), request.request_id).replica_id

    def dispatched(self, replica_id: str, request: RouteRequest) -> None:
        pass

    def forget(self, replica_id: str) -> None:
        pass


def _local(candidates: Sequence[Candidate], request: RouteRequest) -> Sequence[Candidate]:
    """The nearest non-empty scope of ``candidates`` to the caller: its node, its zone, all."""
    if request.caller_node:
        near = [c for c in candidates if c.node_id == request.caller_node]
        if near:
            return near
    if request.caller_zone:
        near = [c for c in candidates if c.zone == request.caller_zone]
        if near:
            return near
    return candidates


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


def _number(name: str, value: Any, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
        raise InvalidConfig(f"prefix_affinity: {name} must be a number >= {low:g}, got {value!r}")
    return float(value)


class PrefixAffinity:
    """Ray Serve's ``PrefixCacheAffinityRouter`` in the core, with its keywords (module docstring).
    Per replica a bounded store of the prefix blocks routed to it (what its KV cache would hold)."""

    def __init__(self, imbalanced_threshold: float = float("inf"), match_rate_threshold: float = 0.1,
                 do_eviction: bool = False, eviction_threshold_chars: int = 400_000,
                 eviction_target_chars: int | None = None, eviction_interval_secs: float = 10,
                 block_chars: int = 16) -> None:
        if type(block_chars) is not int or block_chars < 1:
            raise InvalidConfig(f"prefix_affinity: block_chars must be an int >= 1, got {block_chars!r}")
        self.imbalanced_threshold = _number("imbalanced_threshold", imbalanced_threshold, 0)
        self.match_rate_threshold = _number("match_rate_threshold", match_rate_threshold, 0)
        if self.match_rate_threshold > 1:
            raise InvalidConfig(f"prefix_affinity: match_rate_threshold must be in [0, 1], got {match_rate_threshold!r}")
        if type(do_eviction) is not bool:
            raise InvalidConfig(f"prefix_affinity: do_eviction must be a bool, got {do_eviction!r}")
        if type(eviction_threshold_chars) is not int or eviction_threshold_chars < block_chars:
            raise InvalidConfig(f"prefix_affinity: eviction_threshold_chars must be an int >= block_chars "
                                f"({block_chars}), got {eviction_threshold_chars!r}")
        target = (eviction_threshold_chars * 9 // 10 if eviction_target_chars is None  # (Serve's 360_000 of 400_000)
                  else eviction_target_chars)
        if type(target) is not int or not block_chars <= target <= eviction_threshold_chars:
            raise InvalidConfig(f"prefix_affinity: eviction_target_chars must be an int from block_chars "
                                f"({block_chars}) to eviction_threshold_chars ({eviction_threshold_chars}), "
                                f"got {eviction_target_chars!r}")
        _number("eviction_interval_secs", eviction_interval_secs, 0)  # (accepted: this store evicts as it grows)
        self.block_chars = block_chars
        #: per replica: past ``max_blocks`` blocks its store drops the least recently routed to ``keep_blocks``
        self.max_blocks = eviction_threshold_chars // block_chars
        self.keep_blocks = target // block_chars
        #: replica id -> its blocks (a chained hash of each block with all before it), least recent first
        self.stores: dict[str, OrderedDict[int, None]] = {}
        #: block -> the replicas whose store holds it (``_longest`` walks it)
        self.holders: dict[int, set[str]] = {}
        self._last: tuple[str, list[int]] = ("", [])

    def blocks(self, prefix: str) -> list[int]:
        """The prefix's whole blocks, each hashed with every block before it (so a block matches only
        after the same beginning, as a KV cache's pages do). Python's own hash: only which blocks are
        equal matters, within this router (no other process compares them). The last prefix's are
        kept: ``choose`` and then ``dispatched`` read the same request's."""
        if prefix == self._last[0]:
            return self._last[1]
        out, h, bc = [], 0, self.block_chars
        for i in range(0, len(prefix) - bc + 1, bc):
            h = hash((h, prefix[i:i + bc]))
            out.append(h)
        self._last = (prefix, out)
        return out

    def _longest(self, candidates: Sequence[Candidate], blocks: Sequence[int]) -> tuple[int, set[str]]:
        """The longest run of ``blocks`` any candidate holds, and the candidates holding it: a walk of
        the blocks through the index of their holders, narrowing the set (O(blocks matched x holders),
        not O(candidates x blocks))."""
        holders = self.holders
        alive = {c.replica_id for c in candidates}
        n = 0
        for b in blocks:
            held = holders.get(b)
            if not held:
                break
            nxt = alive & held
            if not nxt:
                break
            alive, n = nxt, n + 1
        return n, alive

    def choose(self, candidates: Sequence[Candidate], request: RouteRequest) -> str | None:
        blocks = self.blocks(request.prefix)
        loads = [c.in_flight for c in candidates]
        if blocks and max(loads) - min(loads) <= self.imbalanced_threshold:
            n, best = self._longest(candidates, blocks)
            if n and n >= self.match_rate_threshold * len(blocks):
                return min((c for c in candidates if c.replica_id in best),
                           key=lambda c: (c.in_flight, c.join)).replica_id
            stores = self.stores  # (Serve's "smallest tenants": the candidate that has cached least)
            return min(candidates, key=lambda c: (len(stores.get(c.replica_id, ())), c.in_flight, c.join)).replica_id
        return _two(candidates, request.request_id).replica_id

    def dispatched(self, replica_id: str, request: RouteRequest) -> None:
        blocks = self.blocks(request.prefix)
        if not blocks:
            return
        store = self.stores.setdefault(replica_id, OrderedDict())
        holders = self.holders
        for b in blocks:
            if b in store:
                store.move_to_end(b)
            else:
                store[b] = None
                held = holders.get(b)
                if held is None:
                    holders[b] = {replica_id}
                else:
                    held.add(replica_id)
        if len(store) > self.max_blocks:
            while len(store) > self.keep_blocks:
                self._drop(replica_id, store.popitem(last=False)[0])

    def _drop(self, replica_id: str, block: int) -> None:
        held = self.holders[block]
        held.discard(replica_id)
        if not held:
            del self.holders[block]

    def forget(self, replica_id: str) -> None:
        for block in self.stores.pop(replica_id, ()):
            self._drop(replica_id, block)


#: the routers by name: a factory taking the router's config as keywords
ROUTERS: dict[str, Callable[..., Router]] = {
    "power_of_two_choices": PowerOfTwoChoices,
    "locality": Locality,
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


#: Ray Serve's router classes (``request_router_config.request_router_class``) -> the router here
SERVE_ROUTERS: dict[str, str] = {
    "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter": "power_of_two_choices",
    "ray.serve._private.request_router.pow_2_router:PowerOfTwoChoicesRequestRouter": "power_of_two_choices",
    "ray.serve.llm.request_router:PrefixCacheAffinityRouter": "prefix_affinity",
    "ray.serve.llm.request_router.PrefixCacheAffinityRouter": "prefix_affinity",
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:PrefixCacheAffinityRouter":
        "prefix_affinity",
}


def serve_router(request_router_class: str, request_router_kwargs: Mapping[str, Any] | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """Ray Serve's ``request_router_config`` as (router name, keywords) here: a Serve class path it
    ships (``SERVE_ROUTERS``, "module:Class" or "module.Class"), or a router's name here. The
    keywords pass through (the built-in routers take Serve's names). ``InvalidConfig`` for anything
    else, naming what there is."""
    if not isinstance(request_router_class, str) or not request_router_class:
        raise InvalidConfig(f"request_router_config.request_router_class must be a router's name or a Ray Serve "
                            f"router class path, got {request_router_class!r}")
    kwargs = dict(request_router_kwargs or {})
    name = SERVE_ROUTERS.get(request_router_class, request_router_class)
    if name not in ROUTERS:
        raise InvalidConfig(f"request_router_config.request_router_class={request_router_class!r} is no router here "
                            f"(routers: {', '.join(sorted(ROUTERS))}; Ray Serve's: {', '.join(sorted(SERVE_ROUTERS))}); "
                            f"a router of your own: rankcore.requests.register_router (docs/routing.md)")
    return name, kwargs
