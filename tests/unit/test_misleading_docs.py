"""Issue 19, "docs and defaults that misled": what a new user tripped on."""

from __future__ import annotations

import io
import pathlib

import pytest

import rankcore as rc
from executors.trace import SCHEMA, VERSION, TraceWriter, read_trace


def _trace(path: pathlib.Path) -> pathlib.Path:
    with open(path, "w") as fp:
        w = TraceWriter(fp, meta={"executor": "test"})
        w.write({"kind": "fault", "t": 1.0, "what": "node_lost"})
    return path


def test_read_trace_takes_a_path_str(tmp_path):
    recs = list(read_trace(str(_trace(tmp_path / "run.jsonl"))))
    assert [r["kind"] for r in recs] == ["header", "fault"]
    assert recs[0]["schema"] == SCHEMA and recs[0]["version"] == VERSION


def test_read_trace_takes_a_pathlike(tmp_path):
    recs = list(read_trace(_trace(tmp_path / "run.jsonl")))
    assert [r["kind"] for r in recs] == ["header", "fault"]


def test_read_trace_takes_an_open_file_and_lines(tmp_path):
    path = _trace(tmp_path / "run.jsonl")
    with open(path) as fp:
        assert [r["kind"] for r in read_trace(fp)] == ["header", "fault"]
    lines = path.read_text().splitlines()
    assert [r["kind"] for r in read_trace(lines)] == ["header", "fault"]
    assert [r["kind"] for r in read_trace(io.StringIO(path.read_text()))] == ["header", "fault"]


def test_read_trace_of_a_missing_path_says_so(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_trace(tmp_path / "nope.jsonl"))


def test_a_rank_listing_a_bundle_twice_is_named_so():
    with pytest.raises(rc.InvalidConfig, match="rank 0 lists bundle 0 twice") as err:
        rc.StaticPlacement.from_mapping("pg", ["n0"] * 4, {0: [0, 0]})
    assert "to rank 0 and to rank 0" not in str(err.value)
    with pytest.raises(rc.InvalidConfig, match="rank 1 lists bundle 3 twice"):
        rc.StaticPlacement.from_mapping("pg", ["n0"] * 4, {0: [0, 1], 1: [2, 3, 3]})
    # two ranks sharing a bundle keep their own message
    with pytest.raises(rc.InvalidConfig, match="bundle 1 is given to rank 0 and to rank 1"):
        rc.StaticPlacement.from_mapping("pg", ["n0"] * 4, {0: [0, 1], 1: [1, 2]})


def test_ask_is_exported_where_docs_ray_md_calls_it():
    import executors.ray_gpu as rg
    from executors.ray_gpu.api.deployments import ask

    assert rg.ask is ask and "ask" in rg.__all__
    assert "get_controller" in rg.__all__
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "ray.md").read_text()
    assert 'ask(get_controller(), "status")' in text


def test_the_protocol_table_lists_every_field_of_every_command():
    """docs/architecture.md's protocol table names each command with all its fields, in order."""
    import re
    import typing

    import attrs

    from rankcore.base import commands

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    section = text.split("## Protocol between core and executor", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)\(([^)]*)\)` \|", section, re.M))
    every = (*typing.get_args(commands.Command), *typing.get_args(commands.PoolCommand))
    for cls in every:
        assert cls.__name__ in rows, f"the protocol table lacks {cls.__name__}"
        listed = [x.strip() for x in rows[cls.__name__].split(",")]
        assert listed == [a.name for a in attrs.fields(cls)], f"{cls.__name__}: table lists {listed}"
    assert set(rows) == {cls.__name__ for cls in every}
