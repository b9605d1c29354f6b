"""The gRPC tests' stubs (tests/integration/protos/) are what grpcio-tools generates from
echo.proto today: a changed proto, or a new grpcio-tools, regenerates them (the command is in
echo.proto's header)."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTOS = Path("tests") / "integration" / "protos"


def test_the_checked_in_stubs_are_generated_from_echo_proto(tmp_path: Path) -> None:
    (tmp_path / PROTOS).mkdir(parents=True)
    shutil.copy(ROOT / PROTOS / "echo.proto", tmp_path / PROTOS / "echo.proto")
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(tmp_path / PROTOS / "echo.proto")]) == 0
    for name in ("echo_pb2.py", "echo_pb2_grpc.py"):
        assert (tmp_path / PROTOS / name).read_text() == (ROOT / PROTOS / name).read_text(), name
