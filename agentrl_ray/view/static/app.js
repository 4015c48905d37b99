// agentrl-ray view: the page. It polls the JSON API of server.py every 2 s, asks each run's metrics only from the
// record it has not seen yet, and draws with uPlot (vendored: static/uPlot.iife.min.js).
"use strict";

const POLL_MS = 2000;
const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const BAND = "rgba(31,119,180,0.15)";
const STEP_AXIS = { label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] };
const ratio = (a, b) => (r) => (r[a] !== undefined && r[b] ? r[a] / r[b] : null);

// The curves of one run: each a chart of named series, a series a value of a metrics.jsonl record (null: absent).
const CHARTS = [
  { id: "reward", title: "training reward and success", unit: true, series: [["reward (mean)", "reward/mean"], ["success", "rollout/success"]] },
  { id: "heldout", title: "held-out success (pass@1, 95% CI)", band: true, unit: true,
    series: [["held-out success", "eval/success"], ["CI low", "eval/pass@1_ci95_lo"], ["CI high", "eval/pass@1_ci95_hi"]] },
  { id: "entropy", title: "policy entropy (action tokens)", series: [["entropy", "loss/entropy"]] },
  { id: "kl", title: "KL", series: [["KL to reference", "loss/kl"], ["learner vs rollout", "loss/mismatch_kl"]] },
  { id: "echo", title: "ECHO cross-entropy on tool-output tokens", series: [["train", "loss/echo_ce"], ["held-out", "eval/echo_ce"]] },
  { id: "timing", title: "time per step (s)",
    series: [["step", "time/step_s"], ["learner", "time/learner_s"], ["waiting for rollouts", "time/rollout_s"],
             ["rollout (workers)", "time/rollout_worker_s"], ["sync", "time/sync_s"], ["env", "time/env_s"]] },
  { id: "integrity", title: "engine vs learner: mean |log-prob gap| (integrity checks)",
    series: [["weights probe", "integrity/weights/mean_gap"], ["trained tokens", "integrity/behaviour_logprobs/mean_gap"],
             ["band", "integrity/weights/band"]] },
  { id: "tokens", title: "sampled tokens/s",
    series: [["per step", ratio("rollout/sampled_tokens", "time/step_s")],
             ["while generating", ratio("rollout/sampled_tokens", "time/generate_s")]] },
];

const state = { runs: [], run: null, tab: "curves", records: {}, next: {}, charts: {}, compareChart: null, roStep: null };
window.viewState = state; // for the browser test and for anyone poking at the page

const $ = (sel) => document.querySelector(sel);

async function api(path, params) {
  const q = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v !== null && v !== "" && v !== undefined));
  const res = await fetch(`${path}?${q}`);
  if (!res.ok) throw new Error(`${path}: ${res.status}`);
  return res.json();
}

function series(records, key) {
  return records.map((r) => { const v = typeof key === "function" ? key(r) : r[key]; return typeof v === "number" ? v : null; });
}

function chartData(records, spec) {
  const rows = records.filter((r) => spec.series.some(([, key]) => series([r], key)[0] !== null));
  return [rows.map((r) => r.step), ...spec.series.map(([, key]) => series(rows, key))];
}

function makeChart(container, title, labels, data, band, unit) {
  const width = Math.max(400, container.clientWidth - 10);
  const opts = {
    title, width, height: 230, scales: { x: { time: false }, ...(unit ? { y: { range: [0, 1] } } : {}) },
    axes: [STEP_AXIS, {}],
    series: [{ label: "step" }, ...labels.map((label, i) => ({
      label, stroke: band && i > 0 ? "rgba(31,119,180,0.4)" : COLOURS[i % COLOURS.length], width: band && i > 0 ? 1 : 2,
      spanGaps: true, points: { show: true, size: 4 },
    }))],
  };
  if (band) opts.bands = [{ series: [3, 2], fill: BAND }];
  return new uPlot(opts, data, container);
}

// ---------------------------------------------------------------- runs

async function refreshRuns() {
  state.runs = await api("/api/runs");
  const list = $("#run-list");
  const ticked = new Set([...list.querySelectorAll("input:checked")].map((i) => i.value));
  list.replaceChildren(...state.runs.map((r) => {
    const li = el("li", r.name === state.run ? "on" : "");
    li.dataset.run = r.name;
    const box = el("input"); box.type = "checkbox"; box.value = r.name; box.checked = ticked.has(r.name);
    box.title = "compare"; box.onclick = (e) => { e.stopPropagation(); if (state.tab === "compare") drawCompare(true); };
    li.append(box, el("span", "", ` ${r.name} `), el("span", `badge ${r.status}`, r.status));
    li.appendChild(el("small", "", `step ${r.step}${r.steps ? "/" + r.steps : ""}`));
    li.onclick = () => selectRun(r.name);
    return li;
  }));
  if (!state.run && state.runs.length) {
    const wanted = new URLSearchParams(location.search).get("run");
    await selectRun(state.runs.some((r) => r.name === wanted) ? wanted : state.runs[0].name);
  }
  drawRunsTable();
}

function drawRunsTable() {
  const final = (r) => (r.summary && typeof r.summary["eval/success"] === "number" ? fmt(r.summary["eval/success"]) : "");
  $("#runs-table tbody").replaceChildren(...state.runs.map((r) => {
    const c = r.config || {};
    const cells = [r.name, r.status + (r.stop_reason ? ` (${r.stop_reason})` : ""), `${r.step}/${r.steps ?? "?"}`,
      c.model?.path, c.echo?.coeff ? `GRPO + ECHO (λ ${c.echo.coeff})` : "GRPO", c.algorithm?.loss_aggregation,
      c.run?.seed, final(r)];
    const tr = el("tr");
    cells.forEach((x) => tr.appendChild(el("td", "", x ?? "")));
    tr.onclick = () => selectRun(r.name);
    return tr;
  }));
  const run = state.runs.find((r) => r.name === state.run);
  if (run) $("#run-step").textContent = `step ${run.step}${run.steps ? "/" + run.steps : ""} · ${run.status}`;
  $("#config-name").textContent = state.run || "";
  $("#config").textContent = run ? JSON.stringify(run.config, null, 2) : "";
}

async function selectRun(name) {
  state.run = name;
  state.roStep = null;
  $("#run-title").textContent = name;
  document.querySelectorAll("#run-list li").forEach((li) => li.classList.toggle("on", li.dataset.run === name));
  drawRunsTable();
  await pollMetrics(name);
  drawCurves(true);
  await showTab(state.tab);
}

async function pollMetrics(name) {
  const since = state.next[name] || 0;
  const res = await api("/api/metrics", { run: name, since });
  if (res.next < since) { state.records[name] = []; } // the file was cut (a resumed run redoes steps)
  state.records[name] = (state.records[name] || []).concat(res.records);
  state.next[name] = res.next;
  return res.records.length;
}

// ---------------------------------------------------------------- curves and health

function drawCurves(rebuild) {
  const records = state.records[state.run] || [];
  const box = $("#charts");
  if (rebuild) { box.replaceChildren(); state.charts = {}; }
  for (const spec of CHARTS) {
    const data = chartData(records, spec);
    if (state.charts[spec.id]) { state.charts[spec.id].setData(data); continue; }
    const cell = el("div"); cell.id = `chart-${spec.id}`; box.appendChild(cell);
    state.charts[spec.id] = makeChart(cell, spec.title, spec.series.map(([l]) => l), data, spec.band, spec.unit);
  }
}

function drawHealth() {
  const rows = [];
  let last = null;
  for (const r of state.records[state.run] || []) {
    if (r["health/level"] === undefined) continue;
    const key = `${r["health/level"]}|${r["health/reasons"]}`;
    if (key !== last) rows.push(r);
    last = key;
  }
  $("#health-table tbody").replaceChildren(...rows.map((r) => {
    const tr = el("tr");
    tr.append(el("td", "", r.step), el("td", `lvl${r["health/level"]}`, ["ok", "warn", "red"][r["health/level"]]),
      el("td", "", r["health/reasons"] || ""));
    return tr;
  }));
  drawIntegrity();
}

const LAST_INTEGRITY_ROWS = 10;

function drawIntegrity() {
  const checked = (state.records[state.run] || []).filter((r) => r["integrity/failures"] !== undefined);
  const failed = checked.filter((r) => r["integrity/failures"] > 0);
  const shown = checked.filter((r, i) => r["integrity/failures"] > 0 || i >= checked.length - LAST_INTEGRITY_ROWS);
  $("#integrity-summary").textContent = checked.length
    ? `${checked.length} steps checked, ${failed.length} with a failed check.` : "No step checked (run.integrity=false?).";
  const gap = (v) => (typeof v === "number" ? v.toExponential(1) : "");
  $("#integrity-table tbody").replaceChildren(...shown.map((r) => {
    const tr = el("tr");
    const version = `${r["integrity/policy_version/max_lag"] ?? ""} (${r["integrity/policy_version/dropped_groups"] ?? ""})`;
    [r.step, version, r["integrity/token_continuity/broken"] ?? "", gap(r["integrity/weights/mean_gap"]),
      gap(r["integrity/behaviour_logprobs/mean_gap"]), gap(r["integrity/weights/band"])]
      .forEach((x) => tr.appendChild(el("td", "", x)));
    tr.appendChild(el("td", r["integrity/failures"] ? "lvl1" : "lvl0", r["integrity/failed"] || "ok"));
    return tr;
  }));
}

// ---------------------------------------------------------------- rollouts and evals

async function drawRollouts() {
  const res = await api("/api/rollouts", {
    run: state.run, step: state.roStep, min_reward: $("#ro-min").value, max_reward: $("#ro-max").value,
    errors: $("#ro-errors").checked,
  });
  const select = $("#ro-step");
  select.replaceChildren(...res.steps.map((s) => { const o = el("option", "", `step ${s}`); o.value = s; return o; }));
  if (res.step !== null) select.value = res.step;
  $("#ro-count").textContent = `${res.records.length} conversations (${res.steps.length} steps saved)`;
  renderConversations($("#rollouts"), res.records);
}

async function drawEvals() {
  const reports = await api("/api/evals", { run: state.run });
  $("#evals-table tbody").replaceChildren(...reports.map((r) => {
    const tr = el("tr");
    const ci = r["pass@1_ci95"] ? `${fmt(r["pass@1_ci95"][0])}–${fmt(r["pass@1_ci95"][1])}` : "";
    [r.name, r.step, `${r.prompts} x ${r.samples_per_prompt}`, fmt(r["pass@1"]), ci, fmt(r.tool_error_rate),
      fmt(r.turns_per_sample, 2)].forEach((x) => tr.appendChild(el("td", "", x)));
    tr.onclick = () => drawTranscripts(r.name);
    return tr;
  }));
  if (reports.length && !state.evalName) await drawTranscripts(reports[0].name);
  else if (!reports.length) { $("#tr-name").textContent = "(no eval report: agentrl-ray eval RUN_DIR writes one)"; }
}

async function drawTranscripts(name) {
  state.evalName = name || state.evalName;
  $("#tr-name").textContent = state.evalName;
  const res = await api("/api/transcripts", { run: state.run, name: state.evalName, errors: $("#tr-errors").checked });
  const shown = $("#tr-failed").checked ? res.records.filter((t) => !t.success) : res.records;
  $("#tr-count").textContent = `${shown.length} transcripts`;
  renderConversations($("#transcripts"), shown);
}

// ---------------------------------------------------------------- compare

function configValue(config, dotted) {
  return dotted.split(".").reduce((x, k) => (x && typeof x === "object" ? x[k] : undefined), config);
}

async function drawCompare(force) {
  const ticked = [...document.querySelectorAll("#run-list input:checked")].map((i) => i.value);
  const names = ticked.length ? ticked : state.runs.map((r) => r.name);
  const fresh = (await Promise.all(names.map(pollMetrics))).reduce((a, b) => a + b, 0);
  if (!fresh && !force && state.compareChart) return;
  const metric = $("#cmp-metric");
  const keys = new Set();
  names.forEach((n) => (state.records[n] || []).forEach((r) => Object.keys(r).forEach((k) => typeof r[k] === "number" && k !== "step" && keys.add(k))));
  const chosen = metric.value || "eval/success";
  metric.replaceChildren(...[...keys].sort().map((k) => { const o = el("option", "", k); o.value = k; return o; }));
  metric.value = keys.has(chosen) ? chosen : [...keys][0];
  const key = metric.value;
  const groupKey = $("#cmp-key").value.trim();
  const groups = [];
  const lines = names.map((n) => {
    const run = state.runs.find((r) => r.name === n);
    const group = groupKey ? String(configValue(run?.config, groupKey)) : "";
    if (!groups.includes(group)) groups.push(group);
    const rows = (state.records[n] || []).filter((r) => typeof r[key] === "number");
    return { name: n, group, points: new Map(rows.map((r) => [r.step, r[key]])) };
  });
  const steps = [...new Set(lines.flatMap((l) => [...l.points.keys()]))].sort((a, b) => a - b);
  const labels = lines.map((l) => `${l.name}${groupKey ? ` (${groupKey}=${l.group})` : ""}`);
  const data = [steps, ...lines.map((l) => steps.map((s) => l.points.get(s) ?? null))];
  const colour = (g) => COLOURS[groups.indexOf(g) % COLOURS.length];
  const seriesOpts = lines.map((l, i) => ({ label: labels[i], stroke: colour(l.group), width: 1, spanGaps: true, dash: [4, 3] }));
  if ($("#cmp-mean").checked) {
    for (const g of groups) {
      const mine = lines.filter((l) => l.group === g);
      data.push(steps.map((s) => { const v = mine.map((l) => l.points.get(s)).filter((x) => x !== undefined); return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null; }));
      seriesOpts.push({ label: `mean${groupKey ? ` ${groupKey}=${g}` : ""} (${mine.length} runs)`, stroke: colour(g), width: 3, spanGaps: true });
    }
  }
  const box = $("#compare-chart");
  box.replaceChildren();
  state.compareChart = new uPlot({
    title: `${key} by run`, width: Math.max(500, box.clientWidth - 10), height: 380, scales: { x: { time: false } },
    axes: [STEP_AXIS, {}], series: [{ label: "step" }, ...seriesOpts],
  }, data, box);
  $("#compare-table tbody").replaceChildren(...lines.map((l) => {
    const tr = el("tr");
    const last = [...l.points.values()].pop();
    [l.name, l.group, last === undefined ? "" : fmt(last), l.points.size].forEach((x) => tr.appendChild(el("td", "", x)));
    return tr;
  }));
}

// ---------------------------------------------------------------- tabs and polling

async function showTab(tab) {
  state.tab = tab;
  document.querySelectorAll(".tab").forEach((s) => s.classList.toggle("on", s.id === `tab-${tab}`));
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("on", b.dataset.tab === tab));
  if (!state.run) return;
  if (tab === "curves") drawCurves(true); // sized to the now visible container
  if (tab === "health") drawHealth();
  if (tab === "rollouts") await drawRollouts();
  if (tab === "evals") await drawEvals();
  if (tab === "compare") await drawCompare(true);
}

async function poll() {
  try {
    await refreshRuns();
    if (state.run && (await pollMetrics(state.run))) {
      drawCurves(false);
      if (state.tab === "health") drawHealth();
      if (state.tab === "rollouts" && state.roStep === null) await drawRollouts(); // following the newest step
    }
    if (state.tab === "compare") await drawCompare(false);
  } catch (err) {
    $("#run-step").textContent = `viewer: ${err.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.querySelectorAll("#tabs button").forEach((b) => (b.onclick = () => showTab(b.dataset.tab)));
$("#ro-step").onchange = () => { state.roStep = Number($("#ro-step").value); drawRollouts(); };
["#ro-min", "#ro-max", "#ro-errors"].forEach((s) => ($(s).onchange = drawRollouts));
["#tr-errors", "#tr-failed"].forEach((s) => ($(s).onchange = () => drawTranscripts()));
["#cmp-metric", "#cmp-key", "#cmp-mean"].forEach((s) => ($(s).onchange = drawCompare));
showTab(new URLSearchParams(location.search).get("tab") || "curves");
poll();
