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
  if (run.hung && run.state === "running") return "hung";  // its hang watcher found it stuck
  if (run.error && run.error.code === "run-over-budget") return "over budget";
  return run.state || "unknown";
}

function where(run) {
  if (!run.cluster && !run.hosts && run.bucket) return run.bucket;  // only in its bucket
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
  const { state: want, host } = runFilters();
  showFilters();
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
    moreCells(row, run);
    body.append(row);
  }
}

async function loadRuns() {
  try {
    const got = await api("/api/runs");
    lastRuns = got.runs;
    const states = new Set(lastRuns.map(stateOf));
    const select = $("state-filter"), chosen = runFilters().state;
    if (chosen) states.add(chosen);
    select.replaceChildren(el("option", "all"));
    select.firstChild.value = "";
    for (const s of [...states].sort()) { const o = el("option", s); o.value = s; select.append(o); }
    select.value = chosen;
    drawRuns();
    const lines = got.unreached.map((p) => `${p.cluster || p.bucket || (p.hosts || []).join(",")}: ${p.error && p.error.message}`);
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
  if (!run.cluster && !run.hosts && run.bucket) {  // only in its bucket: its files from there
    const store = run.bucket.slice(0, run.bucket.lastIndexOf("/"));
    rows.push(["files", `vmrun fetch results --store ${store} --run ${run.run}`]);
  }
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

// -- the runs page's filters (kept in the address: a reload keeps them), more cells ------
let sweepOf = new Map();  // run id -> {sweep, label}: the runs page marks a sweep's runs

function runFilters() {
  const query = /^#\/\?(.*)$/.exec(location.hash);
  const params = new URLSearchParams(query ? query[1] : "");
  return { state: params.get("state") || "", host: (params.get("host") || "").trim() };
}

function keepFilters() {
  const params = new URLSearchParams();
  if ($("state-filter").value) params.set("state", $("state-filter").value);
  if ($("host-filter").value.trim()) params.set("host", $("host-filter").value.trim());
  const text = params.toString();
  history.replaceState(null, "", text ? `#/?${text}` : "#/");
  drawRuns();
}

function showFilters() {
  const { state, host } = runFilters();
  if ($("host-filter") !== document.activeElement) $("host-filter").value = host;
  if ($("state-filter").value !== state) $("state-filter").value = state;
}

function slowRanks(run) {
  return (run.slow_ranks || []).map((s) => `r${s.rank}${s.node === null ? "" : ` (node ${s.node})`} ${s.ratio}x`).join(", ") || "-";
}

function moreCells(row, run) {
  row.append(el("td", slowRanks(run)));
  const mine = sweepOf.get(run.run), cell = el("td", mine ? null : "-");
  if (mine) {
    const link = el("a", `${mine.sweep} ${mine.label}`);
    link.href = `#/sweep/${encodeURIComponent(mine.sweep)}`;
    cell.append(link);
    row.dataset.sweep = mine.sweep;
  }
  row.append(cell);
}

async function loadSweeps() {
  try {
    const got = await api("/api/sweeps");
    sweepOf = new Map();
    const list = $("sweeps");
    list.replaceChildren();
    for (const sw of got.sweeps) {
      for (const [run, label] of Object.entries(sw.runs || {})) sweepOf.set(run, { sweep: sw.id, label });
      const item = el("li"), link = el("a", sw.id);
      link.href = `#/sweep/${encodeURIComponent(sw.id)}`;
      const states = Object.entries(sw.states || {}).map(([k, n]) => `${n} ${k}`).join(", ");
      item.append(link, el("span", sw.error ? ` (${sw.error})` : ` on ${sw.where}: ${sw.sizes} size(s), ${states}`));
      list.append(item);
    }
    $("sweeps-box").hidden = !got.sweeps.length;
    drawRuns();
  } catch (e) {
    $("unreached").textContent = `sweeps: ${e.message}`;
  }
}

// -- a sweep's page (its report and plots, as `vmrun sweep` writes them) -----------------
let sweepCharts = [];

function sweepRoute() {
  const match = /^#\/sweep\/(.+)$/.exec(location.hash);
  $("sweep-page").hidden = !match;
  if (!match) return false;
  $("runs-page").hidden = $("run-page").hidden = $("gpus-page").hidden = true;
  current = null;
  loadSweep(decodeURIComponent(match[1]));
  return true;
}

function sweepTable(table) {
  const head = el("tr"), body = $("sweep-report").querySelector("tbody");
  table.heads.forEach((h, i) => head.append(el("th", h, table.numeric.includes(i) ? "num" : null)));
  $("sweep-report").querySelector("thead").replaceChildren(head);
  body.replaceChildren();
  for (const cells of table.rows) {
    const row = el("tr");
    row.dataset.run = cells[0];
    cells.forEach((c, i) => row.append(el("td", c, table.numeric.includes(i) ? "num" : null)));
    body.append(row);
  }
}

function sweepPlot(plot, i) {
  const box = el("div", null, "sweep-chart");
  box.dataset.metric = plot.metric;
  const epochs = [...new Set(plot.series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  box.dataset.points = String(epochs.length);
  box.dataset.series = String(plot.series.length);
  const data = [epochs, ...plot.series.map((s) => {
    const by = new Map(s.points);
    return epochs.map((e) => (by.has(e) ? by.get(e) : null));
  })];
  const colours = ["#1971c2", "#e8590c", "#2f9e44", "#9c36b5", "#c92a2a", "#0b7285", "#5c940d", "#862e9c"];
  const opts = {
    title: plot.title, width: Math.max(320, $("sweep-plots").clientWidth / 2 - 20 || 480), height: 280,
    scales: { x: { time: false } },
    axes: [{ label: "epoch", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, { label: plot.metric }],
    series: [{ label: "epoch" }, ...plot.series.map((s, j) => ({ label: s.label, stroke: colours[j % colours.length], points: { show: true } }))],
  };
  $("sweep-plots").append(box);
  if (epochs.length) sweepCharts.push(new uPlot(opts, data, box));
  return i;
}

async function loadSweep(sweepId) {
  $("sweep-id").textContent = sweepId;
  for (const c of sweepCharts) c.destroy();
  sweepCharts = [];
  $("sweep-plots").replaceChildren();
  try {
    const got = await api(`/api/sweeps/${encodeURIComponent(sweepId)}`);
    $("sweep-where").textContent = `on ${got.where}`;
    const sizes = $("sweep-sizes").querySelector("tbody");
    sizes.replaceChildren();
    for (const s of got.sizes) {
      const row = el("tr"), run = el("td");
      if (s.run) { const a = el("a", s.run); a.href = `#/run/${encodeURIComponent(s.run)}`; run.append(a); } else run.textContent = "-";
      row.append(el("td", s.label), el("td", s.words || "-"), run, el("td", s.state + (s.detail ? ` (${s.detail})` : ""), `state ${s.state}`));
      sizes.append(row);
    }
    sweepTable(got.table);
    const left = got.rows.filter((r) => r.error).map((r) => `${r.run}: ${r.error.message}`);
    $("sweep-note").textContent = [got.note, ...left].filter(Boolean).join("\n");
    got.plots.forEach(sweepPlot);
  } catch (e) {
    $("sweep-note").textContent = e.message;
  }
}

// -- the GPUs page's clusters (`watch-gpus -C`: the GPUs of the running jobs' nodes) ------
async function loadClusterGpus() {
  try {
    const got = await api("/api/gpus/clusters");
    const body = document.querySelector("#cluster-gpus tbody");
    body.replaceChildren();
    const notes = [];
    for (const c of got.clusters) {
      if (c.error || c.note) notes.push(`cluster ${c.cluster}: ${c.error || c.note}`);
      for (const host of c.hosts) {
        const rows = host.gpus.length ? host.gpus.map((g) => gpuRow(host, g, host.processes)) : [gpuRow(host, null, [])];
        for (const row of rows) { row.dataset.cluster = c.cluster; row.prepend(el("td", c.cluster)); body.append(row); }
      }
    }
    $("clusters-note").textContent = notes.join("\n");
    $("clusters-box").hidden = !got.clusters.length;
  } catch (e) {
    $("clusters-note").textContent = e.message;
  }
}

// -- routing ---------------------------------------------------------------------------
function route() {
  clearInterval(runsTimer); clearInterval(metricsTimer);
  if (source) { source.close(); source = null; }
  if (sweepRoute()) return;
  const match = /^#\/run\/(.+)$/.exec(location.hash);
  const gpus = location.hash === "#/gpus";
  $("runs-page").hidden = !!match || gpus;
  $("run-page").hidden = !match;
  $("gpus-page").hidden = !gpus;
  if (gpus) {
    current = null;
    loadGpus();
    loadClusterGpus();
    runsTimer = setInterval(() => { if (!document.hidden) { loadGpus(); loadClusterGpus(); } }, GPUS_EVERY_MS);
    return;
  }
  if (!match) {
    current = null;
    loadSweeps();
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

$("state-filter").addEventListener("change", keepFilters);
$("host-filter").addEventListener("input", keepFilters);
$("log-filter").addEventListener("change", refilter);
$("log-search").addEventListener("input", refilter);
$("stacks-button").addEventListener("click", stacksNow);
$("stop-button").addEventListener("click", stopRun);
window.addEventListener("hashchange", route);
route();
