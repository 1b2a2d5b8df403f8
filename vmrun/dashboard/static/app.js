// vmrun dashboard: the runs (`status`), a run's live log (`logs -f`), its loss by epoch
// (`report`'s metrics), its stacks (`stacks`) and stop (`stop`), from the JSON API here.
// A run's page also charts its throughput and each rank's step time, draws its timeline
// (its events) and lists the files `fetch results` would bring.
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
    const asked = api("/api/runs");
    new Date().toLocaleString(); // loads the locale's data (30 ms in a new browser) meanwhile
    const got = await asked;
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
    $("unreached").textContent = [...(got.notes || []), ...lines].join("\n");
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    $("updated").textContent = `not updated: ${e.message}`;
  }
}

// -- a run's page ----------------------------------------------------------------------
function addLine(line) {
  const log = $("log");
  const div = el("div", line.text, line.kind === "log" ? null : line.kind);
  const from = sourceOf(line.text);
  div.dataset.node = from.node;
  div.dataset.rank = from.rank;
  addChoice("log-node", from.node);
  addChoice("log-rank", from.rank, (r) => `rank ${r}`);
  div.hidden = !shown(div);
  const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.append(div);
  if (atEnd) log.scrollTop = log.scrollHeight;
  countShown();
  if (line.kind === "end") $("log-state").textContent = "ended";
  if (line.kind === "end" || EVENT_LINE.test(line.text)) eventsSoon(current);
}

// a line's node and rank, from the prefix vmrun's log gives it: `[host rankN]` (several
// hosts), `[rankN]` (one host), `[host]` (torchrun's own lines on several hosts)
function sourceOf(text) {
  const m = /^\[(?:([^\]\s]+) )?rank(\d+)\]/.exec(text) || /^\[([^\]\s]+)\]/.exec(text);
  if (!m) return { node: "", rank: "" };
  return { node: m[1] || "", rank: m[2] || "" };
}

function addChoice(id, value, label) {
  const select = $(id);
  if (!value || [...select.options].some((o) => o.value === value)) return;
  const o = el("option", label ? label(value) : value); o.value = value;
  const after = [...select.options].slice(1).find((x) => x.value.localeCompare(value, undefined, { numeric: true }) > 0);
  select.insertBefore(o, after || null);
}

function shown(div) {
  const node = $("log-node").value, rank = $("log-rank").value;
  const text = $("log-search").value.toLowerCase();
  return (!node || div.dataset.node === node) && (!rank || div.dataset.rank === rank)
    && (!text || div.textContent.toLowerCase().includes(text));
}

function countShown() {
  const log = $("log"), all = log.children.length;
  const narrowed = $("log-node").value || $("log-rank").value || $("log-search").value;
  if (!narrowed) { $("log-count").textContent = ""; return; }
  let n = 0;
  for (const div of log.children) if (!div.hidden) n++;
  $("log-count").textContent = `${n} of ${all} lines`;
}

function refilter() {
  for (const div of $("log").children) div.hidden = !shown(div);
  countShown();
}

function follow(runId) {
  if (source) source.close();
  $("log").replaceChildren();
  for (const id of ["log-node", "log-rank"]) {
    $(id).replaceChildren(el("option", "all"));
    $(id).firstChild.value = "";
  }
  $("log-count").textContent = "";
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

// uPlot (53 KB) is loaded by the first chart, not by the page: it would delay the runs
let chartLibrary = null;
function chartsReady() {
  if (window.uPlot) return Promise.resolve();
  chartLibrary = chartLibrary || new Promise((resolve, reject) => {
    const script = el("script");
    script.src = "/static/uPlot.iife.min.js";
    script.onload = resolve;
    script.onerror = () => { chartLibrary = null; reject(new Error("the chart library did not load")); };
    document.head.append(script);
  });
  return chartLibrary;
}

async function loadMetrics(runId) {
  try {
    const got = await api(`/api/runs/${encodeURIComponent(runId)}/metrics`);
    await chartsReady();
    if (current !== runId) return;
    drawChart(got.metrics);
    drawMoreCharts(got);
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

// -- a run's charts, timeline and files -------------------------------------------------
const COLOURS = ["#1971c2", "#e8590c", "#2f9e44", "#9c36b5", "#c92a2a", "#0b7285", "#5f3dc4", "#862e9c"];
const charts = {};
// a log line that may be a new event: a snapshot saved, or vmrun's own word (a notice, a
// hang, the budget, a recovery)
const EVENT_LINE = /snapshot.*saved|checkpoint \S+ complete|(^|\] )vmrun: /i;
// a run's events and files are read again (a listing, its log, on its hosts) this soon after
// such a line, and then at most once every EVENTS_EVERY_MS while such lines keep coming
const EVENTS_SOON_MS = 1500;
const EVENTS_EVERY_MS = 10000;
let eventsTimer = null;
let eventsLast = -Infinity; // when they were last read

function plot(id, xLabel, yLabel, xs, series) {
  const box = $(id);
  box.dataset.points = String(xs.length);
  box.dataset.series = String(series.length);
  box.dataset.labels = series.map((s) => s.label).join(",");
  if (charts[id]) { charts[id].destroy(); charts[id] = null; }
  box.replaceChildren();
  if (!xs.length || !series.length) { box.append(el("div", "nothing recorded", "note")); return; }
  const opts = {
    width: Math.max(280, box.clientWidth || 420), height: 200,
    scales: { x: { time: false } },
    axes: [{ label: xLabel }, { label: yLabel }],
    series: [{ label: xLabel }, ...series.map((s, i) => ({ label: s.label, stroke: COLOURS[i % COLOURS.length], points: { show: true } }))],
  };
  charts[id] = new uPlot(opts, [xs, ...series.map((s) => s.values)], box);
}

function byEpoch(pointLists) {
  const xs = [...new Set(pointLists.flatMap((ps) => ps.map((p) => p[0])))].sort((a, b) => a - b);
  const values = pointLists.map((ps) => { const m = new Map(ps); return xs.map((x) => (m.has(x) ? m.get(x) : null)); });
  return [xs, values];
}

function drawMoreCharts(got) {
  const rate = got.metrics.samples_per_s || [];
  const [rx, [rv]] = byEpoch([rate]);
  plot("chart-rate", "epoch", "samples/s", rx, rate.length ? [{ label: "samples/s", values: rv }] : []);
  const ranks = Object.keys(got.rank_series || {}).sort((a, b) => a - b);
  const [sx, sv] = byEpoch(ranks.map((r) => got.rank_series[r].map(([e, t]) => [e, t * 1000])));
  const nodes = got.rank_node || [];
  plot("chart-ranks", "epoch", "step time (ms)", sx, ranks.map((r, i) => ({
    label: `rank ${r}` + (nodes[r] !== undefined ? ` (node ${nodes[r]})` : ""), values: sv[i],
  })));
}

function clock(at) {
  return at === null || at === undefined ? "-" : new Date(at * 1000).toLocaleString();
}

function eventsSoon(runId) {
  if (eventsTimer !== null) return; // a reading is due: it comes after this line too
  const wait = Math.max(EVENTS_SOON_MS, eventsLast + EVENTS_EVERY_MS - Date.now());
  eventsTimer = setTimeout(() => {
    eventsTimer = null;
    if (current !== runId) return;
    eventsLast = Date.now();
    loadEvents(runId);
    loadFiles(runId);
  }, wait);
}

async function loadEvents(runId) {
  try {
    const got = await api(`/api/runs/${encodeURIComponent(runId)}/events`);
    if (current !== runId) return;
    drawEvents(got.events);
    $("events-note").textContent = got.note || "";
  } catch (e) {
    $("events-note").textContent = e.message;
  }
}

function drawEvents(events) {
  const timed = events.filter((e) => e.at !== null);
  const start = Math.min(...timed.map((e) => e.at - (e.duration_s || 0)));
  const ended = events.some((e) => e.kind === "end");
  const last = Math.max(...timed.map((e) => e.at), ended ? -Infinity : Date.now() / 1000);
  const span = Math.max(last - start, 1);
  const bar = $("timeline");
  bar.replaceChildren();
  for (const e of timed) {
    const from = e.at - (e.duration_s || 0);
    const mark = el("span", null, `mark ${e.kind}`);
    mark.style.left = `${Math.min(99.5, (100 * (from - start)) / span)}%`;
    if (e.duration_s) mark.style.width = `${Math.max(0.4, (100 * e.duration_s) / span)}%`;
    mark.title = `${clock(e.at)} ${e.kind}: ${e.text}`;
    mark.dataset.kind = e.kind;
    bar.append(mark);
  }
  const body = document.querySelector("#events tbody");
  body.replaceChildren();
  for (const e of events) {
    const row = el("tr");
    row.dataset.kind = e.kind;
    const offset = e.at !== null && timed.length ? `+${duration(e.at - start)}` : "";
    row.append(el("td", clock(e.at)), el("td", offset), el("td", e.kind, `kind ${e.kind}`),
      el("td", e.text + (e.node ? ` (${e.node})` : "")), el("td", e.duration_s ? duration(e.duration_s) : ""));
    body.append(row);
  }
}

function size(bytes) {
  if (bytes < 0) return "link";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let n = bytes, u = 0;
  while (n >= 1024 && u < units.length - 1) { n /= 1024; u++; }
  return u ? `${n.toFixed(1)} ${units[u]}` : `${n} B`;
}

async function loadFiles(runId) {
  try {
    const got = await api(`/api/runs/${encodeURIComponent(runId)}/files`);
    if (current !== runId) return;
    const body = document.querySelector("#files tbody");
    body.replaceChildren();
    for (const f of got.files) {
      const row = el("tr");
      row.dataset.path = f.path;
      row.dataset.kind = f.kind;
      row.append(el("td", f.path), el("td", f.kind), el("td", size(f.size)),
        el("td", f.nodes.join(", ")), el("td", f.here ? "here" : ""));
      body.append(row);
    }
    const here = got.files.filter((f) => f.here).length;
    const failed = Object.entries(got.failed).map(([n, why]) => `${n}: not listed (${why})`);
    $("files-total").textContent = [`${got.files.length} files, ${size(got.bytes)}${here ? `, ${here} here already` : ""}`, ...failed].join("; ");
    $("fetch-command").textContent = got.command;
  } catch (e) {
    $("files-total").textContent = e.message;
  }
}

async function copyCommand() {
  const text = $("fetch-command").textContent;
  try {
    await navigator.clipboard.writeText(text);
    $("fetch-copy").textContent = "Copied";
  } catch (e) {
    window.getSelection().selectAllChildren($("fetch-command"));
    $("fetch-copy").textContent = "Selected: copy it";
  }
  setTimeout(() => { $("fetch-copy").textContent = "Copy"; }, 2000);
}

function clearRunSections() {
  clearTimeout(eventsTimer);
  eventsTimer = null;
  for (const id of ["chart-rate", "chart-ranks", "timeline", "fetch-command"]) $(id).replaceChildren();
  for (const id of ["#events tbody", "#files tbody"]) document.querySelector(id).replaceChildren();
  for (const id of ["events-note", "files-total"]) $(id).textContent = "";
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
    await chartsReady();
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
  clearRunSections();
  loadEvents(runId);
  loadFiles(runId);
  loadRun(runId).then((run) => {
    loadMetrics(runId);
    if (run && ["running", "recovering", "pending"].includes(stateOf(run))) {
      metricsTimer = setInterval(() => { if (!document.hidden) { loadMetrics(runId); loadRun(runId); } }, METRICS_EVERY_MS);
    }
  });
}

$("state-filter").addEventListener("change", keepFilters);
$("host-filter").addEventListener("input", keepFilters);
$("log-node").addEventListener("change", refilter);
$("log-rank").addEventListener("change", refilter);
$("files-refresh").addEventListener("click", () => loadFiles(current));
$("fetch-copy").addEventListener("click", copyCommand);
$("log-search").addEventListener("input", refilter);
$("stacks-button").addEventListener("click", stacksNow);
$("stop-button").addEventListener("click", stopRun);
window.addEventListener("hashchange", route);
route();
