"""One command -> carrier table per executor (issue 66): every command the core can emit has its
carrier in the simulator and in the Ray executor, and its row in the protocol's answer table
(``rankcore.protocol``); an executor given a command it has no carrier for refuses it."""

from __future__ import annotations

import re
import typing

import pytest

import rankcore as rc
from executors.ray_gpu.control import carry
from executors.sim import world
from rankcore import protocol

COMMANDS = set(typing.get_args(rc.Command))


def test_the_simulator_and_the_ray_executor_carry_out_every_command_and_nothing_else():
    assert set(world.CARRIES) == COMMANDS, COMMANDS ^ set(world.CARRIES)
    assert set(carry.CARRIES) == COMMANDS, COMMANDS ^ set(carry.CARRIES)


def test_the_protocol_table_has_a_row_for_every_command():
    rows = set(re.findall(r"^\| (\w+) +\|", protocol.__doc__ or "", re.M)) - {"command"}
    pool = {t.__name__ for t in typing.get_args(rc.PoolCommand)}
    assert rows == {t.__name__ for t in COMMANDS} | pool


@pytest.mark.parametrize("table", [world, carry], ids=["sim", "ray"])
def test_a_command_with_no_carrier_is_refused_not_dropped(table):
    class Unheard:
        pass

    executor = world.SimBackend.__new__(world.SimBackend) if table is world else carry.Carrier.__new__(carry.Carrier)
    with pytest.raises(TypeError, match="carries out no Unheard"):
        type(executor).execute(executor, [Unheard()], 0.0)


def test_the_architecture_page_names_every_module_of_the_core_and_no_other():
    """docs/architecture.md's tables of the pure side are the module list: a module added or gone
    shows here (issue 66: the picture drawn from the code)."""
    import pathlib

    root = pathlib.Path(rc.__file__).parent
    doc = (root.parent / "docs" / "architecture.md").read_text()
    pure = doc[doc.index("## The pure side"):doc.index("## Placement (the core decides")]
    named = {m for cell in re.findall(r"^\| ([^|]*\.py[^|]*) \|", pure, re.M) for m in re.findall(r"`([\w/]+\.py)`", cell)}
    modules = {p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "__init__.py"}
    assert named == modules, {"not on the page": sorted(modules - named), "not in the code": sorted(named - modules)}


def test_the_architecture_picture_shows_every_module_in_its_folder():
    """The picture at the top of docs/architecture.md names every module of every folder (it had 11
    of control's 17 before issue 66)."""
    import pathlib

    root = pathlib.Path(rc.__file__).parent
    doc = (root.parent / "docs" / "architecture.md").read_text()
    picture = doc[doc.index("```\n  rankcore/__init__.py"):]
    picture = picture[:picture.index("\n```")]
    words = set(re.findall(r"[a-z]+", picture))
    for folder in ("control", "placement", "tiers", "requests", "base"):
        stems = {p.stem for p in (root / folder).glob("*.py") if p.stem != "__init__"}
        assert stems <= words, (folder, sorted(stems - words))
    assert {p.stem for p in root.glob("*.py") if p.stem != "__init__"} <= words
