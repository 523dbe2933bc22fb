"""The dashboard's one page: HTML with its CSS and JavaScript inline, nothing from elsewhere.

The page holds no state the server does not send: it subscribes to ``/events`` and renders
each document as it arrives (``cluster``: ``status --json`` plus leader changes; ``jobs``:
``jobs --json``; ``job``: ``rounds JOB --json`` plus phi over the last minute). The job shown
is the one named in the address's fragment (``#job=NAME``), else the first open job. Text
from the cluster is inserted as text, never as markup. Times are the leader's wall clock,
shown in the browser's local time.
"""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>rallypoint dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
  :root { --fg:#1d2330; --dim:#6b7280; --line:#e3e6ec; --ok:#0f7b3f; --bad:#b42318;
          --warn:#a15c07; --accent:#2853c8; --bg:#f7f8fa; }
  * { box-sizing: border-box; }
  body { margin:0; font:13px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
         color:var(--fg); background:var(--bg); }
  header { display:flex; gap:16px; align-items:baseline; padding:10px 18px;
           background:#fff; border-bottom:1px solid var(--line); }
  header h1 { font-size:16px; margin:0; }
  main { padding:12px 18px; display:grid; gap:12px; }
  section { background:#fff; border:1px solid var(--line); border-radius:6px; padding:10px 14px; }
  h2 { font-size:14px; margin:0 0 6px; }
  h3 { font-size:13px; margin:10px 0 4px; }
  table { border-collapse:collapse; width:100%; }
  th, td { text-align:left; padding:3px 8px 3px 0; border-bottom:1px solid var(--line);
           vertical-align:top; white-space:nowrap; }
  td.wrap { white-space:normal; }
  th { color:var(--dim); font-weight:500; }
  .num { font-variant-numeric: tabular-nums; }
  .ok { color:var(--ok); } .bad { color:var(--bad); } .warn { color:var(--warn); }
  .dim { color:var(--dim); }
  .pill { display:inline-block; padding:0 6px; border-radius:9px; background:#eef1f6; }
  .pill.leader { background:#e4ecff; color:var(--accent); font-weight:600; }
  .banner { background:#fdecea; color:var(--bad); padding:6px 10px; border-radius:4px; }
  a { color:var(--accent); text-decoration:none; }
  tr.selected td { background:#f1f5ff; }
  .timeline { display:grid; gap:4px; }
  .round { display:grid; grid-template-columns: 90px 1fr; gap:8px; align-items:start;
           border-left:3px solid var(--line); padding:3px 8px; }
  .round.failed { border-left-color:var(--bad); }
  .round.current { border-left-color:var(--ok); }
  .phases { color:var(--dim); }
  svg.spark { vertical-align:middle; }
</style>
</head>
<body>
<header>
  <h1>rallypoint</h1>
  <span id="leader" class="pill leader">leader: ?</span>
  <span id="connection" class="dim">connecting...</span>
  <span id="updated" class="dim"></span>
</header>
<main>
  <section id="cluster-section">
    <h2>Cluster</h2>
    <div id="cluster-error"></div>
    <table id="members"><thead><tr>
      <th>id</th><th>name</th><th>client address</th><th>role</th><th>term</th>
      <th>commit</th><th>applied</th><th>health</th></tr></thead><tbody></tbody></table>
    <h3>Leader changes</h3>
    <div id="leader-changes" class="dim"></div>
  </section>
  <section>
    <h2>Jobs</h2>
    <div id="jobs-error"></div>
    <table id="jobs"><thead><tr>
      <th>job</th><th>round</th><th>state</th><th>world size</th><th>members</th>
      <th>waiting</th><th>reason</th></tr></thead><tbody></tbody></table>
  </section>
  <section id="job">
    <h2 id="job-title">Job</h2>
    <div id="job-summary" class="dim">no job selected</div>
    <h3>Participants</h3>
    <table id="participants"><thead><tr>
      <th>rank</th><th>name</th><th>domain</th><th>participant</th><th>host / metadata</th>
      <th>phi</th>
      <th>phi, last minute</th><th>heartbeat age</th><th>step</th><th>ms/step</th>
      <th>vs median</th></tr></thead>
      <tbody></tbody></table>
    <h3>Rounds (most recent first)</h3>
    <div id="timeline" class="timeline"></div>
    <h3>Recoveries</h3>
    <table id="recoveries"><thead><tr>
      <th>round</th><th>ended because</th><th>by</th><th>detected at</th><th>re-formed</th>
      <th>training again</th><th>restore</th><th>detail</th></tr></thead><tbody></tbody></table>
    <h3>Checkpoint</h3>
    <div id="checkpoint" class="dim">none committed</div>
    <h3>Memory snapshot</h3>
    <div id="memory-snapshot" class="dim">none committed</div>
  </section>
</main>
<script>
"use strict";
const state = { cluster: null, jobs: null, job: {} };

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  return tr;
}
function td(content, cls) {
  const cell = el("td", null, cls);
  if (content instanceof Node) cell.appendChild(content); else cell.textContent = content ?? "";
  return cell;
}
function fill(tableId, rows) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
}
function clock(ms) {
  return ms ? new Date(ms).toLocaleTimeString([], {hour12: false}) + "." +
    String(ms % 1000).padStart(3, "0") : "";
}
function phiText(phi) {
  if (phi === "Infinity") return "inf";
  return typeof phi === "number" ? phi.toFixed(2) : "";
}
function phiValue(phi) { return phi === "Infinity" ? Infinity : Number(phi); }
function selectedJob() {
  const match = location.hash.match(/job=([^&]+)/);
  if (match) return decodeURIComponent(match[1]);
  const jobs = (state.jobs && state.jobs.jobs) || [];
  const open = jobs.find(j => !j.job_closed && j.job_state === "open");
  return open ? open.job : (jobs[0] ? jobs[0].job : null);
}
function jobState(info) {
  if (info.job_closed) return "closed";
  return info.job_state !== "open" ? info.job_state : info.state;
}

function renderCluster() {
  const doc = state.cluster;
  if (!doc) return;
  const error = document.getElementById("cluster-error");
  error.replaceChildren(...(doc.error ? [el("div", doc.error, "banner")] : []));
  const leader = doc.members.find(m => m.is_leader);
  document.getElementById("leader").textContent =
    leader ? "leader: member " + leader.id + " (term " + leader.term + ")" : "no leader";
  fill("members", doc.members.map(m => {
    const health = td(m.health, m.health === "ok" ? "ok" : "bad");
    if (m.error) health.title = m.error;
    const role = td(m.role ?? "", m.is_leader ? "ok" : "");
    role.dataset.member = m.id;
    return row([td(m.id), td(m.name), td(m.client_address), role, td(m.term, "num"),
      td(m.commit_index, "num"), td(m.applied_index, "num"), health]);
  }));
  const changes = doc.leader_changes.slice().reverse().map(c =>
    el("div", clock(c.at_ms) + "  " +
      (c.leader_id ? "member " + c.leader_id + " leads, term " + c.term : "no leader")));
  document.getElementById("leader-changes").replaceChildren(...changes);
}

function renderJobs() {
  const doc = state.jobs;
  if (!doc) return;
  const error = document.getElementById("jobs-error");
  error.replaceChildren(...(doc.error ? [el("div", doc.error, "banner")] : []));
  const chosen = selectedJob();
  fill("jobs", doc.jobs.map(j => {
    const link = el("a", j.job);
    link.href = "#job=" + encodeURIComponent(j.job);
    const tr = row([td(link), td(j.round, "num"), td(jobState(j)), td(j.world_size, "num"),
      td(j.members.map(m => m.name).join(", "), "wrap"), td(j.waiting.length, "num"),
      td(j.reason, "wrap")]);
    tr.dataset.job = j.job;
    if (j.job === chosen) tr.className = "selected";
    return tr;
  }));
}

function sparkline(samples, threshold) {
  const ns = "http://www.w3.org/2000/svg";
  // Times are the dashboard's clock: the newest sample is "now", whatever the browser's.
  const width = 160, height = 28;
  const now = samples.length ? samples[samples.length - 1][0] : 0;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const top = Math.max(threshold, ...samples.map(s => Math.min(phiValue(s[1]), threshold * 2)));
  const x = t => width * (1 - Math.min(Math.max(now - t, 0), 60000) / 60000);
  const y = v => height - 2 - (height - 4) * Math.min(phiValue(v), top) / top;
  const limit = document.createElementNS(ns, "line");
  limit.setAttribute("x1", 0); limit.setAttribute("x2", width);
  limit.setAttribute("y1", y(threshold)); limit.setAttribute("y2", y(threshold));
  limit.setAttribute("stroke", "#f3b4ae"); limit.setAttribute("stroke-dasharray", "3 3");
  svg.appendChild(limit);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", samples.map(s => x(s[0]).toFixed(1) + "," + y(s[1]).toFixed(1))
    .join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#2853c8");
  line.setAttribute("stroke-width", "1.5");
  svg.appendChild(line);
  const title = document.createElementNS(ns, "title");
  title.textContent = "phi over the last minute (dashed: the job's threshold, " + threshold + ")";
  svg.appendChild(title);
  return svg;
}

function renderJob() {
  const name = selectedJob();
  const doc = name ? state.job[name] : null;
  document.getElementById("job-title").textContent = name ? "Job " + name : "Job";
  const summary = document.getElementById("job-summary");
  if (!doc) {
    const known = state.jobs && state.jobs.jobs.some(j => j.job === name);
    summary.textContent = !name ? "no job yet" :
      (state.jobs && !known ? "no job " + name + " (pick one above)" : "loading " + name + "...");
    for (const id of ["participants", "recoveries"]) fill(id, []);
    document.getElementById("timeline").replaceChildren();
    return;
  }
  const info = doc.round;
  summary.replaceChildren(
    el("span", "round "), el("b", info.round, "num"), el("span", " " + jobState(info) +
      ", world size " + info.world_size + ", fencing token " + info.fencing_token + ". "),
    el("span", info.reason),
    el("div", "unit size " + (doc.shape ? doc.shape.unit_size : 1) + "; " + (info.spares || 0) +
      " spare" + (info.spares === 1 ? "" : "s") + " waiting", "dim shape"),
    ...(doc.error ? [el("div", "last refresh failed: " + doc.error, "banner")] : []));
  summary.className = "";
  summary.dataset.round = info.round;
  summary.dataset.state = jobState(info);
  const history = doc.phi_history || {};
  const threshold = doc.phi_threshold || 8;
  const members = info.members.map(m => [m, false]).concat(info.waiting.map(m => [m, true]));
  fill("participants", members.map(([m, waiting]) => {
    const phi = phiValue(m.phi);
    const tr = row([td(m.rank >= 0 ? m.rank : (waiting ? "waiting" : "-")), td(m.name),
      td(m.domain || ""), td(m.participant_id, "num"), td(m.metadata),
      td(phiText(m.phi), "num " + (phi >= threshold ? "bad" : phi >= threshold / 2 ? "warn" : "")),
      td(sparkline(history[String(m.participant_id)] || [], threshold)),
      td(m.heartbeat_age_ms ? m.heartbeat_age_ms + " ms" : "", "num"),
      td(m.step || "", "num"), td(m.step_ms ? m.step_ms.toFixed(0) : "", "num"),
      td(m.step_ratio ? m.step_ratio.toFixed(2) + "x" : "", "num")]);
    tr.dataset.participant = m.name;
    return tr;
  }));
  const names = {};
  for (const record of doc.history) {
    for (const m of record.members) names[m.participant_id] = m.name;
  }
  // Where a recovery's state came from, as its workers reported it (torchrun agents do not).
  const restoreOf = r => r.restore ? "restore: " + r.restore :
    "restore " + (r.reformed_ms === null ? "not yet" : "not reported");
  const recoveryOf = {};
  for (const r of doc.recoveries) recoveryOf[r.round] = r;
  const items = [];
  const current = el("div", null, "round current");
  current.dataset.round = info.round;
  current.append(el("b", "round " + info.round),
    el("div", jobState(info) + " since " + clock(info.closed_ms || info.opened_ms) + " - " +
      info.members.map(m => (m.rank >= 0 ? m.rank + ": " : "") + m.name).join(", ")));
  items.push(current);
  for (const record of doc.history.slice().reverse()) {
    const failed = record.end_reason === "member_failed";
    const item = el("div", null, "round" + (failed ? " failed" : ""));
    item.dataset.round = record.round;
    item.dataset.endReason = record.end_reason || "";
    const by = record.ended_by ? (names[record.ended_by] || String(record.ended_by)) : "";
    const body = el("div");
    body.append(el("div", "opened " + clock(record.opened_ms) + ", active " +
      clock(record.closed_ms) + ", ended " + clock(record.ended_ms) + " - " +
      record.members.map(m => (m.rank >= 0 ? m.rank + ": " : "") + m.name).join(", ")));
    const cause = el("div", "ended: " + (record.end_reason || "?") + (by ? " by " + by : "") +
      (record.detail ? " - " + record.detail : ""), "round-end " +
      (record.end_reason === "member_failed" ? "bad" : ""));
    body.append(cause);
    const recovery = recoveryOf[record.round];
    if (recovery) {
      const phase = (label, after) => label + (after === null ? " not yet" : " +" +
        after.toFixed(2) + " s");
      body.append(el("div", "detected " + clock(recovery.detected_ms) + ", " +
        phase("re-formed", recovery.reformed_after_s) + ", " +
        (recovery.training_ms === null && recovery.reformed_ms !== null
          ? "training again not reported"
          : phase("training again", recovery.training_after_s)) + ", " +
        restoreOf(recovery), "phases"));
    }
    item.append(el("b", "round " + record.round), body);
    items.push(item);
  }
  document.getElementById("timeline").replaceChildren(...items);
  fill("recoveries", doc.recoveries.slice().reverse().map(r => row([td(r.round, "num"),
    td(r.end_reason), td(r.ended_by), td(clock(r.detected_ms)),
    td(r.reformed_after_s === null ? "not yet" : "+" + r.reformed_after_s.toFixed(2) + " s"),
    td(r.training_after_s === null ? (r.reformed_ms === null ? "not yet" : "not reported") :
      "+" + r.training_after_s.toFixed(2) + " s"), td(restoreOf(r).replace(/^restore:? /, "")),
    td(r.detail, "wrap")])));
  const latest = doc.latest_checkpoint;
  const checkpoint = document.getElementById("checkpoint");
  checkpoint.dataset.step = latest ? latest.step : "";
  checkpoint.textContent = latest ?
    "step " + latest.step + " (round " + latest.round + ", world size " + latest.world_size +
    ", id " + latest.checkpoint_id + ") " + latest.uri : "none committed";
  const memory = doc.latest_memory_snapshot;
  const snapshot = document.getElementById("memory-snapshot");
  snapshot.dataset.step = memory ? memory.step : "";
  snapshot.textContent = memory ?
    "step " + memory.step + " (round " + memory.round + ", world size " + memory.world_size +
    ", id " + memory.snapshot_id + ")" : "none committed";
}

function connect() {
  const source = new EventSource("/events");
  const status = document.getElementById("connection");
  const touched = () => {
    document.getElementById("updated").textContent = "updated " + clock(Date.now());
  };
  source.onopen = () => { status.textContent = "live"; status.className = "ok"; };
  source.onerror = () => { status.textContent = "reconnecting..."; status.className = "bad"; };
  source.addEventListener("cluster", e => {
    state.cluster = JSON.parse(e.data);
    renderCluster();
    touched();
  });
  source.addEventListener("jobs", e => {
    state.jobs = JSON.parse(e.data);
    renderJobs();
    renderJob();
    touched();
  });
  source.addEventListener("job", e => {
    const doc = JSON.parse(e.data);
    state.job[doc.round.job] = doc;
    if (doc.round.job === selectedJob()) renderJob();
    touched();
  });
  source.addEventListener("job_gone", e => {
    delete state.job[JSON.parse(e.data).job];
    renderJob();
  });
}
window.addEventListener("hashchange", () => { renderJobs(); renderJob(); });
connect();
</script>
</body>
</html>
"""
