"""Render a preview of docs/grafana/rankcore-dashboard.json from real scraped numbers.

Grafana is not available offline, so this draws the dashboard's panels itself: it starts a
local Ray, deploys a small model behind the HTTP ingress, sends it load (answers, errors, 404s),
changes its user_config and downscales it past rank 0 (a compaction), scrapes ``/metrics`` every
second meanwhile, evaluates each panel's queries over those scrapes (the few PromQL forms the
dashboard uses: ``sum/max/min by (...) (rate|increase(m[w]) | m)`` and
``histogram_quantile(q, sum by (le, ...) (rate(m_bucket[w])))``), writes an HTML page of SVG
charts laid out by the panels' ``gridPos``, and screenshots it with headless Chromium.

    python tools/render_dashboard.py [--seconds 36] [--out docs/img/grafana-dashboard.png]
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOARD = ROOT / "docs" / "grafana" / "rankcore-dashboard.json"

Samples = dict[tuple[str, tuple], float]

_AGG = re.compile(r"^(sum|max|min)(?: by \(([^)]*)\) ?)?\((.*)\)$")
_FN = re.compile(r"^(rate|increase)\(([a-z_]+)\[(\d+)([smh])\]\)$")
_QUANTILE = re.compile(r"^histogram_quantile\(([\d.]+), sum by \(le(?:, ([^)]*))?\) \(rate\(([a-z_]+)\[(\d+)([smh])\]\)\)\)$")
_UNIT = {"s": 1, "m": 60, "h": 3600}


def parse(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _series(scrape: Samples, metric: str) -> dict[tuple, float]:
    return {ls: v for (n, ls), v in scrape.items() if n == metric}


def _window(scrapes: list[tuple[float, Samples]], i: int, seconds: float) -> int:
    """The earliest scrape within ``seconds`` before scrape ``i``."""
    t = scrapes[i][0]
    j = i
    while j > 0 and t - scrapes[j - 1][0] <= seconds:
        j -= 1
    return j


def _group(values: dict[tuple, float], by: list[str], how: str) -> dict[tuple, float]:
    out: dict[tuple, list[float]] = defaultdict(list)
    for ls, v in values.items():
        d = dict(ls)
        out[tuple((k, d.get(k, "")) for k in by)].append(v)
    agg = {"sum": sum, "max": max, "min": min}[how]
    return {k: agg(vs) for k, vs in out.items()}


def _delta(scrapes: list[tuple[float, Samples]], i: int, metric: str, seconds: float, rate: bool) -> dict[tuple, float]:
    j = _window(scrapes, i, seconds)
    now, then = _series(scrapes[i][1], metric), _series(scrapes[j][1], metric)
    dt = scrapes[i][0] - scrapes[j][0]
    if rate and dt <= 0:
        return {}
    return {ls: (v - then.get(ls, 0.0)) / (dt if rate else 1.0) for ls, v in now.items()}


def _quantile(q: float, buckets: dict[tuple, float]) -> float | None:
    """Prometheus's histogram_quantile over one series' cumulative buckets ``{le: count}``."""
    pts = sorted((math.inf if le == "+Inf" else float(le), c) for (le,), c in buckets.items())
    if not pts or pts[-1][1] <= 0:
        return None
    rank = q * pts[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in pts:
        if c >= rank:
            if le == math.inf:
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_le, prev_c = le, c
    return None


def evaluate(expr: str, scrapes: list[tuple[float, Samples]], i: int) -> dict[tuple, float]:
    """One query at scrape ``i``: ``{group labels: value}``. An unsupported form raises."""
    m = _QUANTILE.match(expr)
    if m:
        q, by, metric, n, unit = float(m[1]), [x.strip() for x in (m[2] or "").split(",") if x.strip()], m[3], m[4], m[5]
        per = _group(_delta(scrapes, i, metric, int(n) * _UNIT[unit], True), ["le", *by], "sum")
        series: dict[tuple, dict[tuple, float]] = defaultdict(dict)
        for key, v in per.items():
            series[key[1:]][(key[0][1],)] = v
        out = {k: _quantile(q, b) for k, b in series.items()}
        return {k: v for k, v in out.items() if v is not None}
    m = _AGG.match(expr)
    if not m:
        raise ValueError(f"unsupported query form: {expr!r}")
    how, by, inner = m[1], [x.strip() for x in (m[2] or "").split(",") if x.strip()], m[3]
    f = _FN.match(inner)
    if f:
        values = _delta(scrapes, i, f[2], int(f[3]) * _UNIT[f[4]], f[1] == "rate")
    elif re.fullmatch(r"[a-z_]+", inner):
        values = _series(scrapes[i][1], inner)
    else:
        raise ValueError(f"unsupported query form: {expr!r}")
    return _group(values, by, how) if values else {}


def legend(fmt: str, key: tuple) -> str:
    d = dict(key)
    return re.sub(r"\{\{(\w+)\}\}", lambda m: str(d.get(m[1], "")), fmt).strip() or "value"


# ------------------------------------------------------------------ drawing
_COLOURS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#b877d9", "#f2495c", "#8ab8ff", "#fade2a", "#37872d"]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    if abs(v) < 0.01:
        return f"{v:.1e}"
    return f"{v:.2f}".rstrip("0").rstrip(".")


def chart(lines: dict[str, list[tuple[float, float]]], w: int, h: int, t0: float, t1: float) -> str:
    pad_l, pad_b, pad_t = 46, 18, 6
    pts = [p for ps in lines.values() for p in ps]
    if not pts:
        return f"<svg width={w} height={h}><text x={w // 2} y={h // 2} fill=#888 text-anchor=middle>No data</text></svg>"
    hi = max(p[1] for p in pts)
    hi = hi * 1.1 if hi > 0 else 1.0
    span = (t1 - t0) or 1.0

    def xy(t: float, v: float) -> str:
        return f"{pad_l + (t - t0) / span * (w - pad_l - 4):.1f},{pad_t + (1 - v / hi) * (h - pad_t - pad_b):.1f}"

    out = [f"<svg width={w} height={h}>"]
    for k in range(5):
        v = hi * k / 4
        y = pad_t + (1 - v / hi) * (h - pad_t - pad_b)
        out.append(f"<line x1={pad_l} x2={w} y1={y:.1f} y2={y:.1f} stroke=#2c3235 />"
                   f"<text x={pad_l - 4} y={y + 4:.1f} fill=#9fa7b3 font-size=10 text-anchor=end>{_fmt(v)}</text>")
    for k in range(4):
        t = t0 + span * k / 3
        out.append(f"<text x={pad_l + (t - t0) / span * (w - pad_l - 4):.1f} y={h - 4} fill=#9fa7b3 font-size=10 "
                   f"text-anchor=middle>{t - t0:.0f}s</text>")
    for n, (_name, ps) in enumerate(sorted(lines.items())):
        colour = _COLOURS[n % len(_COLOURS)]
        out.append(f"<polyline fill=none stroke={colour} stroke-width=1.6 points='{' '.join(xy(*p) for p in ps)}' />")
    out.append("</svg>")
    return "".join(out)


def render_html(board: dict, scrapes: list[tuple[float, Samples]], note: str) -> str:
    col, row = 66, 34  # px per grid unit (24 columns)
    cells = []
    bottom = 0
    for p in board["panels"]:
        g = p["gridPos"]
        w, h = g["w"] * col - 8, g["h"] * row - 8
        bottom = max(bottom, (g["y"] + g["h"]) * row)
        lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for t in p["targets"]:
            for i, (ts, _) in enumerate(scrapes):
                for key, v in evaluate(t["expr"], scrapes, i).items():
                    lines[legend(t.get("legendFormat", ""), key)].append((ts, v))
        title = html.escape(p["title"])
        if p["type"] == "stat":
            last = [ps[-1][1] for ps in lines.values() if ps]
            body = f"<div class=stat>{_fmt(last[0]) if last else '–'}</div>"
            keys = ""
        else:
            body = chart(lines, w - 16, h - 64, scrapes[0][0], scrapes[-1][0])
            keys = "".join(f"<span><i style='background:{_COLOURS[n % len(_COLOURS)]}'></i>{html.escape(k)}</span>"
                           for n, k in enumerate(sorted(lines)))
        cells.append(f"<div class=panel style='left:{g['x'] * col}px;top:{g['y'] * row}px;width:{w}px;height:{h}px'>"
                     f"<h3>{title}</h3>{body}<div class=keys>{keys}</div></div>")
    return (f"<!doctype html><html><head><meta charset=utf-8><style>"
            f"body{{margin:0;background:#111217;color:#ccccdc;font:12px Inter,system-ui,sans-serif}}"
            f"header{{padding:10px 14px;font-size:16px}}header small{{color:#8e8e9e;font-size:12px;margin-left:12px}}"
            f"#grid{{position:relative;margin:0 8px;height:{bottom}px}}"
            f".panel{{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:3px;padding:6px 8px;"
            f"overflow:hidden}}h3{{margin:0 0 4px;font-size:12px;font-weight:500}}"
            f".stat{{font-size:40px;color:#73bf69;text-align:center;margin-top:8px}}"
            f".keys span{{margin-right:10px;white-space:nowrap}}.keys i{{display:inline-block;width:10px;height:3px;"
            f"margin-right:4px;vertical-align:middle}}</style></head><body>"
            f"<header>{html.escape(board['title'])}<small>{html.escape(note)}</small></header>"
            f"<div id=grid>{''.join(cells)}</div></body></html>"), bottom + 60


# ------------------------------------------------------------------ the run
def collect(seconds: float) -> tuple[list[tuple[float, str]], str]:
    """Local Ray, a deployment under load, its events; ``/metrics`` scraped every second."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, str(ROOT))
    import httpx
    import ray

    from executors.ray_gpu import deployment, run
    from executors.ray_gpu.api.deployments import push_weights, sleep, wake
    from executors.ray_gpu.ingress.http import ingress_address

    @deployment(name="demo", num_replicas=3, user_config={"v": 1}, ray_actor_options={"num_cpus": 0.05})
    class Demo:
        def reconfigure(self, user_config):
            self.v = user_config["v"]

        def __call__(self, ms=5):
            time.sleep(ms / 1000)
            return ms

        def fail(self):
            raise ValueError("demo says no")

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        handle = run(Demo.bind(), route_prefix="/demo", port=0)
        host, port = ingress_address()
        base = f"http://{host}:{port}"
        stop = threading.Event()

        def load() -> None:
            rnd = random.Random(7)
            with httpx.Client(base_url=base, timeout=30) as c:
                while not stop.is_set():
                    x = rnd.random()
                    if x < 0.05:
                        c.get("/demo/fail")
                    elif x < 0.07:
                        c.get("/nowhere")
                    else:
                        c.post("/demo", json=rnd.choice((2, 5, 10, 30, 80)))

        threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
        for th in threads:
            th.start()
        scrapes: list[tuple[float, str]] = []
        t0 = time.monotonic()
        events = [(seconds * 0.3, lambda: run(Demo.options(user_config={"v": 2}).bind(), route_prefix="/demo")),
                  (seconds * 0.55, lambda: handle.scale(
                      2, victims=(next(r for r, rk in handle.ranks().items() if rk[0] == 0),))),
                  (seconds * 0.7, lambda: push_weights("demo", None, 1, wait=True, timeout=30)),
                  (seconds * 0.8, lambda: (sleep("demo", timeout=30), wake("demo", timeout=30)))]
        with httpx.Client(base_url=base, timeout=30) as c:
            while (now := time.monotonic() - t0) < seconds:
                while events and now >= events[0][0]:
                    threading.Thread(target=events.pop(0)[1], daemon=True).start()
                scrapes.append((now, c.get("/metrics").text))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0 - now)))
        stop.set()
        for th in threads:
            th.join(10)
        note = (f"preview rendered from {len(scrapes)} scrapes of a local run: 4 clients, 5% errors, 2% 404s; "
                f"user_config change at {seconds * 0.3:.0f}s, downscale 3→2 past rank 0 at {seconds * 0.55:.0f}s, "
                f"weights push at {seconds * 0.7:.0f}s, sleep and wake at {seconds * 0.8:.0f}s")
        return scrapes, note
    finally:
        from executors.ray_gpu import get_controller
        from executors.ray_gpu.api.deployments import ask

        try:
            ask(get_controller(), "reset")
        finally:
            ray.shutdown()


def screenshot(page: str, height: int, out: pathlib.Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("no chromium found (make browser installs Debian's)")
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "board.html"
        src.write_text(page)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--hide-scrollbars", f"--window-size=1600,{height}", f"--screenshot={out.resolve()}",
                        src.as_uri()], check=True, capture_output=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=36.0, help="how long to run the load and scrape")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "img" / "grafana-dashboard.png")
    ap.add_argument("--html", type=pathlib.Path, help="also write the HTML page here")
    ap.add_argument("--scrapes", type=pathlib.Path,
                    help="a JSON file of scrapes: read from it when it exists (no run), else written after the run")
    args = ap.parse_args()
    board = json.loads(BOARD.read_text())
    if args.scrapes is not None and args.scrapes.exists():
        saved = json.loads(args.scrapes.read_text())
        scrapes = [(t, parse(text)) for t, text in saved["scrapes"]]
        note = saved["note"]
    else:
        texts, note = collect(args.seconds)
        if args.scrapes is not None:
            args.scrapes.write_text(json.dumps({"note": note, "scrapes": texts}))
        scrapes = [(t, parse(text)) for t, text in texts]
    page, height = render_html(board, scrapes, note)
    if args.html:
        args.html.write_text(page)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    screenshot(page, height, args.out)
    print(f"wrote {args.out} ({len(scrapes)} scrapes)")


if __name__ == "__main__":
    main()
