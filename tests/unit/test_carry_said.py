"""How a failed start is said in the deployment's status (``control.carry.said``): the exception's type
and its words. A ``RuntimeEnvSetupError``'s words are only in its text ("Failed to set up runtime
environment" and why, as Serve's status says them), not in its ``repr``."""

from __future__ import annotations

from ray.exceptions import RuntimeEnvSetupError

from executors.ray_gpu.control.carry import said


def test_a_failed_start_is_said_by_its_type_and_words():
    assert said(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    env = said(RuntimeEnvSetupError("Failed to download s3://does_not_exist.zip"))
    assert env.startswith("RuntimeEnvSetupError: Failed to set up runtime environment.")
    assert "s3://does_not_exist.zip" in env
    assert said(ValueError()) == "ValueError()"  # (no words: its repr)
