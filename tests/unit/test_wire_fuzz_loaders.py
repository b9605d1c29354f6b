"""Hostile input to the loaders (issue 40, "wire input"): scenario files (``load_scenario`` and
``rankcore simulate``), traces (``check_trace_file`` and ``rankcore check-trace``) and config files
(``config.load`` and ``rankcore deploy``), fuzzed by mutating valid files: truncated at a random byte,
bytes flipped or inserted (non-UTF-8 among them), a value swapped for another type, a huge number
(1e308, 10**100, -1, nan, inf, 5,000 digits), deep nesting (10,000 levels: the YAML composer and
the JSON decoder recurse), a very long string, an alias bomb ("billion laughs").

Each example must end in the loader's typed error (``ScenarioError``, ``TraceFormatError``,
``ConfigError``) with a one-line message, or load; never another exception, never past
``BOUND_S`` (a SIGALRM interrupts a hang and fails the example), never more than ``MEMORY_MB``
of new peak memory (``ru_maxrss``, read after each example). The command line answers each error
with exit status 2 and one ``error:`` line on stderr, run in-process (``CliRunner``), for the
examples whose input the loader refused (a valid scenario would be simulated: not here).
No Ray is started."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import resource
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from executors.checktrace import TraceFormatError, TraceReport, check_trace_file
from executors.cli import main
from executors.ray_gpu.api import config as cf
from executors.ray_gpu.ingress import http as _http  # noqa: F401  (the config checks import it, and Ray: seconds, once)
from executors.scenarios.format import (
    MAX_NODES,
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    Scenario,
    ScenarioError,
    load_scenario,
)
from executors.sim import Simulation

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
#: the config file docs/operate.md shows (the first yaml block), and the same as JSON
DOC_CONFIG = ROOT / "docs" / "operate.md"
#: seconds one example may take (``WIRE_FUZZ_BOUND_S``): the slowest valid example scenario parses in
#: ~0.3 s on a loaded machine, a typical example takes ~10 ms
BOUND_S = float(os.environ.get("WIRE_FUZZ_BOUND_S", "5"))
#: new peak memory one example may add (a file at MAX_YAML_BYTES costs ~20 MB to refuse)
MEMORY_MB = 200

#: examples per fuzzed surface (``WIRE_FUZZ_EXAMPLES``: more for a longer campaign)
EXAMPLES = int(os.environ.get("WIRE_FUZZ_EXAMPLES", "400"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),  # (no ``explain``: it traces
                # every line, 10 times slower, and an example then runs past BOUND_S)
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class Hang(BaseException):
    """An example ran past ``BOUND_S`` (a BaseException: no ``except Exception`` swallows it)."""


@contextlib.contextmanager
def bounded(seconds: float = BOUND_S) -> Iterator[None]:
    """The block ends within ``seconds`` (else ``Hang`` is raised in it) and adds less than
    ``MEMORY_MB`` to the process's peak resident memory."""
    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    before = peak_mb()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert peak_mb() - before < MEMORY_MB, f"peak memory grew {peak_mb() - before:.0f} MB"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (Linux: KiB)


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="wire-fuzz-") as d:
        yield Path(d)


def outcome(got: object) -> None:
    """Count what an example ended in (``--hypothesis-show-statistics`` lists the counts)."""
    if not isinstance(got, Exception):
        event(f"loaded: {type(got).__name__}")
        return
    text = str(got)
    for words in ("refused", "bad YAML", "not valid YAML", "not UTF-8", "not JSON", "longer than", "cannot read"):
        if words in text:
            event(f"{type(got).__name__}: {words}")
            return
    event(f"{type(got).__name__}: a field")


def one_line(message: str) -> None:
    assert message and len(message.splitlines()) == 1, repr(message)
    assert "Traceback" not in message


def cli_refuses(args: list[str]) -> str:
    """The command exits 2 with one ``error:`` line on stderr (and no traceback); returns it."""
    with bounded():
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    return result.stderr


# ------------------------------------------------------------------ hostile values
DEEP = 10_000
#: placeholders a structured mutation writes, replaced by raw text no dumper would write
RAW_YAML = {
    "__DEEP_LIST__": "[" * DEEP + "]" * DEEP,
    "__DEEP_MAP__": "{a: " * DEEP + "1" + "}" * DEEP,
    "__BIG_INT__": "9" * 5000,
    "__BOMB__": "[" + ", ".join(
        [f"&a0 [{', '.join(['lol'] * 10)}]"]
        + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]) + "]",
    "__SELF__": "&self [1, *self]",
    "__NAN__": ".nan",
    "__INF__": "-.inf",
}
RAW_JSON = {
    "__DEEP_LIST__": "[" * 100_000 + "]" * 100_000,
    "__DEEP_MAP__": '{"a":' * DEEP + "1" + "}" * DEEP,
    "__BIG_INT__": "9" * 5000,
    "__NAN__": "NaN",
    "__INF__": "-Infinity",
}
PLAIN = [None, True, False, 0, -1, 1, 2**63, 10**100, -(10**100), 1e308, -1e308, 5e-324, math.nan, math.inf,
         -math.inf, "", " ", "x" * 100_000, "é\u2028\n\r\x1c", "[", "{a: 1}", "0x1F", "1e400", "~", "null",
         [], {}, [1, "a", None], {"": None}, {"x": {"y": [1, {"z": []}]}}, ["x" * 1000] * 100]
VALUES = st.one_of(st.sampled_from(PLAIN), st.sampled_from(sorted(RAW_YAML)),
                   st.text(max_size=30), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                   st.lists(st.integers(), max_size=5), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


def replace_at(data: Any, path: list[int], value: Any, rename: bool) -> Any:
    """``data`` with the value ``path`` leads to (each step an index into a list or the keys of a
    mapping, modulo their count; it stops at a scalar) replaced by ``value``; ``rename``: the key
    of a mapping's entry replaced instead (when the value ``value`` is a string)."""
    if not path or not isinstance(data, (dict, list)) or not data:
        return value
    i, rest = path[0], path[1:]
    if isinstance(data, list):
        i %= len(data)
        return [replace_at(x, rest, value, rename) if n == i else x for n, x in enumerate(data)]
    keys = list(data)
    key = keys[i % len(keys)]
    if rename and not rest and isinstance(value, str):
        return {(value if k == key else k): v for k, v in data.items()}
    return {k: (replace_at(v, rest, value, rename) if k == key else v) for k, v in data.items()}


#: bytes that mean something to YAML or JSON (or to a decoder: 0x80, 0xC3, 0xFE, 0xFF are not UTF-8 alone)
SPECIAL_BYTES = [0x00, 0x09, 0x0A, 0x0D, *b':[]{}&*!|>-"\'\\#%@`,?', 0x80, 0xC3, 0xFE, 0xFF]
#: the valid files mutations start from, by name (the strategies take a name: a failing example
#: then prints the name, not the whole file)
ORIGINALS: dict[str, bytes] = {}
BYTE_KINDS = ("truncate", "flip", "insert")


@st.composite
def mutated(draw: Any, name: str, kinds: tuple[str, ...] = (*BYTE_KINDS, "value", "value", "value")) -> bytes:
    """A hostile variant of the valid file ``ORIGINALS[name]`` (YAML, or JSON Lines for a ``.jsonl``)."""
    original = ORIGINALS[name]
    kind = draw(st.sampled_from(kinds))
    if kind == "truncate":
        return original[:draw(st.integers(0, max(0, len(original) - 1)))]
    if kind in ("flip", "insert"):
        out = bytearray(original)
        binary = draw(st.sampled_from([False] * 4 + [True]))  # (any byte: mostly not UTF-8 then)
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, max(0, len(out) - 1)))
            byte = draw(st.sampled_from(SPECIAL_BYTES) | st.integers(0, 255 if binary else 127))
            if kind == "flip" and out:
                out[at] = byte
            else:
                out[at:at] = bytes([byte]) * draw(st.sampled_from([1, 1, 2, 1000]))
        return bytes(out)
    path = draw(st.lists(st.integers(0, 1000), max_size=7))
    value = draw(VALUES)
    rename = draw(st.booleans())
    if name.endswith(".jsonl"):
        lines = original.decode().splitlines()
        n = draw(st.integers(0, len(lines) - 1))
        text = json.dumps(replace_at(json.loads(lines[n]), path, value, rename))
        for k, v in {**RAW_JSON, "__BOMB__": "[]", "__SELF__": "[]"}.items():
            text = text.replace(json.dumps(k), v)
        lines[n] = text
        return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    data = replace_at(yaml.safe_load(original), path, value, rename)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10**9)
    for k, v in RAW_YAML.items():
        text = text.replace(k, v)
    return text.encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------ scenario files
ORIGINALS.update({p.name: p.read_bytes() for p in SCENARIOS})


def a_refusal_naming_the_file(got: Exception, path: Path, command: str) -> None:
    """A loader's refusal of ``path``: one line starting with the path, and ``rankcore <command> path``
    exits 2 with that same line."""
    one_line(str(got))
    assert str(got).startswith(str(path))
    assert cli_refuses([command, str(path)]) == f"error: {got}\n"


def refused_quickly_in_one_line(path: Path, text: str, words: str, load: Any, error: type, command: str) -> None:
    """``text`` written to ``path`` is refused by ``load`` with an ``error`` naming ``words``, within 2 s,
    in one line, and ``rankcore <command> path`` exits 2 with that same line."""
    path.write_text(text)
    t0 = time.monotonic()
    got = load(path)
    assert isinstance(got, error) and words in str(got), got
    assert time.monotonic() - t0 < 2.0
    one_line(str(got))
    assert cli_refuses([command, str(path)]) == f"error: {got}\n"


def load_or_refuse(path: Path) -> Scenario | ScenarioError:
    with bounded():
        try:
            return load_scenario(path)
        except ScenarioError as exc:
            return exc


@FUZZ
@given(data=st.data(), name=st.sampled_from([p.name for p in SCENARIOS]))
def test_a_mutated_scenario_loads_or_is_one_scenario_error_line(data: Any, name: str, workdir: Path) -> None:
    text = data.draw(mutated(name))
    path = workdir / name
    path.write_bytes(text)
    got = load_or_refuse(path)
    outcome(got)
    if isinstance(got, ScenarioError):
        a_refusal_naming_the_file(got, path, "simulate")
    else:
        assert isinstance(got, Scenario)


def _bomb(levels: int) -> str:
    lines = ["lol: &a0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


#: hostile files that must be refused, quickly, with these words (the regressions fuzzing found)
REFUSED_SCENARIOS = {
    "billion_laughs": (_bomb(9) + "cluster: {nodes: 1}\n", "MAX_YAML_NODES"),
    "alias_in_itself": ("cluster: &c {nodes: 1, x: [*c]}\n", "inside its own anchor"),
    "deep_list": ("cluster: " + "[" * DEEP + "]" * DEEP + "\n", f"nested deeper than {MAX_YAML_DEPTH}"),
    "deep_map": ("cluster: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n", f"nested deeper than {MAX_YAML_DEPTH}"),
    "deep_block": ("".join("  " * i + "- \n" for i in range(1000)), f"nested deeper than {MAX_YAML_DEPTH}"),
    "oversized": ("description: '" + "x" * MAX_YAML_BYTES + "'\n", "MAX_YAML_BYTES"),
    "nodes_10e100": ("cluster: {nodes: 1" + "0" * 100 + "}\ndeployments: {a: {}}\ntimeline: [{deploy: a}]\n",
                     f"above {MAX_NODES:,}"),
    "node_count_10e100": ("cluster: {nodes: [{name: n, count: 1" + "0" * 100 + "}]}\ndeployments: {a: {}}\n"
                          "timeline: [{deploy: a}]\n", f"above {MAX_NODES:,}"),
    "int_of_5000_digits": ("seed: " + "9" * 5000 + "\n", "4300 digits"),
    "inf_gpus": ("cluster: {nodes: 1, gpus_per_node: .inf}\ndeployments: {a: {}}\ntimeline: [{deploy: a}]\n",
                 "finite"),
    "huge_duration": ("duration: 1" + "0" * 400 + "\ncluster: {nodes: 1}\ndeployments: {a: {}}\n"
                      "timeline: [{deploy: a}]\n", "finite"),
    "lognormal_sigma_1e200": ("cluster: {nodes: 1}\nlatency: {start: {dist: lognormal, median: 1, sigma: 1.0e+200}}\n"
                              "deployments: {a: {}}\ntimeline: [{deploy: a}]\n", "sigma must be <= 50"),
    "arrival_kind_a_list": ("cluster: {nodes: 1}\ndeployments: {a: {}}\ntimeline: [{deploy: a}]\nduration: 10\n"
                            "traffic: {a: {arrivals: {kind: [poisson]}, service: 1}}\n", "unknown arrival kind"),
    "latency_dist_a_mapping": ("cluster: {nodes: 1}\nlatency: {start: {dist: {}}}\ndeployments: {a: {}}\n"
                               "timeline: [{deploy: a}]\n", "unknown dist"),
    "nul_byte": ("cluster: \x00\n", "bad YAML"),
    "newline_in_a_key": ('"bad\\nkey": 1\ncluster: {nodes: 1}\n', "unknown field"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_SCENARIOS))
def test_hostile_scenarios_are_refused_quickly_in_one_line(case: str, workdir: Path) -> None:
    refused_quickly_in_one_line(workdir / f"{case}.yaml", *REFUSED_SCENARIOS[case], load_or_refuse, ScenarioError,
                                "simulate")


def test_non_utf8_and_unreadable_scenarios_are_one_line(workdir: Path) -> None:
    bad = workdir / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\ncluster: {nodes: 1}\n")
    assert cli_refuses(["simulate", str(bad)]) == f"error: {bad}: not UTF-8 text: byte 0xe9 at offset 9\n"
    missing = workdir / "missing.yaml"
    assert cli_refuses(["simulate", str(missing)]) == f"error: {missing}: cannot read: No such file or directory\n"


def test_an_api_override_past_pythons_digit_limit_is_named_not_a_value_error() -> None:
    """``load_scenario(..., overrides=...)`` from Python (the CLI's ``--set`` is bounded by its YAML
    checks): an int past Python's 4,300-digit ``str`` limit in a value was a ValueError out of the
    error message itself; now the message names it."""
    with pytest.raises(ScenarioError) as exc:
        load_scenario(SCENARIOS[0], overrides={"cluster.nodes": [10**5000]})
    text = str(exc.value)
    assert "--set cluster.nodes=a list too large to show" in text and "an int of about 5001 digits" in text, text
    assert len(text) < 400, len(text)


def test_the_alias_bound_leaves_shared_values_alone(workdir: Path) -> None:
    """Aliases are fine below the bound: one anchor used many times, and 10^4 values expanded."""
    four = ", ".join([f"&a0 [{', '.join(['lol'] * 10)}]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]"
                                                              for i in range(1, 4)])
    assert MAX_YAML_NODES > 10**4
    path = workdir / "aliases.yaml"
    path.write_text("cluster: {nodes: 2}\nlatency: {start: &lat {dist: normal, mean: 5, stddev: 1}, stop: *lat}\n"
                    f"deployments: {{a: {{replicas: 2, latency: {{start: *lat}}, user_config: [{four}]}}}}\n"
                    "timeline: [{deploy: a}]\n")
    got = load_or_refuse(path)
    assert isinstance(got, Scenario), got
    assert len(got.deployments["a"].user_config[3][9][9][9]) == 10


# ------------------------------------------------------------------ traces
@pytest.fixture(scope="module")
def trace_name() -> str:
    """A valid trace (the downscale example, simulated) in ``ORIGINALS``; its name."""
    sc = load_scenario(ROOT / "examples" / "scenarios" / "downscale-8-to-4.yaml")
    fp = io.StringIO()
    Simulation(sc, trace=fp).run()
    ORIGINALS["downscale.jsonl"] = text = fp.getvalue().encode()
    assert check_trace_file_bytes(text).ok
    return "downscale.jsonl"


def check_trace_file_bytes(text: bytes, path: Path | None = None) -> TraceReport:
    with tempfile.TemporaryDirectory() as d:
        p = path or Path(d, "t.jsonl")
        p.write_bytes(text)
        return check_trace_file(p)


def check_or_refuse(path: Path) -> TraceReport | TraceFormatError:
    with bounded():
        try:
            return check_trace_file(path)
        except TraceFormatError as exc:
            return exc


@st.composite
def mutated_trace(draw: Any, name: str) -> bytes:
    """Bytes mutated, one record's value swapped (``mutated``), or whole lines dropped, repeated,
    swapped, blank or 2 MB long."""
    kind = draw(st.sampled_from(["bytes", "record", "record", "lines"]))
    if kind == "bytes":
        return draw(mutated(name, BYTE_KINDS))
    if kind == "record":
        return draw(mutated(name, ("value",)))
    out = ORIGINALS[name].splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(out) - 1))
        op = draw(st.sampled_from(["drop", "repeat", "swap", "blank", "huge"]))
        if op == "drop" and len(out) > 1:
            del out[i]
        elif op == "repeat":
            out.insert(i, out[i])
        elif op == "swap":
            j = draw(st.integers(0, len(out) - 1))
            out[i], out[j] = out[j], out[i]
        elif op == "blank":
            out.insert(i, b"   \n")
        else:
            out.insert(i, b'{"kind":"fault","t":1,"type":"' + b"x" * 2_000_000 + b'"}\n')
    return b"".join(out)


@FUZZ
@given(data=st.data())
def test_a_mutated_trace_checks_or_is_one_trace_format_error_line(data: Any, trace_name: str, workdir: Path) -> None:
    text = data.draw(mutated_trace(trace_name))
    path = workdir / "fuzzed.jsonl"
    path.write_bytes(text)
    got = check_or_refuse(path)
    outcome(got)
    if isinstance(got, TraceFormatError):
        a_refusal_naming_the_file(got, path, "check-trace")
    else:
        assert isinstance(got, TraceReport)
        got.summary()
        for v in got.violations:
            one_line(v)
        result = CliRunner().invoke(main, ["check-trace", str(path)])
        assert result.exit_code == (0 if got.ok else 1), result.output
        assert "Traceback" not in result.output


HEADER = b'{"kind":"header","schema":"rankcore-trace","version":3}\n'
REFUSED_TRACES = {
    "deep_list": (HEADER + b"[" * 100_000 + b"\n", "nested too deeply"),
    "deep_object": (HEADER + b'{"a":' * 100_000 + b"\n", "nested too deeply"),
    "int_of_5000_digits": (HEADER + b'{"kind":"fault","t":' + b"9" * 5000 + b',"type":"x"}\n', "line 2: not JSON"),
    "nan_time": (HEADER + b'{"kind":"fault","t":NaN,"type":"x"}\n', "finite number"),
    "infinite_time": (HEADER + b'{"kind":"fault","t":1e999,"type":"x"}\n', "finite number"),
    "not_utf8": (HEADER + b'{"kind":"fault","t":1,"type":"\xff"}\n', "not UTF-8"),
    "number_header": (b"12\n", "first record must be its header"),
    "header_version_huge": (b'{"kind":"header","schema":"rankcore-trace","version":1e308}\n', "version"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_TRACES))
def test_hostile_traces_are_refused_in_one_line(case: str, workdir: Path) -> None:
    text, words = REFUSED_TRACES[case]
    path = workdir / f"{case}.jsonl"
    path.write_bytes(text)
    got = check_or_refuse(path)
    assert isinstance(got, TraceFormatError) and words in str(got), got
    one_line(str(got))
    assert cli_refuses(["check-trace", str(path)]) == f"error: {got}\n"


def test_a_line_without_end_is_refused_without_reading_it_whole(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of one endless line: refused at ``MAX_LINE_BYTES`` (made 1 MiB here), not read whole."""
    from executors import checktrace

    monkeypatch.setattr(checktrace, "MAX_LINE_BYTES", 1 << 20)
    path = workdir / "endless.jsonl"
    with open(path, "wb") as fp:
        fp.write(HEADER)
        fp.write(b"[" + b"1," * (8 << 20))  # 16 MiB, no line break
    got = check_or_refuse(path)
    assert isinstance(got, TraceFormatError) and "line 2: longer than 1,048,576 bytes" in str(got), got


# ------------------------------------------------------------------ config files
def doc_config() -> bytes:
    import re

    block = re.search(r"```yaml\n(.*?)```", DOC_CONFIG.read_text(), re.S)
    assert block is not None
    return block.group(1).encode()


CONFIGS = ("deploy.yaml", "deploy.json")
ORIGINALS.update({"deploy.yaml": doc_config(),
                  "deploy.json": json.dumps(yaml.safe_load(doc_config()), indent=1).encode()})


def load_config_or_refuse(path: Path) -> cf.ServeConfig | cf.ConfigError:
    with bounded(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cf.load(path)
        except cf.ConfigError as exc:
            return exc


@FUZZ
@given(data=st.data(), name=st.sampled_from(CONFIGS))
def test_a_mutated_config_loads_or_is_one_config_error_line(data: Any, name: str, workdir: Path) -> None:
    text = data.draw(mutated(name))
    path = workdir / name
    path.write_bytes(text)
    got = load_config_or_refuse(path)
    outcome(got)
    if isinstance(got, cf.ConfigError):
        a_refusal_naming_the_file(got, path, "deploy")
    else:
        assert isinstance(got, cf.ServeConfig)


REFUSED_CONFIGS = {
    "billion_laughs": (_bomb(9) + "applications: []\n", "MAX_YAML_NODES"),
    "deep_list": ("applications: " + "[" * DEEP + "]" * DEEP + "\n", f"nested deeper than {MAX_YAML_DEPTH}"),
    "deep_json": ('{"applications": ' + "[" * DEEP + "]" * DEEP + "}\n", f"nested deeper than {MAX_YAML_DEPTH}"),
    "list_as_key": ("? [a, b]\n: 1\n", "a key must be a plain value"),
    "mapping_as_key": ("{? {a: 1} : 1}\n", "a key must be a plain value"),
    "int_of_5000_digits": ("http_options: {port: " + "9" * 5000 + "}\n", "4300 digits"),
    "port_10e100": ("http_options: {port: 1" + "0" * 100 + "}\n", "must be in 0..65535"),
    "nul_byte": ("applications: \x00\n", "not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CONFIGS))
def test_hostile_configs_are_refused_quickly_in_one_line(case: str, workdir: Path) -> None:
    refused_quickly_in_one_line(workdir / f"{case}.yaml", *REFUSED_CONFIGS[case], load_config_or_refuse,
                                cf.ConfigError, "deploy")


def test_a_non_utf8_config_is_one_line(workdir: Path) -> None:
    bad = workdir / "latin1-deploy.yaml"
    bad.write_bytes(b"applications: []\n# caf\xe9\n")
    assert cli_refuses(["deploy", str(bad)]) == f"error: {bad}: not UTF-8 text: byte 0xe9 at offset 22\n"


def test_the_hypothesis_values_reach_the_loaders() -> None:
    """The mutations are not vacuous: a value swap lands in the file, a raw placeholder is replaced."""
    rng = random.Random(0)
    original = ORIGINALS["downscale-8-to-4.yaml"]
    swapped = replace_at(yaml.safe_load(original), [rng.randrange(9), 0], "__DEEP_LIST__", False)
    text = yaml.safe_dump(swapped, sort_keys=False)
    assert "__DEEP_LIST__" in text
    assert RAW_YAML["__DEEP_LIST__"] in text.replace("__DEEP_LIST__", RAW_YAML["__DEEP_LIST__"])
