"""The controller and what it keeps: ``controller`` (the actor that runs the
core's driver), ``carry`` (commands carried out on Ray), ``ledger``,
``persist`` and ``record`` (what survives a controller restart), ``recover``,
``observe`` (facts read from Ray: actor deaths, nodes, groups), ``replicas``
(actor names, the namespace), ``replica`` (the replica actor itself),
``placement``, ``static``, ``cluster``, ``memory`` and ``spares``.
"""
