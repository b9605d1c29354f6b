"""The status page: one self-contained HTML page (``render_page``) refreshing from its JSON twin.
Split from ``http`` (issue 66).
"""

from __future__ import annotations

import html
import json
from typing import Any


def _e(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def _rank(r: Any) -> str:
    return "/".join("-" if x is None else str(x) for x in r) if isinstance(r, (list, tuple)) else _e(r)


def render_page(status: dict) -> str:
    """The status page: the tables rendered here (it reads without JavaScript), then kept
    current by the inline script, which fetches ``/-/status.json`` every 2 s and renders the
    same tables (``render`` in _PAGE_JS)."""
    rows = []
    for d in status["deployments"]:
        st = d["status"] or {}
        rows.append(f"<section class=dep data-deployment='{_e(d['name'])}'><h2>{_e(d['name'])} "
                    f"<small>{_e(d['route'])} · {_e(st.get('status'))} · target {_e(st.get('target'))} · "
                    f"queue {_e(_queue_text(d['queue']))} · in flight (HTTP) {_e(d['in_flight_http'])}</small></h2>"
                    "<table><tr><th>replica</th><th>rank</th><th>phase</th><th>pool</th><th>node</th></tr>")
        for rid, r in sorted((st.get("replicas") or {}).items(), key=lambda kv: str(kv[1].get("rank"))):
            rows.append(f"<tr><td>{_e(rid)}</td><td class=rank>{_rank(r.get('rank'))}</td><td>{_e(r.get('phase'))}"
                        f"</td><td>{_e(d['pool'].get(rid))}</td><td>{_e((r.get('node_id') or '')[:12])}</td></tr>")
        rows.append("</table></section>")
    faults = "".join(f"<li>{_e(f.get('deployment'))}: {_e(f.get('error'))} {_e(str(f.get('detail'))[:300])}</li>"
                     for f in status["faults"]) or "<li>none</li>"
    tiers = status.get("tiers") or {}
    tier_log = "".join(f"<li>{_e(x)}</li>" for x in (tiers.get("log") or [])[-10:]) or "<li>none</li>"
    initial = html.escape(json.dumps(status), quote=False)
    return (_PAGE_HEAD + "<main id=view>" + "".join(rows) +
            f"<h2>Tiers</h2><ul id=tiers>{tier_log}</ul><h2>Recent faults</h2><ul id=faults>{faults}</ul></main>"
            f"<script type=application/json id=initial>{initial}</script><script>{_PAGE_JS}</script></body></html>")


def _queue_text(q: Any) -> str:
    if not q:
        return "-"
    return ", ".join(f"{k} {v}" for k, v in q.items() if isinstance(v, (int, float)))


_PAGE_HEAD = """<!doctype html><html><head><meta charset=utf-8><title>rankcore status</title><style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}h2{font-size:1.05em;margin:1.2em 0 .3em}
small{color:#666;font-weight:normal}table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid #ddd;
text-align:left}td.rank{font-family:monospace}#updated{color:#666}#updated.stale{color:#b00}ul{margin:.2em 0}
</style></head><body data-refreshes=0><h1>rankcore <span id=updated>(served)</span></h1>"""

# the same tables as render_page, from /-/status.json (no external assets)
_PAGE_JS = r"""
const esc = v => String(v === null || v === undefined ? "-" : v).replace(/[&<>"']/g,
  c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const rank = r => Array.isArray(r) ? r.map(x => x === null ? "-" : x).join("/") : esc(r);
const queue = q => q ? Object.entries(q).filter(([k, v]) => typeof v === "number").map(([k, v]) => k + " " + v)
  .join(", ") : "-";
function render(s) {
  let out = "";
  for (const d of s.deployments) {
    const st = d.status || {};
    out += `<section class=dep data-deployment='${esc(d.name)}'><h2>${esc(d.name)} <small>${esc(d.route)} · ` +
      `${esc(st.status)} · target ${esc(st.target)} · queue ${esc(queue(d.queue))} · in flight (HTTP) ` +
      `${esc(d.in_flight_http)}</small></h2><table><tr><th>replica</th><th>rank</th><th>phase</th><th>pool</th>` +
      `<th>node</th></tr>`;
    const reps = Object.entries(st.replicas || {}).sort((a, b) => String(a[1].rank) < String(b[1].rank) ? -1 : 1);
    for (const [rid, r] of reps) {
      out += `<tr><td>${esc(rid)}</td><td class=rank>${rank(r.rank)}</td><td>${esc(r.phase)}</td>` +
        `<td>${esc((d.pool || {})[rid])}</td><td>${esc((r.node_id || "").slice(0, 12))}</td></tr>`;
    }
    out += "</table></section>";
  }
  const log = ((s.tiers || {}).log || []).slice(-10).map(x => `<li>${esc(JSON.stringify(x))}</li>`).join("");
  const faults = (s.faults || []).map(f => `<li>${esc(f.deployment)}: ${esc(f.error)} ` +
    `${esc(String(f.detail).slice(0, 300))}</li>`).join("");
  out += `<h2>Tiers</h2><ul id=tiers>${log || "<li>none</li>"}</ul>` +
    `<h2>Recent faults</h2><ul id=faults>${faults || "<li>none</li>"}</ul>`;
  document.getElementById("view").innerHTML = out;
}
async function refresh() {
  const u = document.getElementById("updated");
  try {
    const r = await fetch("/-/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.body.dataset.refreshes = Number(document.body.dataset.refreshes) + 1;
    u.textContent = "updated " + new Date().toLocaleTimeString(); u.className = "";
  } catch (e) { u.textContent = "not updated: " + e; u.className = "stale"; }
}
render(JSON.parse(document.getElementById("initial").textContent));
refresh(); setInterval(refresh, 2000);
"""
