"""The user's API, as Ray Serve's: ``deployments`` (``@deployment``, ``run``,
``delete``, handles), ``router`` (a handle's request path), ``autoscale`` (the
routers' load pushed to the controller), ``context`` (``get_replica_context``)
and ``local`` (a local testing mode).

Kept empty: a replica's worker imports ``api.context`` and must not pay for
the controller and the handle.
"""
