"""The user's front doors, as Ray Serve's: ``deployments`` (``@deployment``, ``run``,
``delete``, handles), ``config`` (the config file), ``apps`` (applications deployed, deleted,
their status), ``rest`` (the dashboard's REST API) and ``local`` (a local testing mode). The top
plane: it imports the planes beneath, none imports it.
"""
