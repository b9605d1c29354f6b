"""A replica's prefix (KV) cache as a model, and a shared-prefix workload (issue 68).

What a prefix-affinity router is worth depends on what a replica saves when the start of a prompt is
already in its cache: its prefill skips those tokens, so the time to the first token falls with the
cached share of the prompt. One model, used by the simulator's replicas (``traffic.<d>.prefix_cache``)
and by the Ray benchmark's replicas (``benchmarks/bench_router.py``), so the two can be compared:

* ``KVCache``: a replica's cache of prompt blocks (``block_chars`` characters each, each keyed by a
  hash chained over every block before it, as a paged KV cache holds pages of a prefix), at most
  ``capacity_blocks``, least recently used dropped first. ``take(prompt)`` says how many characters of
  the prompt's beginning it held, then holds the whole prompt.
* ``PrefixCacheModel``: the times: ``ttft_s(prompt_chars, cached_chars) = base_s + prefill_s_per_char x
  (prompt_chars - cached_chars)``; the answer ends ``decode_s`` later. A replica runs ``prefills``
  prefills at once (1: one at a time, as a GPU's prefill and the benchmark's ``asyncio.Lock``; 0: no
  bound): a request's prefill waits for the one before it; the decodes overlap.
* ``SharedPrefixWorkload``: ``system_prompts`` system prompts of ``system_chars`` characters, drawn
  Zipf(``zipf_s``) (a few are hot), each request one of them followed by a question of its own of
  ``question_chars`` characters. Deterministic from its seed. ``prompts(n)`` draws ``n`` at once;
  ``iter_prompts()`` one at a time, for ever (the simulator's requests take the next as each
  arrives, however many come); ``iter_listed()`` too, with ``prompts(n)``'s system prompts in its
  order (the benchmark's prompts, for the simulator's ``prefix_cache.seed``).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator

import attrs

__all__ = ["KVCache", "PrefixCacheModel", "SharedPrefixWorkload"]


def _chain(h: bytes, block: str) -> bytes:
    return hashlib.blake2b(h + block.encode(), digest_size=8).digest()


class KVCache:
    """One replica's prefix cache (module docstring). Not thread-safe."""

    def __init__(self, block_chars: int = 16, capacity_blocks: int = 4096) -> None:
        if block_chars < 1 or capacity_blocks < 1:
            raise ValueError(f"KVCache: block_chars and capacity_blocks must be >= 1, got {block_chars}, "
                             f"{capacity_blocks}")
        self.block_chars, self.capacity = block_chars, capacity_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.hit_chars = self.prompt_chars = 0

    def take(self, prompt: str) -> int:
        """How many characters at the start of ``prompt`` were cached (whole blocks); the prompt's
        blocks are cached from now on (the most recently used)."""
        h, cached, matching = b"", 0, True
        bc, blocks, blake = self.block_chars, self.blocks, hashlib.blake2b  # (``_chain``, inlined: per block)
        for i in range(0, len(prompt) - bc + 1, bc):
            h = blake(h + prompt[i:i + bc].encode(), digest_size=8).digest()
            if matching and h in blocks:
                cached += bc
            else:
                matching = False
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)
        self.hit_chars += cached
        self.prompt_chars += len(prompt)
        return cached


@attrs.frozen(kw_only=True)
class PrefixCacheModel:
    """The times of a request on a replica with a prefix cache (module docstring): on a CPU, prefill
    costs ``prefill_s_per_char`` a character not cached (a 32B model's prefill is ~1-2 ms per 100
    tokens on an H100; a character ~ a quarter token), ``base_s`` fixed, and the answer's tokens
    ``decode_s``. A replica runs ``prefills`` prefills at once (1: one at a time, as a GPU does and
    the benchmark's replica, an ``asyncio.Lock``; 0: no bound, every request's at once); a
    request's decode overlaps the others'."""

    block_chars: int = 16
    capacity_blocks: int = 4096
    base_s: float = 0.005
    prefill_s_per_char: float = 0.00002
    decode_s: float = 0.02
    prefills: int = 1

    def ttft_s(self, prompt_chars: int, cached_chars: int) -> float:
        return self.base_s + self.prefill_s_per_char * max(0, prompt_chars - cached_chars)

    def cache(self) -> KVCache:
        return KVCache(self.block_chars, self.capacity_blocks)


@attrs.frozen(kw_only=True)
class SharedPrefixWorkload:
    """Prompts sharing a few hundred system prompts, Zipf-drawn (module docstring)."""

    system_prompts: int = 200
    zipf_s: float = 1.1
    system_chars: int = 1600
    question_chars: int = 96
    seed: int = 0

    def systems(self) -> list[str]:
        rng = random.Random(f"systems-{self.seed}")
        words = ("model", "policy", "answer", "brief", "careful", "json", "tool", "user", "assist", "cite")
        out = []
        for k in range(self.system_prompts):
            text = f"[system {k}] "
            while len(text) < self.system_chars:
                text += rng.choice(words) + " "
            out.append(text[:self.system_chars])
        return out

    def weights(self) -> list[float]:
        return [1.0 / (k + 1) ** self.zipf_s for k in range(self.system_prompts)]

    def system_keys(self) -> Callable[[str], str]:
        """A function: a prompt -> its session key, ``system-<k>`` for the system prompt it begins with
        (another prompt, e.g. a warm-up's: itself). What bench_router's ``ours-hash`` keys its calls by,
        and the simulator's ``prefix_cache.keyed``."""
        keys = {s: f"system-{k}" for k, s in enumerate(self.systems())}
        chars = self.system_chars
        return lambda prompt: keys.get(prompt[:chars], prompt)

    def prompts(self, n: int) -> list[str]:
        """``n`` prompts, in order (deterministic)."""
        rng = random.Random(f"prompts-{self.seed}")
        systems, weights = self.systems(), self.weights()
        picks = rng.choices(range(self.system_prompts), weights=weights, k=n)
        out = []
        for i, k in enumerate(picks):
            q = f" [question {i}] " + "".join(rng.choice("abcdefghij ") for _ in range(self.question_chars))
            out.append(systems[k] + q[:self.question_chars])
        return out

    def iter_listed(self) -> Iterator[str]:
        """Prompts for ever, with ``prompts(n)``'s system prompts in its order: the *i*-th begins
        with the system prompt of ``prompts(n)[i]`` for any ``n`` > *i* (``random.choices`` draws
        each pick on its own, so the first picks do not depend on ``n``); its question is its own, of
        the same form and length (``prompts(n)``'s questions are drawn after every pick, so they do
        depend on ``n``; a question is never cached by another prompt)."""
        rng = random.Random(f"prompts-{self.seed}")  # (``prompts``' stream: the same picks, in order)
        questions = random.Random(f"listed-questions-{self.seed}")
        systems = self.systems()
        cum = list(itertools.accumulate(self.weights()))
        total, last, letters = cum[-1] + 0.0, len(cum) - 1, "abcdefghij "
        for i in itertools.count():
            k = bisect_right(cum, rng.random() * total, 0, last)  # (``random.choices``' own rule)
            q = f" [question {i}] " + "".join(questions.choices(letters, k=self.question_chars))
            yield systems[k] + q[:self.question_chars]

    def iter_prompts(self) -> Iterator[str]:
        """Prompts for ever, in order, each drawn as it is asked for (deterministic from ``seed``): the
        same systems and Zipf weights as ``prompts``, a stream of its own (not ``prompts(n)``'s
        sequence, which draws every system prompt before any question)."""
        rng = random.Random(f"iter-prompts-{self.seed}")
        systems = self.systems()
        cum = list(itertools.accumulate(self.weights()))
        total, last, letters = cum[-1], len(cum) - 1, "abcdefghij "
        for i in itertools.count():
            k = min(bisect_right(cum, rng.random() * total), last)
            q = f" [question {i}] " + "".join(rng.choices(letters, k=self.question_chars))
            yield systems[k] + q[:self.question_chars]
