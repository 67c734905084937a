"""The status page the master serves at /: one static HTML document, its style sheet and its script.

No build step and nothing fetched from elsewhere (crawl machines often have no internet): the script reads
/api/status, /api/recent and /api/audio every few seconds (?refresh=N sets the period) and draws the chart
as inline SVG. Everything from the crawl is inserted as text, never as HTML: page titles and URLs are the
web's, and the web is hostile. The style and script are served as files of their own (/status.css, /status.js):
the server's Content-Security-Policy allows no inline script or style, so text that ever reached the page as
HTML still could not run.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>crawl status</title>
<link rel="stylesheet" href="status.css">
<script src="status.js" defer></script>
</head>
<body>
<header><h1>Audio crawl</h1><span class="meta" id="meta">loading…</span>
<span class="state" id="state"></span></header>
<main>
<section class="tiles" id="tiles"></section>
<section class="chart"><h2>Pages per minute</h2><div id="chart"></div></section>
<section class="nodes"><h2>Workers</h2><table id="nodes"></table>
<h2 class="next">Recent errors</h2><table class="err" id="errors"></table></section>
<section class="side"><h2>URLs</h2><div class="kv" id="urls"></div>
<h2 class="next">Top error reasons</h2><div class="kv" id="reasons"></div>
<h2 class="next">HTTP status</h2><div class="kv" id="http"></div>
<h2 class="next">Discarded URLs</h2><div class="kv" id="discards"></div>
<h2 class="next">Seen-set (Bloom filter)</h2><div class="kv" id="dedup"></div></section>
<section class="sites" id="sitesbox" hidden><h2>Sites with their own policy (this run)</h2><table id="sites"></table>
</section>
<section class="matches"><h2>Works identified</h2><table id="matches"></table></section>
<section class="audio"><h2>Audio found</h2>
<form id="search"><input type="search" id="q" placeholder="Search the catalogue by title, artist or URL">
<button>Search</button></form><div id="audiohint" class="s"></div><table id="audio"></table></section>
</main>
</body></html>
"""

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>crawl status: sign in</title>
<link rel="stylesheet" href="status.css">
</head><body class="login"><form method="post" action="login"><strong>Audio crawl status</strong>
<label for="token">Access token (web.token_file)</label>
<input type="password" id="token" name="token" autofocus><button>Sign in</button><p>{message}</p></form>
</body></html>
"""

STATUS_CSS = """:root { --bg:#f6f7f9; --card:#fff; --ink:#1d2330; --mute:#6b7385; --line:#e3e6ec; --accent:#2f6fdf;
        --ok:#1f9d55; --bad:#d64545; --warn:#c98a00; }
* { box-sizing:border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; background:var(--bg);
       color:var(--ink); }
header { display:flex; align-items:baseline; gap:16px; padding:14px 24px; background:#1d2330; color:#fff; }
header h1 { font-size:18px; margin:0; font-weight:600; }
header .meta { color:#b9c0d0; font-size:13px; }
header .state { margin-left:auto; font-size:13px; }
.dot { display:inline-block; width:9px; height:9px; border-radius:50%; margin-right:6px; background:var(--ok); }
.dot.off { background:var(--bad); }
.paused { background:var(--warn); color:#1d2330; font-weight:600; border-radius:4px; padding:2px 8px;
          margin-right:12px; }
main { padding:18px 24px 40px; display:grid; gap:16px; grid-template-columns:repeat(12, 1fr); }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:14px 16px; min-width:0; }
section h2 { font-size:13px; text-transform:uppercase; letter-spacing:.05em; color:var(--mute); margin:0 0 10px; }
.tiles { grid-column:1/-1; display:grid; grid-template-columns:repeat(auto-fit, minmax(150px, 1fr)); gap:12px;
         background:none; border:0; padding:0; }
.tile { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; }
.tile .v { font-size:24px; font-weight:600; font-variant-numeric:tabular-nums; }
.tile .l { color:var(--mute); font-size:12px; }
.tile .s { color:var(--mute); font-size:12px; font-variant-numeric:tabular-nums; }
.tile .v.compact { font-size:20px; white-space:nowrap; overflow:hidden; text-overflow:ellipsis; }
.chart { grid-column:1/-1; }
.nodes { grid-column:1/8; } .side { grid-column:8/-1; }
.audio, .matches, .sites { grid-column:1/-1; }
table { width:100%; border-collapse:collapse; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); white-space:nowrap; }
th { color:var(--mute); font-weight:500; font-size:12px; }
td.n, th.n { text-align:right; }
td.url { max-width:420px; overflow:hidden; text-overflow:ellipsis; }
.kv { display:grid; grid-template-columns:1fr auto; gap:2px 12px; font-variant-numeric:tabular-nums; }
.kv div:nth-child(odd) { color:var(--mute); }
.bad { color:var(--bad); } .ok { color:var(--ok); } .warn { color:var(--warn); font-weight:600; }
.err { font-size:12px; } .err td { white-space:normal; word-break:break-all; }
svg text { fill:var(--mute); font-size:11px; }
form { display:flex; gap:8px; margin-bottom:10px; }
input[type=search] { flex:1; padding:6px 10px; border:1px solid var(--line); border-radius:6px; font:inherit; }
button { padding:6px 14px; border:0; border-radius:6px; background:var(--accent); color:#fff; font:inherit; }
a { color:var(--accent); text-decoration:none; }
.empty { color:var(--mute); font-style:italic; }
@media (max-width: 1000px) { .nodes, .side { grid-column:1/-1; } }
h2.next { margin-top:16px; }
body.login { font:15px system-ui, sans-serif; background:#f6f7f9; display:grid; place-items:center; height:90vh; }
.login form { background:#fff; border:1px solid #e3e6ec; border-radius:8px; padding:24px; display:grid; gap:10px; }
.login input { padding:7px 10px; font:inherit; } .login button { padding:7px; font:inherit; }
.login p { color:#d64545; margin:0; }
"""

STATUS_JS = r"""
"use strict";
const refresh = Math.max(1, Number(new URLSearchParams(location.search).get("refresh")) || 3) * 1000;
const $ = (id) => document.getElementById(id);
const fmt = (n) => n == null ? "–" : Number(n).toLocaleString("en-US");
const rate = (n) => n == null ? "–" : fmt(n >= 10 ? Math.round(n) : n);
const bytes = (n) => { const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return (i ? n.toFixed(1) : n) + " " + u[i]; };
function el(tag, text, cls) { const e = document.createElement(tag); if (text != null) e.textContent = text;
  if (cls) e.className = cls; return e; }
function row(cells, head) { const tr = el("tr");
  for (const [text, cls] of cells) tr.appendChild(el(head ? "th" : "td", text, cls)); return tr; }
function table(id, head, rows, empty) { const t = $(id); t.replaceChildren(row(head, true));
  if (!rows.length) { const tr = el("tr"); const td = el("td", empty, "empty"); td.colSpan = head.length;
    tr.appendChild(td); t.appendChild(tr); }
  for (const r of rows) t.appendChild(row(r)); }
function kv(id, obj, empty) { const box = $(id); box.replaceChildren();
  const entries = Object.entries(obj || {});
  if (!entries.length) { box.appendChild(el("div", empty, "empty")); box.appendChild(el("div", "")); }
  for (const [k, v] of entries) { box.appendChild(el("div", k)); box.appendChild(el("div", typeof v === "string" ? v : fmt(v))); } }
function tile(label, value, sub, cls) { const t = el("div", null, "tile");
  t.appendChild(el("div", value, "v" + (cls ? " " + cls : "")));
  t.appendChild(el("div", label, "l")); if (sub) t.appendChild(el("div", sub, "s")); return t; }
function ago(iso) { if (!iso) return "never"; const s = Math.round((Date.now() - Date.parse(iso)) / 1000);
  return s < 60 ? s + " s ago" : s < 3600 ? Math.round(s / 60) + " min ago" : Math.round(s / 3600) + " h ago"; }

function changesTile(last, now) {
  // The catalogue's changes in the last refresh cycle (this one's so far below it); none with refresh off.
  const c = last || now;
  if (!c) return null;
  const three = (x) => fmt(x.new) + " / " + fmt(x.changed) + " / " + fmt(x.removed);
  return tile("new / changed / removed", three(c),
    last ? "last refresh cycle" + (now ? "; now " + three(now) : "") : "this refresh cycle", "compact");
}
function nodeState(n) {
  // The node's state as status --json names it; a fault with the reason the worker gave.
  const state = n.state || (n.connected ? "connected" : "disconnected");
  if (state === "fault") return ["fault: " + (n.fault || "cannot store"), "warn"];
  return [state, state === "connected" ? "ok" : "bad"];
}
function drawStatus(st) {
  const r = st.rates || {}, u = st.urls, run = st.this_run || {};
  $("meta").textContent = "master " + (st.master.web || "") + " · started " +
    (st.master.started || "–").replace("T", " ").replace("Z", " UTC") + " · updated " +
    st.time.replace("T", " ").replace("Z", " UTC");
  const faulted = st.nodes_faulted ? ", " + st.nodes_faulted + " faulted" : "";
  $("state").replaceChildren(...(st.paused ? [el("span", "paused: no work handed out", "paused")] : []),
    el("span", null, "dot" + (st.nodes_connected ? "" : " off")),
    document.createTextNode(st.nodes_connected + " of " + st.nodes.length + " workers connected" + faulted));
  const audio = Object.values(st.audio).reduce((a, b) => a + b, 0);
  $("tiles").replaceChildren(...[
    tile("pages fetched", fmt(u.done), fmt(run.pages) + " this run"),
    tile("pages / min", rate(r.pages_per_min_1m), "10 min: " + rate(r.pages_per_min_10m)),
    tile("audio items", fmt(audio), fmt(st.audio.ok || 0) + " ok"),
    tile("audio / min", rate(r.audio_per_min_1m), "10 min: " + rate(r.audio_per_min_10m)),
    changesTile((st.changes || {}).last_cycle, (st.changes || {}).this_cycle),
    tile("works identified", fmt((st.matches || {}).count || 0), "audio URL and work pairs"),
    tile("errors / min", rate(r.errors_per_min_1m), fmt(u.error) + " URLs failed"),
    tile("waiting at master", fmt(u.waiting_at_master), fmt(u.held_at_master) + " held, " + fmt(u.queued) + " queued"),
    tile("at workers", fmt(u.at_workers), "loop lag " + ((st.master.event_loop_lag_s || 0) * 1000).toFixed(1) + " ms"),
  ].filter(Boolean));
  table("nodes", [["node"], ["state"], ["last heartbeat"], ["in flight", "n"], ["queued", "n"], ["pages", "n"],
                  ["audio", "n"], ["bytes", "n"], ["to fingerprint", "n"], ["errors", "n"]],
    st.nodes.map((n) => [[n.node], nodeState(n),
      [ago(n.last_heartbeat)], [fmt(n.in_flight), "n"], [fmt(n.queued), "n"], [fmt(n.pages), "n"],
      [fmt(n.audio), "n"], [bytes(n.bytes), "n"], [fmt(n.fingerprint_backlog || 0), "n"],
      [fmt(n.errors), n.errors ? "n bad" : "n"]]), "no workers");
  kv("urls", {"queued": u.queued, "held at the master": u.held_at_master, "at workers": u.at_workers,
              "done": u.done, "failed": u.error, "total": u.total}, "");
  kv("reasons", st.errors, "none"); kv("http", st.http_status, "none"); kv("discards", st.discards, "none");
  // A live stream's match says when the work was played on it (UTC) and for how long, on which station.
  table("matches", [["work"], ["title"], ["score", "n"], ["offset (s)", "n"], ["audio URL"], ["found on page"],
                    ["matched"], ["played"]],
    ((st.matches || {}).latest || []).map((m) => [[m.work], [m.title || "–"], [fmt(m.score), "n"],
      [fmt(m.offset), "n"], [m.url, "url"], [m.page || "–", "url"], [(m.matched_at || "").slice(11, 19)],
      [m.live ? `${(m.played_at || "").replace("T", " ").slice(0, 19)} for ${fmt(Math.round(m.played_seconds || 0))} s` +
                (m.station ? ` on ${m.station}` : "") : "–"]]),
    "none yet");
  // The sites of the sites: table: in flight against the site's max_per_host, the delay in force against its own.
  const sites = Object.entries(st.sites || {});
  $("sitesbox").hidden = !sites.length;
  const of = (n, lim) => fmt(n) + (lim == null ? "" : " / " + fmt(lim));
  if (sites.length) table("sites", [["site"], ["done", "n"], ["failed", "n"], ["in flight", "n"], ["audio", "n"],
                                    ["audio in flight", "n"], ["delay (s)", "n"], ["min delay (s)", "n"],
                                    ["login"]],
    sites.map(([name, f]) => [[name], [fmt(f.pages_done), "n"], [fmt(f.pages_failed), f.pages_failed ? "n bad" : "n"],
      [of(f.pages_in_flight, f.max_per_host), "n"], [fmt(f.audio), "n"], [of(f.audio_in_flight, f.audio_max_per_host), "n"],
      [String(f.delay_s), "n"], [f.min_delay_s == null ? "–" : String(f.min_delay_s), "n"],
      // A site whose login fails waits at the master (its URLs aside, the rest of the crawl going on).
      f.login_waiting ? ["waiting " + fmt(Math.round(f.login_waiting.waiting_s)) + " s: " + f.login_waiting.reason,
                         "bad"] : ["–"]]), "");
  const d = st.dedup;
  kv("dedup", d ? {"URLs": d.urls, "capacity": d.capacity, "layers": d.layers,
                   "false positives (est.)": d.fp_estimate.toExponential(1), "target": String(d.fp_rate)} : {}, "–");
}

function drawChart(data) {
  const v = data.pages, W = 1200, H = 180, pad = 34, n = v.length, max = Math.max(1, ...v);
  const bw = (W - pad - 8) / n, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H + 20}`); svg.setAttribute("width", "100%");
  const mk = (tag, attrs, text) => { const e = document.createElementNS(ns, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]); if (text != null) e.textContent = text; svg.appendChild(e); };
  for (const f of max >= 2 ? [0, 0.5, 1] : [0, 1]) { const y = H - f * (H - 10);
    mk("line", {x1: pad, x2: W, y1: y, y2: y, stroke: "#e3e6ec"});
    mk("text", {x: pad - 6, y: y + 4, "text-anchor": "end"}, fmt(Math.round(f * max))); }
  v.forEach((c, i) => { const h = c / max * (H - 10);
    mk("rect", {x: pad + i * bw + 0.5, y: H - h, width: Math.max(1, bw - 1), height: h, fill: "#2f6fdf",
                rx: 1}); });
  const hours = n / 60;
  for (let i = 0; i <= n; i += n > 120 ? 60 : 10) {
    const mins = n - i; mk("text", {x: pad + i * bw, y: H + 15, "text-anchor": "middle"},
      mins === 0 ? "now" : (mins >= 60 && mins % 60 === 0 ? "-" + mins / 60 + " h" : "-" + mins + " min")); }
  $("chart").replaceChildren(svg);
  table("errors", [["time"], ["node"], ["URL"], ["error"]],
    data.errors.slice(0, 8).map((e) => [[e.time.slice(11, 19)], [e.node], [e.url, "url"], [e.error]]), "none");
}

function drawAudio(data, searched) {
  $("audiohint").textContent = searched ? (data.items.length + " found for \u201c" + data.query + "\u201d") :
    "the latest items found";
  table("audio", [["title"], ["artist"], ["status"], ["audio URL"], ["found on page"], ["node"], ["found"]],
    data.items.map((a) => [[a.title || "–"], [a.artist || "–"], [a.status, a.status === "ok" ? "ok" : "bad"],
      [a.url, "url"], [a.page, "url"], [a.node || ""], [(a.found_at || "").slice(11, 19)]]), "nothing yet");
}

async function get(path) { const r = await fetch(path, {credentials: "same-origin"});
  if (r.status === 401) { location.reload(); throw new Error("401"); } return r.json(); }
let query = "";
async function tick() {
  try {
    const [st, rec] = await Promise.all([get("api/status"), get("api/recent")]);
    drawStatus(st); drawChart(rec);
    if (!query) drawAudio(await get("api/audio?limit=15"), false);
  } catch (e) { $("meta").textContent = "master not answering: " + e; $("state").replaceChildren(); }
}
$("search").addEventListener("submit", async (ev) => { ev.preventDefault(); query = $("q").value.trim();
  if (!query) { tick(); return; }
  const data = await get("api/audio?limit=50&q=" + encodeURIComponent(query));
  if (data.error) { $("audiohint").textContent = data.error; return; } drawAudio(data, true); });
tick(); setInterval(tick, refresh);
"""
