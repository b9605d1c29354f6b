"""The prefix (KV) cache model and the shared-prefix workload (executors/sim/prefixcache.py, issue 68):
a cache holds whole blocks chained over the prompt's beginning, least recently used out past its
bound; the model's times; the workload's prompts are deterministic from the seed, Zipf-skewed, and
the keys a scenario's ``traffic.<d>.prefix_cache`` takes are these classes' fields."""

from __future__ import annotations

import attrs
import pytest

from executors.scenarios.format import PREFIX_MODEL_KEYS, PREFIX_WORKLOAD_KEYS
from executors.sim.prefixcache import KVCache, PrefixCacheModel, SharedPrefixWorkload, _chain

A, B, C, D = "a" * 16, "b" * 16, "c" * 16, "d" * 16


def test_a_prompt_seen_before_is_cached_in_whole_blocks():
    cache = KVCache(block_chars=16, capacity_blocks=100)
    prompt = A + B + "tail"  # (2 whole blocks and 4 characters that fill none)
    assert cache.take(prompt) == 0
    assert len(cache.blocks) == 2
    assert cache.take(prompt) == 32
    assert cache.take(A + C) == 16  # the shared first block only
    assert cache.take(A + B + C + D) == 32
    assert (cache.hit_chars, cache.prompt_chars) == (80, 36 + 36 + 32 + 64)


def test_a_block_matches_only_after_the_same_beginning():
    cache = KVCache(block_chars=16, capacity_blocks=100)
    cache.take(A + B)
    assert cache.take(B) == 0  # B alone is another block than B after A (a KV cache's pages)
    assert cache.take(C + B) == 0
    assert cache.take(A + C + B) == 16  # (B after A + C is yet another block)
    # the blocks are the chained hashes the module says, least recently used first
    fresh = KVCache(block_chars=16, capacity_blocks=100)
    fresh.take(A + B)
    assert list(fresh.blocks) == [_chain(b"", A), _chain(_chain(b"", A), B)]


def test_the_cache_keeps_at_most_its_bound_least_recently_used_out():
    cache = KVCache(block_chars=16, capacity_blocks=4)
    cache.take(A + B)
    cache.take(C + D)
    assert len(cache.blocks) == 4
    assert cache.take(A + B) == 32  # used again: now the most recent
    cache.take(D + C)  # 2 new blocks: C + D's, the least recent, go
    assert len(cache.blocks) == 4
    assert cache.take(C + D) == 0  # gone (and back in, pushing A + B's out: they were least recent)
    assert cache.take(D + C) == 32
    assert cache.take(A + B) == 0
    big = KVCache(block_chars=4, capacity_blocks=3)
    assert big.take("x" * 40) == 0 and len(big.blocks) == 3  # one prompt longer than the bound


@pytest.mark.parametrize("block_chars, capacity", [(0, 10), (16, 0), (-1, -1)])
def test_a_cache_without_room_is_refused(block_chars, capacity):
    with pytest.raises(ValueError, match="must be >= 1"):
        KVCache(block_chars, capacity)


def test_the_model_charges_the_prefill_of_what_was_not_cached():
    m = PrefixCacheModel(base_s=0.01, prefill_s_per_char=0.001, decode_s=0.5, block_chars=8, capacity_blocks=7)
    assert m.ttft_s(100, 0) == pytest.approx(0.11)
    assert m.ttft_s(100, 60) == pytest.approx(0.05)
    assert m.ttft_s(100, 100) == pytest.approx(0.01)
    assert m.ttft_s(10, 50) == pytest.approx(0.01)  # (never below base_s)
    c = m.cache()
    assert (c.block_chars, c.capacity) == (8, 7) and c is not m.cache()  # (each replica its own)


def test_the_workload_is_deterministic_and_shaped_as_told():
    w = SharedPrefixWorkload(system_prompts=20, zipf_s=1.2, system_chars=200, question_chars=30, seed=4)
    prompts = w.prompts(300)
    assert prompts == SharedPrefixWorkload(system_prompts=20, zipf_s=1.2, system_chars=200, question_chars=30,
                                           seed=4).prompts(300)
    assert prompts != attrs.evolve(w, seed=5).prompts(300)
    assert all(len(p) == 230 for p in prompts)
    systems = w.systems()
    assert len(systems) == len(set(systems)) == 20 and all(len(s) == 200 for s in systems)
    assert all(p[:200] in systems for p in prompts)
    assert len(set(prompts)) == 300  # (each its own question)


def test_iter_prompts_draws_the_same_prompts_one_at_a_time():
    w = SharedPrefixWorkload(system_prompts=50, zipf_s=1.1, system_chars=100, question_chars=20, seed=9)
    first, second = w.iter_prompts(), w.iter_prompts()
    a = [next(first) for _ in range(500)]
    assert a == [next(second) for _ in range(500)]
    assert a != [p for p, _ in zip(attrs.evolve(w, seed=10).iter_prompts(), range(500))]
    systems = w.systems()
    counts = [sum(p.startswith(s) for p in a) for s in systems]
    assert sum(counts) == 500 and all(len(p) == 120 for p in a)
    assert counts[0] == max(counts) and counts[0] > 5 * sum(counts[-10:]) / 10  # Zipf: the first is hot
    flat = SharedPrefixWorkload(system_prompts=5, zipf_s=0, system_chars=50, question_chars=0, seed=1)
    picks = [p for p, _ in zip(flat.iter_prompts(), range(1000))]
    assert all(150 < picks.count(s) < 250 for s in flat.systems())  # zipf_s 0: evenly
    assert set(picks) == set(flat.systems())  # (no question: the system prompt alone)


def test_a_skewed_workload_finds_its_hot_prompts_cached():
    w = SharedPrefixWorkload(system_prompts=100, zipf_s=1.4, system_chars=160, question_chars=16, seed=2)
    hot, flat = KVCache(16, 200), KVCache(16, 200)  # (room for 18 system prompts of 10 blocks + 1)
    for p in w.prompts(2000):
        hot.take(p)
    for p in attrs.evolve(w, zipf_s=0.0).prompts(2000):
        flat.take(p)
    assert hot.hit_chars / hot.prompt_chars > 2 * flat.hit_chars / flat.prompt_chars


def test_the_scenario_keys_are_the_classes_fields():
    assert set(PREFIX_WORKLOAD_KEYS) == {f.name for f in attrs.fields(SharedPrefixWorkload)} - {"seed"}
    assert set(PREFIX_MODEL_KEYS) == {f.name for f in attrs.fields(PrefixCacheModel)}
