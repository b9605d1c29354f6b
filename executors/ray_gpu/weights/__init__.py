"""Weights: tiers on Ray (``weights``: GPU, CPU and disk copies of a model),
``store`` (where a replica's weights live), ``shared`` (CUDA IPC / shared
memory views), ``replica`` (a replica's side of sleep / wake) and
``warm_cache`` (the WARM copies a node keeps).
"""
