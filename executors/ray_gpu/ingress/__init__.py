"""Ingress: the HTTP app (``http``: starlette + uvicorn in an actor) that routes requests to
deployments through the same router as a handle, and the direct data plane's balancer
(``haproxy``).
"""
