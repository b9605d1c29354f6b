"""The controller and what it keeps: ``controller`` (the actor that runs the
core's driver: its remote methods), ``loops`` (its loops and the observers of
the core's steps), ``carry`` (commands carried out on Ray), ``ledger`` and ``record``
(what survives a controller restart), ``recover``, ``observe`` (facts read from Ray:
actor deaths, nodes, groups), ``proxies``, ``placement``, ``static``, ``cluster``,
``memory`` and ``spares``.
"""
