#include "tracker/cluster/page.h"

namespace shoal::tracker {
namespace {

// Inline everything: the Content-Security-Policy of /ui allows no other source.
constexpr std::string_view kPage = R"shoalpage(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>shoal cluster</title>
<style>
:root { --bg:#f6f7f9; --card:#fff; --ink:#1b1f24; --dim:#5b6470; --line:#dde1e6;
        --ok:#1a7f37; --warn:#9a6700; --bad:#cf222e; --bar:#2f81f7; }
* { box-sizing:border-box; }
body { margin:0; font:14px/1.4 system-ui, sans-serif; background:var(--bg); color:var(--ink); }
header { display:flex; flex-wrap:wrap; gap:.5rem 1rem; align-items:baseline; padding:.75rem 1rem;
         background:#1b1f24; color:#fff; }
header h1 { font-size:1.1rem; margin:0; }
.dim { color:var(--dim); }
header .dim { color:#aab2bd; }
main { padding:1rem; max-width:1400px; margin:0 auto; }
.cards { display:grid; grid-template-columns:repeat(auto-fit, minmax(150px, 1fr)); gap:.75rem; }
.card { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:.6rem .8rem; }
.card .k { color:var(--dim); font-size:.8rem; }
.card .v { font-size:1.35rem; font-weight:600; }
section { margin-top:1.25rem; }
h2 { font-size:1rem; margin:0 0 .5rem; }
.scroll { overflow-x:auto; background:var(--card); border:1px solid var(--line); border-radius:6px; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:.35rem .6rem; border-bottom:1px solid var(--line); white-space:nowrap; }
th { font-size:.8rem; color:var(--dim); font-weight:600; }
td.n { text-align:right; font-variant-numeric:tabular-nums; }
.bar { position:relative; min-width:90px; height:.9rem; background:#e8ebef; border-radius:3px; }
.bar > i { position:absolute; left:0; top:0; bottom:0; background:var(--bar); border-radius:3px; }
.ok { color:var(--ok); } .warn { color:var(--warn); } .bad { color:var(--bad); }
.mono { font-family:ui-monospace, monospace; font-size:.85em; }
.empty { color:var(--dim); padding:.6rem; }
#login { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:1rem;
         max-width:520px; }
#login input { width:100%; padding:.45rem; margin:.5rem 0; font:inherit; }
#login button { padding:.45rem 1rem; font:inherit; }
#error { margin-top:.5rem; }
.image { margin-bottom:.75rem; }
.image .head { display:flex; flex-wrap:wrap; gap:.25rem .75rem; align-items:baseline; }
.image .ref { font-weight:600; overflow-wrap:anywhere; }
.image .bar { margin:.4rem 0; height:1.1rem; }
.image .facts { display:flex; flex-wrap:wrap; gap:.15rem 1.25rem; color:var(--dim); font-size:.85rem; }
.image .facts b { color:var(--ink); font-weight:600; }
.image details { margin-top:.4rem; }
.image summary { cursor:pointer; color:var(--dim); font-size:.85rem; }
.image .scroll { margin-top:.4rem; }
</style>
</head>
<body>
<header>
  <h1>shoal cluster</h1>
  <span class="dim">replica <span id="tracker-id" class="mono">-</span> of
    <span id="replicas" data-value="">-</span></span>
  <span class="dim" id="updated">not loaded</span>
</header>
<main>
  <div id="login" hidden>
    <div>This page needs an operator token (the tracker's <span class="mono">--operator-tokens-file</span>).
      It is kept in this tab only.</div>
    <input id="token" type="password" autocomplete="off" placeholder="operator token">
    <button id="token-save" type="button">Show the cluster</button>
  </div>
  <div id="error" class="bad"></div>
  <div id="view" hidden>
    <div class="cards">
      <div class="card"><div class="k">upstream fetches / cap (this replica)</div>
        <div class="v"><span id="leases-active" data-value="">-</span> /
          <span id="cap-replica" data-value="">-</span></div>
        <div class="k">cluster cap <span id="cap-cluster" data-value="">-</span></div></div>
      <div class="card"><div class="k">from upstream</div>
        <div class="v" id="upstream-bytes" data-value="">-</div>
        <div class="k">now <span id="upstream-rate" data-value="">-</span></div></div>
      <div class="card"><div class="k">blobs (chunks ready)</div>
        <div class="v"><span id="blobs-count" data-value="">-</span></div>
        <div class="k"><span id="chunks-ready" data-value="">-</span> of
          <span id="chunks-total" data-value="">-</span> chunks</div></div>
      <div class="card"><div class="k">agents polling</div>
        <div class="v" id="agents-live" data-value="">-</div>
        <div class="k"><span id="agents-stale" data-value="">-</span> stopped</div></div>
      <div class="card"><div class="k">swarms (peers)</div>
        <div class="v" id="swarms" data-value="">-</div>
        <div class="k"><span id="peers" data-value="">-</span> peers</div></div>
    </div>
    <section><h2>Images</h2><div id="images"></div></section>
    <section><h2>Other blobs, by repository</h2><div class="scroll"><table id="blobs">
      <thead><tr><th>repository</th><th>blob</th><th>size</th><th>chunks ready</th><th></th>
        <th>nodes done</th><th>downloading</th><th>from upstream</th><th>age</th><th>ready in</th></tr></thead>
      <tbody></tbody></table></div></section>
    <section><h2>Prefetch jobs</h2><div id="jobs"></div></section>
    <section><h2>Upstream leases in flight</h2><div class="scroll"><table id="leases">
      <thead><tr><th>blob</th><th>chunk</th><th>agent</th><th></th><th>bytes</th><th>age</th><th>expires in</th></tr></thead>
      <tbody></tbody></table></div></section>
    <section><h2>Agents that stopped polling</h2><div class="scroll"><table id="stale">
      <thead><tr><th>node</th><th>agent</th><th>silent for</th></tr></thead>
      <tbody></tbody></table></div></section>
  </div>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const KEY = "shoal-operator-token";
let last = null;     // {t, view} of the previous poll, for rates
const trend = {};  // per blob digest / job id: [{t, done}] for estimates

function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; ++i; }
  return (i ? n.toFixed(n < 10 ? 2 : 1) : String(n)) + " " + u[i];
}
function dur(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "-";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
}
function put(id, value, text) {
  const el = $(id);
  el.dataset.value = String(value);
  el.textContent = text === undefined ? String(value) : text;
}
function cell(tr, text, cls, value) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  if (value !== undefined) td.dataset.value = String(value);
  tr.appendChild(td);
  return td;
}
function bar(tr, frac) {
  const td = document.createElement("td");
  const b = document.createElement("div");
  b.className = "bar";
  const i = document.createElement("i");
  i.style.width = (Math.max(0, Math.min(1, frac)) * 100).toFixed(1) + "%";
  b.appendChild(i);
  td.appendChild(b);
  tr.appendChild(td);
}
function fill(tbody, rows, empty, cols) {
  tbody.replaceChildren(...rows);
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = cols;
    td.className = "empty";
    td.textContent = empty;
    tr.appendChild(td);
    tbody.appendChild(tr);
  }
}
// Time left from the rate of `done` over the last minute of polls; null when not moving.
function estimate(key, done, total, now) {
  const h = (trend[key] = trend[key] || []);
  h.push({ t: now, done });
  while (h.length > 2 && now - h[0].t > 60000) h.shift();
  if (done >= total) return 0;
  const first = h[0];
  const rate = (done - first.done) / ((now - first.t) || 1);
  return rate > 0 ? (total - done) / rate : null;
}

// Images, most recently resolved first: one card each, its blobs behind a <details>.
// Whether each image's blob list is open, as the operator left it (by manifest digest); a lone
// image's list starts open.
const openImages = new Map();
function fact(parent, label, value, text, id) {
  const s = document.createElement("span");
  s.append(label + " ");
  const b = document.createElement("b");
  if (id) b.id = id;
  b.textContent = text === undefined ? String(value) : text;
  b.dataset.value = String(value);
  s.appendChild(b);
  parent.appendChild(s);
}
function renderImages(images, replicas) {
  const box = $("images");
  box.replaceChildren();
  if (!images.length) {
    const d = document.createElement("div");
    d.className = "empty";
    d.textContent = "no image resolved through this replica yet";
    box.appendChild(d);
  }
  images.forEach((im, i) => {
    const card = document.createElement("div");
    card.className = "card image";
    card.dataset.manifest = im.manifest;
    const head = document.createElement("div");
    head.className = "head";
    const ref = document.createElement("span");
    ref.className = "ref";
    ref.textContent = (im.references[0] || im.manifest) + (im.platform ? " (" + im.platform + ")" : "");
    const dg = document.createElement("span");
    dg.className = "mono dim";
    dg.textContent = im.manifest.slice(7, 19);
    const st = document.createElement("span");
    st.className = im.complete ? "ok" : im.nodes_failed ? "bad" : "warn";
    // With one replica a blob without a table is one no node has asked for yet; with more, it
    // may be another replica's.
    st.textContent = im.complete ? "complete" : im.blobs_known < im.blobs_total ?
      (im.blobs_total - im.blobs_known) + " of " + im.blobs_total +
        (replicas > 1 ? " blobs unknown here" : " blobs not started") : "in progress";
    head.append(ref, dg, st);
    card.appendChild(head);
    const target = (im.nodes_done + im.nodes_in_progress) * im.size;
    const frac = target ? im.held_bytes / target : (im.blobs_total ? im.blobs_ready / im.blobs_total : 0);
    const bb = document.createElement("div");
    bb.className = "bar";
    const fillbar = document.createElement("i");
    fillbar.style.width = (Math.max(0, Math.min(1, frac)) * 100).toFixed(1) + "%";
    bb.appendChild(fillbar);
    card.appendChild(bb);
    const facts = document.createElement("div");
    facts.className = "facts";
    fact(facts, "nodes done", im.nodes_done, undefined, "img" + i + "-done");
    fact(facts, "in progress", im.nodes_in_progress, undefined, "img" + i + "-progress");
    // Without a job, the failed nodes are those that stopped announcing with the image incomplete.
    fact(facts, im.prefetch_job !== null ? "failed" : "stalled", im.nodes_failed, undefined,
         "img" + i + "-failed");
    fact(facts, "size", im.size, bytes(im.size), "img" + i + "-size");
    const over = im.size ? im.upstream_bytes / im.size : 0;
    fact(facts, "from upstream", im.upstream_bytes, bytes(im.upstream_bytes) + " (" + over.toFixed(2) + "x)",
         "img" + i + "-upstream");
    fact(facts, "from peers", im.peer_bytes, bytes(im.peer_bytes), "img" + i + "-peers");
    fact(facts, "since start", im.age_ms, dur(im.age_ms));
    fact(facts, "left", im.eta_ms === null ? "" : im.eta_ms,
         im.complete ? "done" : im.eta_ms === null ? "?" : "~" + dur(im.eta_ms), "img" + i + "-eta");
    card.appendChild(facts);
    if (im.slowest_nodes.length) {
      const wrap = document.createElement("div");
      wrap.className = "scroll";
      const tbl = document.createElement("table");
      // A job's nodes report their progress; without a job, the swarms tell each node's chunks.
      const job = im.prefetch_job !== null;
      tbl.innerHTML = "<thead><tr><th></th><th>state</th><th></th><th>bytes</th><th></th><th>error</th></tr></thead><tbody></tbody>";
      tbl.tHead.rows[0].cells[0].textContent = job ? "slowest nodes (job " + im.prefetch_job + ")" :
        "slowest nodes (their chunks in the swarms)";
      tbl.tHead.rows[0].cells[4].textContent = job ? "time" : "last announce";
      fill(tbl.tBodies[0], im.slowest_nodes.map((n) => {
        const tr = document.createElement("tr");
        tr.className = "slow-node";
        tr.dataset.node = n.node;
        cell(tr, n.node);
        cell(tr, n.state, n.state === "failed" || n.state === "stalled" ? "bad" : "");
        bar(tr, n.bytes_total ? n.bytes_done / n.bytes_total : 0);
        cell(tr, bytes(n.bytes_done) + " / " + bytes(n.bytes_total), "n", n.bytes_done);
        cell(tr, job ? dur(n.elapsed_ms) : dur(n.silent_ms) + " ago", "n");
        cell(tr, n.error || "", "bad");
        return tr;
      }), "", 6);
      wrap.appendChild(tbl);
      card.appendChild(wrap);
    }
    const det = document.createElement("details");
    det.open = openImages.has(im.manifest) ? openImages.get(im.manifest) : images.length === 1;
    det.addEventListener("toggle", () => openImages.set(im.manifest, det.open));
    const sum = document.createElement("summary");
    sum.textContent = im.blobs_ready + " of " + im.blobs_total + " blobs ready" +
      (im.blobs.length < im.blobs_total ? " (first " + im.blobs.length + " listed)" : "");
    det.appendChild(sum);
    const wrap = document.createElement("div");
    wrap.className = "scroll";
    const tbl = document.createElement("table");
    tbl.innerHTML = "<thead><tr><th>blob</th><th>kind</th><th>size</th><th>chunks ready</th><th></th><th>nodes done</th><th>from upstream</th><th>from peers</th></tr></thead><tbody></tbody>";
    fill(tbl.tBodies[0], im.blobs.map((x) => {
      const tr = document.createElement("tr");
      tr.dataset.digest = x.digest;
      cell(tr, x.digest.slice(7, 19), "mono");
      cell(tr, x.kind);
      cell(tr, bytes(x.size), "n", x.size);
      if (!x.known) {
        const td = cell(tr, "no table here (another replica, or not fetched yet)", "empty");
        td.colSpan = 5;
        return tr;
      }
      cell(tr, x.chunks_ready + " / " + x.chunks, "n", x.chunks_ready);
      bar(tr, x.chunks ? x.chunks_ready / x.chunks : 0);
      cell(tr, String(x.nodes_done), "n", x.nodes_done);
      cell(tr, bytes(x.upstream_bytes), "n", x.upstream_bytes);
      cell(tr, bytes(x.peer_bytes), "n", x.peer_bytes);
      return tr;
    }), "no blobs", 8);
    wrap.appendChild(tbl);
    det.appendChild(wrap);
    card.appendChild(det);
    box.appendChild(card);
  });
}

function render(v, now) {
  $("view").hidden = false;
  $("login").hidden = true;
  $("error").textContent = "";
  $("tracker-id").textContent = v.tracker_id;
  put("replicas", v.replicas);
  const up = v.upstream || {};
  put("leases-active", up.leases_active);
  put("cap-replica", up.cap_this_replica);
  put("cap-cluster", up.cap_cluster);
  put("upstream-bytes", up.bytes_total, bytes(up.bytes_total));
  if (last && last.view.tracker_id === v.tracker_id) {
    const rate = Math.max(0, (up.bytes_total - last.view.upstream.bytes_total) * 1000 / ((now - last.t) || 1));
    put("upstream-rate", Math.round(rate), bytes(Math.round(rate)) + "/s");
  }
  const b = v.blobs || { recent: [] };
  put("blobs-count", b.count);
  put("chunks-ready", b.chunks_ready);
  put("chunks-total", b.chunks);
  put("agents-live", v.agents ? v.agents.live : 0);
  put("agents-stale", v.agents ? v.agents.stale : 0);
  put("swarms", v.swarms ? v.swarms.count : 0);
  put("peers", v.swarms ? v.swarms.peers : 0);

  const images = v.images || [];
  const inImage = new Set();
  for (const im of images) for (const x of im.blobs) inImage.add(x.digest);
  renderImages(images, v.replicas);

  const blobs = b.recent.filter((x) => !inImage.has(x.digest)).sort((x, y) =>
    (x.registry + "/" + x.repository).localeCompare(y.registry + "/" + y.repository) || y.age_ms - x.age_ms);
  fill($("blobs").tBodies[0], blobs.map((x) => {
    const tr = document.createElement("tr");
    tr.dataset.digest = x.digest;
    cell(tr, (x.registry ? x.registry + "/" : "") + x.repository);
    cell(tr, x.digest.slice(7, 19), "mono");
    cell(tr, bytes(x.size), "n", x.size);
    cell(tr, x.chunks_ready + " / " + x.chunks, "n chunks", x.chunks_ready);
    bar(tr, x.chunks ? x.chunks_ready / x.chunks : 0);
    cell(tr, String(x.nodes_done), "n nodes-done", x.nodes_done);
    cell(tr, String(x.nodes_downloading), "n", x.nodes_downloading);
    const over = x.size ? x.upstream_bytes / x.size : 0;
    cell(tr, bytes(x.upstream_bytes) + " (" + over.toFixed(2) + "x)", "n upstream " + (over > 1.1 ? "warn" : ""),
         x.upstream_bytes);
    cell(tr, dur(x.age_ms), "n");
    const eta = x.ready_after_ms !== null ? null : estimate(x.digest, x.chunks_ready, x.chunks, now);
    cell(tr, x.ready_after_ms !== null ? "ready after " + dur(x.ready_after_ms) : (eta === null ? "-" : "~" + dur(eta)), "n");
    return tr;
  }), images.length ? "every blob is in an image above" : "no blobs yet", 10);

  const jobs = $("jobs");
  jobs.replaceChildren();
  if (!v.prefetch_jobs || !v.prefetch_jobs.length) {
    const d = document.createElement("div");
    d.className = "empty";
    d.textContent = "no prefetch jobs (shoalctl prefetch --cluster IMAGE)";
    jobs.appendChild(d);
  }
  for (const j of v.prefetch_jobs || []) {
    const t = j.totals;
    const box = document.createElement("div");
    box.className = "card job";
    box.dataset.id = j.id;
    box.style.marginBottom = ".75rem";
    const head = document.createElement("div");
    const eta = j.state === "running" ? estimate(j.id, t.bytes_done, t.bytes_total, now) : 0;
    const title = document.createElement("b");
    title.textContent = j.id + " " + j.images.join(", ");
    head.appendChild(title);
    const st = document.createElement("span");
    st.className = "job-state " + (j.state === "done" ? "ok" : j.state === "failed" ? "bad" : "warn");
    st.textContent = "  " + j.state;
    head.appendChild(st);
    const line = document.createElement("div");
    line.className = "k";
    line.textContent = t.done + " of " + t.nodes + " nodes done, " + t.running + " running, " +
      t.failed + " failed; " + bytes(t.bytes_done) + " of " + bytes(t.bytes_total) + "; " +
      dur(j.elapsed_ms) + (j.state === "running" ? ", about " + (eta === null ? "?" : dur(eta)) + " left" : "");
    line.dataset.done = String(t.done);
    box.append(head, line);
    const wrap = document.createElement("div");
    wrap.className = "scroll";
    const tbl = document.createElement("table");
    tbl.innerHTML = "<thead><tr><th>node (slowest first)</th><th>state</th><th></th><th>bytes</th><th>blobs</th><th>time</th><th>error</th></tr></thead><tbody></tbody>";
    fill(tbl.tBodies[0], j.slowest_nodes.map((n) => {
      const tr = document.createElement("tr");
      cell(tr, n.node);
      cell(tr, n.state, n.state === "done" ? "ok" : n.state === "failed" ? "bad" : "");
      bar(tr, n.bytes_total ? n.bytes_done / n.bytes_total : (n.state === "done" ? 1 : 0));
      cell(tr, bytes(n.bytes_done) + " / " + bytes(n.bytes_total), "n", n.bytes_done);
      cell(tr, n.blobs_done + " / " + n.blobs_total, "n");
      cell(tr, dur(n.elapsed_ms), "n");
      cell(tr, n.error || "", "bad");
      return tr;
    }), "no nodes", 7);
    wrap.appendChild(tbl);
    box.appendChild(wrap);
    jobs.appendChild(box);
  }

  fill($("leases").tBodies[0], (up.leases || []).map((l) => {
    const tr = document.createElement("tr");
    cell(tr, l.digest.slice(7, 19), "mono");
    cell(tr, String(l.chunk), "n");
    cell(tr, l.agent, "mono");
    bar(tr, l.length ? l.bytes / l.length : 0);
    cell(tr, bytes(l.bytes) + " / " + bytes(l.length), "n", l.bytes);
    cell(tr, dur(l.age_ms), "n");
    cell(tr, dur(l.expires_in_ms), "n");
    return tr;
  }), "no upstream fetch in flight", 7);

  fill($("stale").tBodies[0], ((v.agents && v.agents.stale_agents) || []).map((a) => {
    const tr = document.createElement("tr");
    cell(tr, a.node);
    cell(tr, a.agent, "mono");
    cell(tr, dur(a.silent_ms), "n bad");
    return tr;
  }), "every agent that polled is polling", 3);

  $("updated").textContent = "updated " + new Date(now).toLocaleTimeString();
  $("updated").dataset.polls = String(Number($("updated").dataset.polls || 0) + 1);
  last = { t: now, view: v };
}

function askToken(message) {
  $("view").hidden = true;
  $("login").hidden = false;
  $("error").textContent = message || "";
}

async function poll() {
  const token = sessionStorage.getItem(KEY);
  if (!token) { askToken(); return; }
  try {
    const r = await fetch("/v1/cluster", { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(KEY);
      askToken("the tracker refused the token (" + r.status + ")");
      return;
    }
    if (!r.ok) throw new Error("GET /v1/cluster: HTTP " + r.status);
    render(await r.json(), Date.now());
  } catch (e) {
    $("error").textContent = String(e.message || e) + " (retrying)";
  }
}

// A token in the fragment (#token=...) is taken once and removed from the address bar.
const m = location.hash.match(/token=([^&]+)/);
if (m) {
  sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
  window.history.replaceState(null, "", location.pathname);
}
$("token-save").addEventListener("click", () => {
  sessionStorage.setItem(KEY, $("token").value.trim());
  $("token").value = "";
  poll();
});
poll();
setInterval(poll, 2000);
</script>
</body>
</html>
)shoalpage";

}  // namespace

std::string_view ClusterPageHtml() { return kPage; }

}  // namespace shoal::tracker
