"""The replica: the actor that hosts a deployment's class (``actor``) and what the user's code
calls inside it: ``batching`` (``@serve.batch``), ``multiplex`` (``@serve.multiplexed``),
``asgi`` (``@serve.ingress``), ``user_metrics``, and its own gRPC server on the direct data plane
(``direct_grpc``). Beneath the controller (which starts replicas) and above the floor and weights.
"""
