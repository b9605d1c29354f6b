"""The base: the vocabulary every plane speaks, and no rule of any plane.

Typed errors, validated fields, record copies (``records``), the persistent
store and the rank table it backs (``persistent``, ``ranks``), the lifecycle
declaration, every option declared once (``options``), the events and
commands, the state records (``state``, ``cluster``, ``bundles``, ``gangmap``)
and the downscale victim order (``victims``). Nothing here imports a plane
(tests/unit/test_layout.py checks it), so each plane can read these records.
"""
