"""The Ray executor's floor: what every plane above speaks. The actors' names and namespace
(``replicas``), the KV store (``persist``), the application of a deployment (``appnames``), the
words of HTTP and gRPC (``httpwords``, ``grpc_context``, ``access``, the shared gRPC front
``grpc_proxy``), a request's context (``context``), what a deployment exposes (``exposed``), the
by-value frames (``by_value``), the direct data plane's headers (``direct``), the handle's router
(``router``, ``autoscale``, ``witness``), code fingerprints (``fingerprint``) and the metric
families (``metrics``). It imports no plane of the executor (tests/unit/test_import_graph.py).

Kept empty: a replica's worker imports ``base.context`` and must not pay for the rest.
"""
