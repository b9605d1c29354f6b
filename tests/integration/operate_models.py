"""The applications tests/integration/test_ray_operate.py and docs/operate.md deploy from a
config file (``import_path: tests.integration.operate_models:app``)."""

from __future__ import annotations

import os

from executors.ray_gpu import deployment, get_replica_context


@deployment(name="Echo", num_replicas=2, ray_actor_options={"num_cpus": 0.01}, user_config={"greeting": "hello"})
class Echo:
    """Says its rank, its user_config and how often ``reconfigure`` ran in this process."""

    def __init__(self) -> None:
        self.config: dict | None = None
        self.reconfigures = 0

    def reconfigure(self, user_config: dict | None, rank: object) -> None:
        self.config = user_config
        self.reconfigures += 1

    def __call__(self) -> dict:
        ctx = get_replica_context()
        return {"rank": ctx.rank.rank, "replica": ctx.replica_id, "config": self.config,
                "reconfigures": self.reconfigures, "pid": os.getpid()}


app = Echo.bind()


@deployment(name="Hello", num_replicas=1, ray_actor_options={"num_cpus": 0.01})
class Hello:
    def __init__(self, word: str = "hi") -> None:
        self.word = word

    def __call__(self) -> str:
        return self.word


def hello_builder(args: dict) -> object:
    """A Ray Serve application builder: ``args`` from the config file."""
    return Hello.bind(args.get("word", "hi"))


@deployment(name="Broken", num_replicas=1, ray_actor_options={"num_cpus": 0.01}, max_constructor_retry_count=1)
class Broken:
    def __init__(self) -> None:
        raise RuntimeError("this constructor always fails")


broken = Broken.bind()
