"""The config file of ``rankcore deploy`` (executors/ray_gpu/api/config.py): Ray Serve's schema
read into attrs records with cattrs, errors naming the file, the key path and the line, the
doc's file, ``rankcore build``'s round trip, and the CLI's exit status 2 on bad input. No Ray
cluster is started here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from click.testing import CliRunner

import rankcore as rc
from executors.cli import main
from executors.ray_gpu.api import config as cf
from executors.ray_gpu.api.deployments import deployment

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operate.md"


def doc_config() -> str:
    """The first yaml block of docs/operate.md: the config file it shows."""
    return re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S).group(1)  # type: ignore[union-attr]


def write(tmp_path: Path, text: str, name: str = "deploy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_the_docs_config_file_loads_into_typed_records(tmp_path: Path) -> None:
    cfg = cf.load(write(tmp_path, doc_config()))
    assert cfg.proxy_location == "HeadOnly"
    assert cfg.http_options == cf.HTTPOptions(host="127.0.0.1", port=8000)
    echo, hello = cfg.applications
    assert (echo.name, echo.route_prefix, echo.import_path) == ("echo", "/echo", "tests.integration.operate_models:app")
    (d,) = echo.deployments
    assert d.to_options() == {"num_replicas": 2, "user_config": {"greeting": "hello"},
                              "ray_actor_options": {"num_cpus": 0.01}}
    assert hello.args == {"word": "bonjour"} and hello.deployments == ()
    assert cfg.warnings == ()


def test_serve_defaults_for_what_is_left_out() -> None:
    cfg = cf.parse({"applications": [{"import_path": "m:app"}]})
    (app,) = cfg.applications
    assert (app.name, app.route_prefix, app.args, app.runtime_env) == ("default", "/", {}, {})
    assert cfg.proxy_location == "EveryNode" and cfg.grpc_options.port == 9000


@pytest.mark.parametrize(("change", "path", "line", "message"), [
    ("num_replicas: 2.5", "applications[0].deployments[0].num_replicas", 13, 'expected an int or "auto", got float 2.5'),
    ("num_replicas: '2'", "applications[0].deployments[0].num_replicas", 13, "got str '2'"),
    ("bogus: 2", "applications[0].deployments[0].bogus", 13, "unknown key 'bogus' (keys here: "),
    ("max_replicas_per_node: 2", "applications[0].deployments[0].max_replicas_per_node", 13, "not supported"),
    ("num_replicas: -1", "applications[0].deployments[0].num_replicas", 13, "num_replicas"),
    ("max_ongoing_requests: 0", "applications[0].deployments[0].max_ongoing_requests", 13, "max_ongoing_requests"),
    ("health_check_period_s: -3", "applications[0].deployments[0].health_check_period_s", 13, "-3"),
    ("version: 7", "applications[0].deployments[0].version", 13, "expected a string"),
    ("max_unavailable: -1", "applications[0].deployments[0].max_unavailable", 13, "max_unavailable"),
])
def test_an_error_names_the_file_the_key_path_and_the_line(tmp_path: Path, change: str, path: str, line: int,
                                                           message: str) -> None:
    text = doc_config().replace("num_replicas: 2", change, 1)
    f = write(tmp_path, text)
    with pytest.raises(cf.ConfigError) as exc:
        cf.load(f)
    err = exc.value
    assert (err.source, err.path, err.line) == (str(f), path, line)
    assert message in err.message
    assert str(err).startswith(f"{f}:{line}: {path}: ")
    assert isinstance(err, rc.InvalidConfig)


def test_the_docs_error_lines_are_what_loading_says(tmp_path: Path) -> None:
    shown = re.search(r"```text\n(.*?)```", DOC.read_text(), re.S).group(1).splitlines()  # type: ignore[union-attr]
    got = []
    for change in ("num_replicas: 2.5", "max_replicas_per_node: 2"):
        f = write(tmp_path, doc_config().replace("num_replicas: 2", change, 1))
        with pytest.raises(cf.ConfigError) as exc:
            cf.load(f)
        got.append(str(exc.value).replace(str(f), "deploy.yaml"))
    assert got == shown


@pytest.mark.parametrize(("data", "path"), [
    ({"applications": [{"name": "a"}]}, "applications[0].import_path"),
    ({"applications": [{"import_path": "m:a", "host": "0.0.0.0"}]}, "applications[0].host"),
    ({"proxy_location": "Everywhere", "applications": []}, "proxy_location"),
    ({"http_options": {"ssl_keyfile": "k"}}, "http_options.ssl_keyfile"),
    ({"http_options": {"port": 70000}}, "http_options.port"),
    ({"http_options": {"root_path": "/x"}}, "http_options.root_path"),
    ({"grpc_options": {"grpc_servicer_functions": ["no_dot"]}}, "grpc_options.grpc_servicer_functions"),
    ({"applications": [{"import_path": "m:a"}, {"import_path": "m:b"}]}, "applications[1].name"),
    ({"applications": [{"name": "a", "import_path": "m:a"}, {"name": "b", "import_path": "m:b"}]},
     "applications[1].route_prefix"),
    ({"applications": [{"import_path": "nocolonordot"}]}, "applications[0].import_path"),
    ({"applications": [{"import_path": "m:a", "route_prefix": "no-slash"}]}, "applications[0].route_prefix"),
    ({"applications": [{"import_path": "m:a", "deployments": [{"name": "x"}, {"name": "x"}]}]},
     "applications[0].deployments[1].name"),
    ({"applications": [{"import_path": "m:a", "deployments": [{"num_replicas": 1}]}]},
     "applications[0].deployments[0].name"),
    ({"applications": [{"import_path": "m:a", "deployments": [{"name": "x", "ray_actor_options": {"num_cpus": -1}}]}]},
     "applications[0].deployments[0].ray_actor_options"),
    ({"applications": [{"import_path": "m:a", "deployments": [
        {"name": "x", "autoscaling_config": {"min_replicas": 5, "max_replicas": 2}}]}]},
     "applications[0].deployments[0].autoscaling_config"),
    ({"applications": "m:a"}, "applications"),
])
def test_json_input_errors_name_the_key_path_without_a_line(data: dict, path: str) -> None:
    with pytest.raises(cf.ConfigError) as exc:
        cf.parse(data, "request body")
    assert (exc.value.source, exc.value.path, exc.value.line) == ("request body", path, None)


@pytest.mark.parametrize("data", [None, {}, {"http_options": {"port": 8001}}, {"proxy_location": "HeadOnly"}])
def test_a_config_without_applications_is_refused_not_applied_as_none(data: Any) -> None:
    """An empty file or body (or one that sets only the ingress) would have deleted every
    application; ``applications: []`` says that in so many words (Serve's schema requires it too)."""
    with pytest.raises(cf.ConfigError, match=r"applications: missing: .*`applications: \[\]` deletes every one"):
        cf.parse(data, "request body")
    assert cf.parse({"applications": []}, "request body").applications == ()


def test_a_deployments_options_are_checked_by_the_decorators_own_checks() -> None:
    """The same option, the same words: declared once (``validate_options``)."""
    with pytest.raises(rc.InvalidConfig) as by_code:
        deployment(name="x", ray_actor_options={"num_cpus": -1})
    with pytest.raises(cf.ConfigError) as by_file:
        cf.parse({"applications": [{"import_path": "m:a", "deployments": [
            {"name": "x", "ray_actor_options": {"num_cpus": -1}}]}]})
    assert by_file.value.message in str(by_code.value)


@pytest.mark.parametrize("value, says", [
    (-1, "must be from 0 to 100"), (101, "must be from 0 to 100"), (100.5, "must be from 0 to 100"),
    ("abc", "must be a number from 0 to 100 or null, got str"), (True, "got bool"),
    (50, "rankcore does not scale applications by target_capacity"),
])
def test_target_capacity_serve_refuses_or_rankcore_cannot_honour_is_refused(value: Any, says: str) -> None:
    """(issue 64: -1, 101 and "abc" were accepted with a warning that contradicted itself)"""
    with pytest.raises(cf.ConfigError, match=says) as exc:
        cf.parse({"target_capacity": value, "applications": []}, "request body")
    assert exc.value.path == "target_capacity"


@pytest.mark.parametrize("value", [None, 100, 100.0])
def test_target_capacity_that_changes_nothing_is_accepted_with_a_warning(value: Any) -> None:
    with pytest.warns(UserWarning, match="target_capacity is accepted and ignored"):
        assert cf.parse({"target_capacity": value, "applications": []}, "request body").applications == ()


def test_keys_serve_treats_as_no_ops_are_accepted_with_a_warning(tmp_path: Path) -> None:
    text = "logging_config: {log_level: DEBUG}\ngrpc_options: {port: 9001}\n" + doc_config()
    with pytest.warns(UserWarning, match=r"deploy.yaml:1: logging_config: logging_config is accepted and ignored"):
        cfg = cf.load(write(tmp_path, text))
    assert len(cfg.warnings) == 1 and cfg.grpc_options.port == 9001


def test_ours_and_serves_rolling_update_pace_reach_the_options() -> None:
    cfg = cf.parse({"applications": [{"import_path": "m:a", "deployments": [
        {"name": "x", "rolling_update_percentage": 0.5, "version": "2", "health_check_failure_threshold": 5,
         "num_replicas": "auto", "max_surge_percent": 25}]}]})
    assert cfg.applications[0].deployments[0].to_options() == {
        "num_replicas": "auto", "version": "2", "max_unavailable": 0.5, "health_check_failure_threshold": 5,
        "max_surge": 0.25}
    none = cf.parse({"applications": [{"import_path": "m:a", "deployments": [{"name": "x", "max_surge_percent": 0}]}]})
    assert none.applications[0].deployments[0].to_options() == {"max_surge": 0}


def test_a_surge_percent_outside_serves_range_names_its_key_and_line(tmp_path: Path) -> None:
    text = ("applications:\n  - import_path: m:a\n    deployments:\n      - name: x\n"
            "        max_surge_percent: 150\n")
    with pytest.raises(cf.ConfigError, match=r"deploy.yaml:5: applications\[0\].deployments\[0\].max_surge_percent: "
                                             r"must be a percent of the target, an int in \[0, 100\].*got 150"):
        cf.load(write(tmp_path, text))


def test_yaml_that_does_not_parse_names_its_line(tmp_path: Path) -> None:
    with pytest.raises(cf.ConfigError, match=r"deploy.yaml:3: not valid YAML: mapping values are not allowed"):
        cf.load(write(tmp_path, "applications:\n  - import_path: m:a\n    name: x: y\n"))


def test_build_writes_a_config_that_loads_back_with_the_codes_options() -> None:
    from tests.integration import operate_models

    cfg = cf.build_config([("tests.integration.operate_models:app", operate_models.app)])
    again = cf.parse(yaml.safe_load(cf.dump(cfg)), "built")
    assert again == cfg
    (app,) = again.applications
    assert (app.name, app.route_prefix, app.import_path) == ("Echo", "/Echo", "tests.integration.operate_models:app")
    (d,) = app.deployments
    assert d.to_options() == {"num_replicas": 2, "user_config": {"greeting": "hello"},
                              "ray_actor_options": {"num_cpus": 0.01}}
    # deploying it unchanged gives the deployment its code's options
    code = operate_models.Echo
    assert code.options(**d.to_options()) == code


def test_rankcore_build_prints_the_config_and_deploy_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["build", "tests.integration.operate_models:app", "-o", str(tmp_path / "b.yaml")])
    assert out.exit_code == 0, out.output
    assert cf.load(tmp_path / "b.yaml").applications[0].deployments[0].num_replicas == 2
    out = runner.invoke(main, ["build", "no_such_module_here:app"])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "Traceback" not in out.output
    bad = write(tmp_path, doc_config().replace("num_replicas: 2", "num_replicas: two", 1))
    out = runner.invoke(main, ["deploy", str(bad)])
    assert out.exit_code == 2
    assert out.output == (f"error: {bad}:13: applications[0].deployments[0].num_replicas: "
                          f"expected an int or \"auto\", got str 'two'\n")
    out = runner.invoke(main, ["deploy", str(tmp_path / "missing.yaml")])
    assert out.exit_code == 2 and "cannot read" in out.output


def _keys_table() -> dict[str, set[str]]:
    """docs/operate.md's "Keys" table: each row's last cell's first words -> the keys its first cell names."""
    text = DOC.read_text()
    table = text[text.index("### Keys"):text.index("## `rankcore status`")]
    rows: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("key", "---"):
            rows[cells[1]] = set(re.findall(r"`([A-Za-z_]+)`", cells[0].replace("[]", "")))
    return rows


def test_the_keys_table_says_what_loading_does() -> None:
    """docs/operate.md's key table contradicted itself (``max_surge_percent`` supported and refused,
    gRPC refused: issue 64): every key its "refused" row names is refused by the loader and is no
    field of its record (a field would shadow the refusal), every refused key is in that row; every
    deployment key a "yes" row names is a field, and the servicer functions load."""
    rows = _keys_table()
    (refused,) = [keys for says, keys in rows.items() if says.startswith("refused, naming why")]
    code = {k for table in cf._REFUSED.values() for k in table if not k.startswith(("ssl_", "_"))}
    assert refused == code, (refused ^ code)
    for cls, table in cf._REFUSED.items():
        assert not set(table) & {f.name for f in attrs.fields(cls)}, cls
    fields = {f.name for f in attrs.fields(cf.DeploymentConfig)}
    for says, keys in rows.items():
        if says.startswith("yes") and {"num_replicas", "rolling_update_percentage", "max_surge_percent"} & keys:
            assert keys - {"deployments", "auto"} <= fields, keys - fields  # (`auto`: num_replicas's value)
    assert cf.parse({"grpc_options": {"grpc_servicer_functions": ["m.add_X_to_server"]}, "applications": []}
                    ).grpc_options.grpc_servicer_functions == ("m.add_X_to_server",)


@pytest.mark.parametrize("key, value", [("num_replicas", 0), ("max_queued_requests", 0)])
def test_where_rankcore_differs_it_accepts_what_docs_say(key: str, value: int) -> None:
    text = " ".join(DOC.read_text().split())
    assert f"`{key}: {value}` is accepted" in text
    d = cf.parse({"applications": [{"import_path": "m:a", "deployments": [{"name": "x", key: value}]}]})
    assert getattr(d.applications[0].deployments[0], key) == value


def test_an_unknown_key_is_refused_not_dropped() -> None:
    with pytest.raises(cf.ConfigError, match="unknown key 'num_replica'"):
        cf.parse({"applications": [{"import_path": "m:a", "deployments": [{"name": "x", "num_replica": 2}]}]})
