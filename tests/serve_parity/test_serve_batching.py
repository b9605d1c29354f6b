"""Ray Serve's ``@serve.batch`` deployment tests, run against rankcore's ``serve.batch``.

Source: ray-project/ray, python/ray/serve/tests/test_batching.py, the newest version the search
index holds (the one with the ``batch_size_fn`` cases, 26,269 characters; the index names no
commit for it: other files here are at 090eba776e2d85c3ce1bea884c78db971812e735). Serve runs
these in deployments on a Ray cluster, calling each through a handle or over HTTP. What they
check of batching is the decorator's, so here each runs in-process: the deployment class is a
plain instance (one replica) and concurrent handle calls are concurrent calls of its method;
what needs Serve's HTTP proxy or its private helpers is said at the case. Every case of that
file is here under its own name and parameters, re-expressed against ``from executors.ray_gpu
import serve`` (written anew from what each case checks, not copied); the tally is in
docs/testing.md, "Ray Serve's own tests (tests/serve_parity/)".
"""

from __future__ import annotations

import asyncio

import pytest

from executors.ray_gpu import serve

ORIGIN = "python/ray/serve/tests/test_batching.py (search index version 9268977729, no commit given)"


async def _calls(method, args) -> list:
    """Concurrent calls of ``method``, one per argument (concurrent handle calls to one replica)."""
    return list(await asyncio.gather(*(method(a) for a in args)))


@pytest.mark.asyncio
async def test_batching():
    class BatchingExample:
        def __init__(self):
            self.count = 0

        @serve.batch(max_batch_size=5, batch_wait_timeout_s=1)
        async def handle_batch(self, requests):
            self.count += 1  # once per batch
            return [self.count] * len(requests)

        async def __call__(self, request):
            return await self.handle_batch(request)

    replica = BatchingExample()
    assert max(await _calls(replica, [1] * 20)) < 20  # some batch held more than one call


@pytest.mark.asyncio
async def test_concurrent_batching():
    in_flight, size, wait_s = 2, 5, 1
    most = in_flight * size

    class BatchingExample:
        def __init__(self):
            self.batches = 0
            self.requests = 0

        @serve.batch(max_batch_size=size, batch_wait_timeout_s=wait_s, max_concurrent_batches=in_flight)
        async def handle_batch(self, requests):
            self.batches += 1
            self.requests += len(requests)
            await asyncio.sleep(0.5)
            out = [(r, self.batches, self.requests) for r in requests]
            await asyncio.sleep(0.5)
            self.requests -= len(requests)
            self.batches -= 1
            return out

        async def __call__(self, request):
            return await self.handle_batch(request)

    replica = BatchingExample()
    got = await _calls(replica, range(20))
    assert {idx for idx, _, _ in got} == set(range(20))
    for _, batches, requests in got:  # two full batches at every moment
        assert batches == in_flight, got
        assert requests == most, got


@pytest.mark.asyncio
async def test_batching_exception():
    class NoListReturned:
        @serve.batch(max_batch_size=5)
        async def handle_batch(self, requests):
            return len(requests)

        async def __call__(self, request):
            return await self.handle_batch(request)

    with pytest.raises(TypeError):
        await NoListReturned()(1)


@pytest.mark.asyncio
async def test_batch_generator_streaming_response_integration_test():
    # adapted: Serve wraps each stream in a starlette StreamingResponse and reads the four over
    # HTTP at once; here the four streams are read at once in-process (rankcore's HTTP streams a
    # generator as NDJSON: tests/integration/test_ray_batching.py::test_a_generator_streams_to_each_caller)
    yields = 10

    class Textgen:
        @serve.batch(max_batch_size=4, batch_wait_timeout_s=1000)
        async def batch_handler(self, prompts: list[str]):
            for _ in range(yields):
                yield [{"value": p} for p in prompts]  # unhashable items pass through

        async def value_extractor(self, responses):
            async for response in responses:
                yield response["value"]

        async def __call__(self, prompt):
            return "".join([v async for v in self.value_extractor(self.batch_handler(prompt))])

    replica = Textgen()
    texts = await _calls(replica, [f"hola{i}" for i in range(4)])
    assert texts == [f"hola{i}" * yields for i in range(4)]


@pytest.mark.asyncio
async def test_batching_client_dropped_unary():
    # adapted: an HTTP client hanging up after 5 ms is a caller cancelled after 5 ms
    class ModelUnary:
        @serve.batch(max_batch_size=5)
        async def handle_batch(self, requests):
            await asyncio.sleep(0.05)
            return ["fake-response"] * len(requests)

        async def __call__(self, request):
            return await self.handle_batch(request)

    replica = ModelUnary()
    for _ in range(3):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(replica(None), 0.005)
    assert await asyncio.wait_for(replica(None), 1) == "fake-response"


@pytest.mark.asyncio
async def test_batching_client_dropped_streaming():
    # adapted as test_batching_client_dropped_unary, for a stream
    class ModelStreaming:
        @serve.batch(max_batch_size=3)
        async def handle_batch(self, requests):
            await asyncio.sleep(0.05)
            for i in range(10):
                yield [str(i)] * len(requests)

        async def __call__(self, request):
            return "".join([chunk async for chunk in self.handle_batch(request)])

    replica = ModelStreaming()
    for _ in range(3):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(replica(None), 0.005)
    assert await asyncio.wait_for(replica(None), 1) == "0123456789"


@pytest.mark.skip(reason=(
    "differs: checks Serve's private helpers on the decorated method (_get_curr_iteration_start_times, "
    "_is_batching_task_alive, _get_handling_task_stack) and its long-lived batching task; rankcore's "
    "batcher has no such task (a batch runs as a task when it closes) and shows batches through "
    "Serve's batch metrics instead (docs/metrics.md)"))
@pytest.mark.parametrize("max_concurrent_batches", [1, 10])
@pytest.mark.parametrize("max_batch_size", [1, 10])
@pytest.mark.parametrize("n_requests", [1, 10])
def test_observability_helpers(n_requests, max_batch_size, max_concurrent_batches):
    pass


@pytest.mark.skip(reason=(
    "differs: reads Serve's private _get_serve_batch_request_context() (every request context of the "
    "batch), which rankcore does not have, and expects an empty request context inside the batch; "
    "rankcore runs each batch part in its first caller's request context, so its request_id, route "
    "and model id show there (docs/requests.md, 'Batching', the model ids row)"))
def test_batching_request_context():
    pass


@pytest.mark.asyncio
async def test_batch_size_fn_simple():
    class BatchSizeFnExample:
        def __init__(self):
            self.batches: list = []

        @serve.batch(max_batch_size=100, batch_wait_timeout_s=0.5,
                     batch_size_fn=lambda items: sum(item["size"] for item in items))
        async def handle_batch(self, requests: list):
            self.batches.append(requests)
            return [r["value"] * 2 for r in requests]

        async def __call__(self, request):
            return await self.handle_batch(request)

    replica = BatchSizeFnExample()
    sizes = [(30, 1), (40, 2), (20, 3), (25, 4)]  # the fourth does not fit with the first three
    assert await _calls(replica, [{"size": s, "value": v} for s, v in sizes]) == [2, 4, 6, 8]
    assert replica.batches


@pytest.mark.asyncio
async def test_batch_size_fn_graph_nodes():
    class Graph:
        def __init__(self, num_nodes: int, graph_id: int):
            self.num_nodes, self.graph_id = num_nodes, graph_id

    class GraphBatcher:
        def __init__(self):
            self.batch_sizes: list[int] = []

        @serve.batch(max_batch_size=100, batch_wait_timeout_s=0.5,
                     batch_size_fn=lambda graphs: sum(g.num_nodes for g in graphs))
        async def process_graphs(self, graphs: list):
            self.batch_sizes.append(sum(g.num_nodes for g in graphs))
            return [g.graph_id * g.num_nodes for g in graphs]

        async def __call__(self, graph):
            return await self.process_graphs(graph)

    replica = GraphBatcher()
    graphs = [Graph(30, 1), Graph(40, 2), Graph(35, 3), Graph(50, 4)]
    assert await _calls(replica, graphs) == [30, 80, 105, 200]
    assert all(n <= 100 for n in replica.batch_sizes), replica.batch_sizes


@pytest.mark.asyncio
async def test_batch_size_fn_token_count():
    class TokenBatcher:
        @serve.batch(max_batch_size=1000, batch_wait_timeout_s=0.5,
                     batch_size_fn=lambda sequences: sum(len(s.split()) for s in sequences))
        async def process_sequences(self, sequences: list[str]):
            return [len(s.split()) for s in sequences]

        async def __call__(self, sequence):
            return await self.process_sequences(sequence)

    sequences = ["This is a short sequence",
                 "This is a much longer sequence with many more words in it",
                 "Short",
                 "A B C D E F G H I J"]
    assert await _calls(TokenBatcher(), sequences) == [5, 12, 1, 10]


def test_batch_size_fn_validation():
    with pytest.raises(TypeError, match="batch_size_fn must be a callable or None"):
        @serve.batch(batch_size_fn="not_a_function")
        async def my_batch_handler(items):
            return items


@pytest.mark.asyncio
async def test_batch_size_fn_default_behavior():
    class DefaultBatcher:
        @serve.batch(max_batch_size=5, batch_wait_timeout_s=0.5)
        async def handle_batch(self, requests):
            return [r * 2 for r in requests]

        async def __call__(self, request):
            return await self.handle_batch(request)

    assert await _calls(DefaultBatcher(), range(10)) == [i * 2 for i in range(10)]


@pytest.mark.asyncio
async def test_batch_size_fn_oversized_item_raises_error():
    # adapted: Serve posts to a FastAPI ingress (serve.ingress: no rankcore equivalent) and expects
    # HTTP 500; the error under it, checked here, is the RuntimeError the caller gets
    class OversizedItemBatcher:
        @serve.batch(max_batch_size=10, batch_wait_timeout_s=0.5,
                     batch_size_fn=lambda items: sum(item["size"] for item in items))
        async def handle_batch(self, requests: list):
            return [r["value"] for r in requests]

    with pytest.raises(RuntimeError):
        await OversizedItemBatcher().handle_batch({"size": 15, "value": "too_large"})


@pytest.mark.asyncio
async def test_batch_size_fn_deferred_item_processed():
    class DeferredItemBatcher:
        def __init__(self):
            self.batch_sizes: list[int] = []

        @serve.batch(max_batch_size=10, batch_wait_timeout_s=0.5,
                     batch_size_fn=lambda items: sum(item["size"] for item in items))
        async def handle_batch(self, requests: list):
            self.batch_sizes.append(sum(r["size"] for r in requests))
            return [r["value"] for r in requests]

        async def __call__(self, request):
            return await self.handle_batch(request)

    replica = DeferredItemBatcher()
    requests = [{"size": 6, "value": "a"}, {"size": 6, "value": "b"},
                {"size": 3, "value": "c"}, {"size": 4, "value": "d"}]
    assert set(await _calls(replica, requests)) == {"a", "b", "c", "d"}
    assert sum(replica.batch_sizes) == 19  # every item ran, once


@pytest.mark.asyncio
async def test_batch_size_fn_mixed_normal_and_large_items():
    class MixedSizeBatcher:
        def __init__(self):
            self.batches: list[dict] = []

        @serve.batch(max_batch_size=100, batch_wait_timeout_s=0.5,
                     batch_size_fn=lambda items: sum(item["tokens"] for item in items))
        async def handle_batch(self, requests: list):
            self.batches.append({"total_tokens": sum(r["tokens"] for r in requests), "num_items": len(requests)})
            return [f"processed_{r['id']}" for r in requests]

        async def __call__(self, request):
            return await self.handle_batch(request)

    replica = MixedSizeBatcher()
    tokens = [10, 20, 50, 15, 90, 5]
    requests = [{"id": i + 1, "tokens": t} for i, t in enumerate(tokens)]
    assert set(await _calls(replica, requests)) == {f"processed_{i}" for i in range(1, 7)}
    assert sum(b["total_tokens"] for b in replica.batches) == sum(tokens)
    assert sum(b["num_items"] for b in replica.batches) == len(requests)
