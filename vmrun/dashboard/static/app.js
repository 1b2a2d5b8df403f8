// vmrun dashboard: the runs (`status`), a run's live log (`logs -f`), its loss by epoch
// (`report`'s metrics), its stacks (`stacks`) and stop (`stop`), from the JSON API here.
"use strict";
const $ = (id) => document.getElementById(id);
const RUNS_EVERY_MS = 10000;
const METRICS_EVERY_MS = 10000;
let runsTimer = null, metricsTimer = null, source = null, chart = null, current = null;
let lastRuns = [];

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

async function api(path, options) {
  const resp = await fetch(path, Object.assign({ credentials: "same-origin" }, options || {}));
  const body = await resp.json();
  if (!resp.ok) throw new Error((body.error && body.error.message) || resp.statusText);
  return body;
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(r)}` : `${m}:${pad(r)}`;
}

function money(cost) {
  if (!cost || cost.amount === null || cost.amount === undefined) return "-";
  const amount = cost.amount.toFixed(2);
  return cost.currency === "USD" || !cost.currency ? `$${amount}` : `${amount} ${cost.currency}`;
}

function stateOf(run) {
  const rec = run.recoveries;
  if (rec && rec.under_way && run.state !== "running") return "recovering";
  return run.state || "unknown";
}

function where(run) {
  return run.cluster ? `cluster ${run.cluster}` : (run.hosts || []).join(", ");
}

function progress(run) {
  if (run.epochs_done === null || run.epochs_done === undefined) return "-";
  return run.epochs_asked ? `epoch ${run.epochs_done}/${run.epochs_asked}` : `epoch ${run.epochs_done}`;
}

function recoveries(run) {
  const rec = run.recoveries;
  if (!rec) return "-";
  return `${rec.count}${rec.gave_up ? ", gave up" : ""}${rec.under_way ? ", under way" : ""}`;
}

// -- the runs page ---------------------------------------------------------------------
function drawRuns() {
  const want = $("state-filter").value, host = $("host-filter").value.trim();
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  for (const run of lastRuns.slice().reverse()) {
    const state = stateOf(run);
    if (want && state !== want) continue;
    if (host && !where(run).includes(host)) continue;
    const row = el("tr");
    row.dataset.run = run.run;
    const link = el("a", run.run);
    link.href = `#/run/${encodeURIComponent(run.run)}`;
    const first = el("td"); first.append(link); row.append(first);
    row.append(el("td", where(run)));
    row.append(el("td", state + (run.error ? ` (${run.error.message || run.error})` : ""), `state ${state}`));
    row.append(el("td", progress(run)));
    row.append(el("td", run.start ? new Date(run.start).toLocaleString() : "-"));
    row.append(el("td", duration(run.duration_s)));
    row.append(el("td", money(run.cost)));
    row.append(el("td", recoveries(run)));
    row.append(el("td", run.store ? run.store.state : "-"));
    body.append(row);
  }
}

async function loadRuns() {
  try {
    const got = await api("/api/runs");
    lastRuns = got.runs;
    const states = new Set(lastRuns.map(stateOf));
    const select = $("state-filter"), chosen = select.value;
    select.replaceChildren(el("option", "all"));
    select.firstChild.value = "";
    for (const s of [...states].sort()) { const o = el("option", s); o.value = s; select.append(o); }
    select.value = chosen;
    drawRuns();
    const lines = got.unreached.map((p) => `${p.cluster || (p.hosts || []).join(",")}: ${p.error && p.error.message}`);
    $("unreached").textContent = lines.join("\n");
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("updated").textContent = `not updated: ${e.message}`;
  }
}

// -- a run's page ----------------------------------------------------------------------
function addLine(line) {
  const log = $("log");
  const div = el("div", line.text, line.kind === "log" ? null : line.kind);
  const tag = /^\[([^\]]+)\]/.exec(line.text);
  div.dataset.source = tag ? tag[1] : "";
  if (tag && !log.dataset.sources.split("\n").includes(tag[1])) {
    log.dataset.sources += "\n" + tag[1];
    const o = el("option", tag[1]); o.value = tag[1]; $("log-filter").append(o);
  }
  div.hidden = !shown(div);
  const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.append(div);
  if (atEnd) log.scrollTop = log.scrollHeight;
  if (line.kind === "end") $("log-state").textContent = "ended";
}

function shown(div) {
  const source = $("log-filter").value, text = $("log-search").value;
  return (!source || div.dataset.source === source) && (!text || div.textContent.includes(text));
}

function refilter() {
  for (const div of $("log").children) div.hidden = !shown(div);
}

function follow(runId) {
  if (source) source.close();
  $("log").replaceChildren();
  $("log").dataset.sources = "";
  $("log-filter").replaceChildren(el("option", "all"));
  $("log-filter").firstChild.value = "";
  $("log-state").textContent = "following";
  source = new EventSource(`/api/runs/${encodeURIComponent(runId)}/log`);
  source.onmessage = (event) => {
    const line = JSON.parse(event.data);
    addLine(line);
    if (line.kind === "end") { source.close(); source = null; }
  };
  source.onerror = () => { $("log-state").textContent = "reconnecting"; };
}

function drawChart(metrics) {
  const names = Object.keys(metrics).filter((n) => n.includes("loss"));
  const box = $("chart");
  const epochs = [...new Set(names.flatMap((n) => metrics[n].map((p) => p[0])))].sort((a, b) => a - b);
  box.dataset.points = String(epochs.length);
  box.dataset.series = names.join(",");
  const data = [epochs, ...names.map((n) => {
    const by = new Map(metrics[n]);
    return epochs.map((e) => (by.has(e) ? by.get(e) : null));
  })];
  const colours = ["#1971c2", "#e8590c", "#2f9e44", "#9c36b5"];
  const opts = {
    width: Math.max(320, box.clientWidth || 600), height: 260,
    scales: { x: { time: false } },
    axes: [{ label: "epoch" }, { label: "loss" }],
    series: [{ label: "epoch" }, ...names.map((n, i) => ({ label: n, stroke: colours[i % 4], points: { show: true } }))],
  };
  if (chart) chart.destroy();
  box.replaceChildren();
  chart = epochs.length ? new uPlot(opts, data, box) : null;
}

async function loadMetrics(runId) {
  try {
    const got = await api(`/api/runs/${encodeURIComponent(runId)}/metrics`);
    if (current !== runId) return;
    drawChart(got.metrics);
    $("metrics-note").textContent = got.note || "";
  } catch (e) {
    $("metrics-note").textContent = e.message;
  }
}

function provenance(run) {
  const dl = $("provenance");
  dl.replaceChildren();
  const launch = (run.record && run.record.launch) || {};
  const rows = [
    ["where", where(run)], ["launcher", run.launcher], ["nodes", run.nodes],
    ["world size", run.world_size], ["commit", run.commit ? run.commit + (run.dirty ? " (with changes)" : "") : null],
    ["script", launch.script], ["arguments", (launch.args || []).join(" ")],
    ["image", run.image], ["versions", run.versions ? Object.entries(run.versions).map(([k, v]) => `${k} ${v}`).join(", ") : null],
    ["cost", money(run.cost)], ["exit", run.exit],
  ];
  for (const [k, v] of rows) {
    if (v === null || v === undefined || v === "") continue;
    dl.append(el("dt", k), el("dd", v));
  }
}

async function loadRun(runId) {
  try {
    const run = await api(`/api/runs/${encodeURIComponent(runId)}`);
    if (current !== runId) return;
    const state = stateOf(run);
    $("run-state").textContent = state;
    $("run-state").className = `state ${state}`;
    provenance(run);
    return run;
  } catch (e) {
    $("run-state").textContent = e.message;
  }
}

async function act(verb, runId) {
  const headers = { "Content-Type": "application/json" };
  return api(`/api/runs/${encodeURIComponent(runId)}/${verb}`, { method: "POST", headers, body: "{}" });
}

async function stacksNow() {
  const runId = current;
  $("action-note").textContent = "taking stacks...";
  try {
    const got = await act("stacks", runId);
    const failed = Object.entries(got.failed || {}).map(([n, why]) => `${n}: ${why}`);
    const ranks = got.ranks.map((r) => `rank ${r.rank} on ${r.node}: ${r.error || r.place}`);
    $("stacks").textContent = [...got.lines, "", ...ranks, ...failed].join("\n");
    $("stacks").hidden = false;
    $("action-note").textContent = got.saved ? `kept in ${got.saved}` : "";
  } catch (e) {
    $("action-note").textContent = `stacks: ${e.message}`;
  }
}

async function stopRun() {
  const runId = current;
  if (!window.confirm(`Stop run ${runId} on every node? Its processes get SIGTERM, then SIGKILL.`)) {
    $("action-note").textContent = "not stopped";
    return;
  }
  $("action-note").textContent = "stopping...";
  try {
    const got = await act("stop", runId);
    const lines = got.nodes.map((n) => n.error ? `${n.node}: ${n.error}`
      : n.signalled ? `${n.node}: stopped ${n.signalled} process(es)${n.killed ? `, ${n.killed} needed SIGKILL` : ""}; none left`
      : `${n.node}: had already ended`);
    for (const [node, why] of Object.entries(got.unreached)) lines.push(`${node}: not stopped (${why})`);
    $("stopped").textContent = lines.join("\n");
    $("stopped").hidden = false;
    $("action-note").textContent = got.exit === 0 ? "stopped" : "not every node was stopped";
    loadRun(runId);
  } catch (e) {
    $("action-note").textContent = `stop: ${e.message}`;
  }
}

// -- the GPUs page (`watch-gpus`) -------------------------------------------------------
const GPUS_EVERY_MS = 2000;
const num = (v, unit) => (v === null || v === undefined ? "-" : `${Math.round(v)}${unit}`);

function gpuRow(host, gpu, procs) {
  const row = el("tr");
  row.dataset.host = host.host;
  row.append(el("td", host.host), el("td", host.state + (host.message ? ` (${host.message})` : ""), `state ${host.state}`));
  if (!gpu) { for (let i = 0; i < 7; i++) row.append(el("td", "-")); return row; }
  const mem = gpu.memory_total_mib ? `${num(gpu.memory_used_mib, "")}/${num(gpu.memory_total_mib, " MiB")}` : "-";
  const flags = [...gpu.health, ...(gpu.idle_alert ? [`idle ${Math.round(gpu.idle_for_s)} s`] : [])];
  const mine = procs.filter((p) => p.gpu_uuid === gpu.uuid).map((p) => `${p.pid} ${p.name}${p.run ? ` (${p.run})` : ""}`);
  row.append(el("td", `${gpu.index} ${gpu.name}`), el("td", num(gpu.utilization_pct, " %")), el("td", mem),
    el("td", num(gpu.temperature_c, " °C")), el("td", num(gpu.power_draw_w, " W")),
    el("td", flags.join(", ") || "ok"), el("td", mine.join("; ") || "-"));
  return row;
}

async function loadGpus() {
  try {
    const got = await api("/api/gpus");
    $("gpus-error").textContent = got.error || "";
    const body = document.querySelector("#gpus tbody");
    body.replaceChildren();
    for (const host of got.hosts) {
      if (!host.gpus.length) body.append(gpuRow(host, null, []));
      for (const gpu of host.gpus) body.append(gpuRow(host, gpu, host.processes));
    }
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("gpus-error").textContent = e.message;
  }
}

// -- routing ---------------------------------------------------------------------------
function route() {
  clearInterval(runsTimer); clearInterval(metricsTimer);
  if (source) { source.close(); source = null; }
  const match = /^#\/run\/(.+)$/.exec(location.hash);
  const gpus = location.hash === "#/gpus";
  $("runs-page").hidden = !!match || gpus;
  $("run-page").hidden = !match;
  $("gpus-page").hidden = !gpus;
  if (gpus) {
    current = null;
    loadGpus();
    runsTimer = setInterval(() => { if (!document.hidden) loadGpus(); }, GPUS_EVERY_MS);
    return;
  }
  if (!match) {
    current = null;
    loadRuns();
    runsTimer = setInterval(() => { if (!document.hidden) loadRuns(); }, RUNS_EVERY_MS);
    return;
  }
  const runId = decodeURIComponent(match[1]);
  current = runId;
  $("run-id").textContent = runId;
  $("stacks").hidden = $("stopped").hidden = true;
  $("action-note").textContent = "";
  follow(runId);
  loadRun(runId).then((run) => {
    loadMetrics(runId);
    if (run && ["running", "recovering", "pending"].includes(stateOf(run))) {
      metricsTimer = setInterval(() => { if (!document.hidden) { loadMetrics(runId); loadRun(runId); } }, METRICS_EVERY_MS);
    }
  });
}

$("state-filter").addEventListener("change", drawRuns);
$("host-filter").addEventListener("input", drawRuns);
$("log-filter").addEventListener("change", refilter);
$("log-search").addEventListener("input", refilter);
$("stacks-button").addEventListener("click", stacksNow);
$("stop-button").addEventListener("click", stopRun);
window.addEventListener("hashchange", route);
route();
