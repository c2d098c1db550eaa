"use strict";
// The status page's script (served as /status.js: the page has no inline script, so a strict CSP allows it).
// Everything shown is built with createElement and textContent, never from HTML strings: model names,
// feature names and error messages come from the traffic, so none of them is ever parsed as markup.
const REFRESH_MS = 3000;
const STATUS_URL = "v1/status";

function el(tag, opts, ...children) {
  const e = document.createElement(tag);
  if (opts) {
    if (opts.cls) e.className = opts.cls;
    if (opts.id) e.id = opts.id;
    if (opts.data) for (const [k, v] of Object.entries(opts.data)) e.dataset[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function isNum(v) { return typeof v === "number" && Number.isFinite(v); }

function bytes(v) {
  if (!isNum(v)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, x = Math.abs(v);
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return (v < 0 ? "-" : "") + (i ? x.toFixed(2) : String(x)) + " " + units[i];
}

// Leak rates, per hour: what a leak of a few GiB a day reads as.
function rate(v) {
  if (!isNum(v)) return "—";
  const mib = v * 3600 / 2 ** 20;
  return Math.abs(mib) >= 1024 ? (mib / 1024).toFixed(2) + " GiB/h" : mib.toFixed(1) + " MiB/h";
}

function seconds(v) {
  if (!isNum(v)) return "—";
  const a = Math.abs(v);
  if (a < 1e-3) return (v * 1e6).toPrecision(3) + " µs";
  if (a < 1) return (v * 1e3).toPrecision(3) + " ms";
  if (a < 120) return v.toPrecision(3) + " s";
  if (a < 7200) return (v / 60).toFixed(1) + " min";
  if (a < 172800) return (v / 3600).toFixed(1) + " h";
  return (v / 86400).toFixed(1) + " d";
}

function when(v) {
  if (!isNum(v)) return "—";
  return new Date(v * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function plain(v) {
  if (v === null || v === undefined) return "—";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : (isNum(v) ? String(+v.toPrecision(4)) : "—");
  if (Array.isArray(v)) return v.length ? v.map(plain).join(", ") : "—";
  if (typeof v === "object") {
    const kv = Object.entries(v);
    if (!kv.length) return "—";
    return kv.every(([, x]) => x === null || typeof x !== "object")
      ? kv.map(([a, b]) => a + " " + plain(b)).join(", ") : JSON.stringify(v);
  }
  return String(v);
}

// How a value is shown follows its key's name, so fields other components add render sensibly too.
function fmt(key, v) {
  if (Array.isArray(v)) return v.length ? v.map(x => fmt(key, x)).join(", ") : "—";
  if (key.endsWith("_bytes_per_s")) return rate(v);
  if (key.endsWith("_bytes")) return bytes(v);
  if (key.endsWith("_unix") || key.endsWith("_at") || key === "onset_estimate" || key === "end") return when(v);
  if (key.endsWith("_s")) return seconds(v);
  return plain(v);
}

function verdictPill(v) {
  const cls = { ok: "ok", leak: "bad", drifted: "bad", running: "ok", watch: "warn", suspect: "warn",
                warming_up: "warn", starting: "warn", degraded: "warn", failing: "bad", failed: "bad",
                pass: "ok", marginal: "warn", fail: "bad", bad: "bad", warn: "warn", absent: "warn",
                inconclusive: "warn" }[v] || "";
  return el("span", { cls: "pill " + cls, data: { verdict: String(v) } }, plain(v));
}

// A table of rows (objects) over the given columns: [key, heading] or [key, heading, render(row)].
function table(name, columns, rows) {
  const head = el("tr", null, ...columns.map(([k, h]) => el("th", { data: { col: k } }, h)));
  const body = rows.map(r => el("tr", { data: { row: name } }, ...columns.map(([k, , render]) => {
    const v = r[k];
    const td = el("td", { data: { field: k } }, render ? render(r) : fmt(k, v));
    if (isNum(v)) { td.className = "num"; td.dataset.raw = String(v); }
    else if (typeof v === "string") { td.dataset.raw = v; td.title = v; }
    return td;
  })));
  return el("table", { data: { table: name } }, el("thead", null, head), el("tbody", null, ...body));
}

// The fields of rows, in first-seen order, for parts of the status whose fields may grow.
function columnsOf(rows, skip) {
  const keys = [];
  for (const r of rows) for (const k of Object.keys(r)) {
    if (!keys.includes(k) && !skip.includes(k)) keys.push(k);
  }
  return keys.map(k => [k, k.replace(/_/g, " ")]);
}

function fill(id, ...nodes) {
  const body = document.querySelector("#" + id + " .body");
  body.replaceChildren(...nodes.filter(n => n !== null && n !== undefined));
}

function note(text) { return el("p", { cls: "note" }, text); }

// The daemon's states for a component that does not run; a running one reports its own state instead.
const NOT_RUNNING = ["built", "disabled", "unavailable", "failed", "stopped"];

function componentUnavailable(c, what) {
  if (!c) return note(what + ": not in this build.");
  if (NOT_RUNNING.includes(c.state)) return note(what + " is " + c.state + (c.reason ? ": " + c.reason : "") + ".");
  if (c.status_error) return note(what + ": its status failed: " + c.status_error);
  return null;
}

function renderLatency(lat) {
  if (!lat || !lat.models || !lat.models.length) { fill("latency", note("No requests or stages yet.")); return; }
  const rows = [];
  for (const m of lat.models) {
    const base = { service: m.service, model: m.model, model_version: m.model_version };
    if (m.request) rows.push({ ...base, stage: "(request)", ...m.request });
    for (const [stage, s] of Object.entries(m.stages)) rows.push({ ...base, stage, ...s });
  }
  const qcols = lat.quantiles.map(q => {
    const k = "p" + String(+(q * 100).toPrecision(6)) + "_s";
    return [k, "P" + String(+(q * 100).toPrecision(6))];
  });
  const shown = lat.models.length < lat.label_sets ? ` (the ${lat.models.length} busiest of ${lat.label_sets} label sets)` : "";
  fill("latency",
    note(`Over the last ${seconds(lat.window_s)}${shown}; quantiles interpolated inside histogram buckets, as Prometheus's histogram_quantile does.`),
    table("latency", [["service", "service"], ["model", "model"], ["model_version", "version"], ["stage", "stage"],
                      ["count", "calls"], ["total", "since start"], ["mean_s", "mean"], ...qcols], rows));
}

function renderDrift(st) {
  const d = st.components && st.components.drift;
  const off = componentUnavailable(d, "The drift engine");
  if (off) { fill("drift", off); return; }
  const parts = [];
  if (!d.models.length) parts.push(note("No predictions recorded yet."));
  for (const m of d.models) {
    const ref = m.reference || {};
    const warm = ref.source === "file" ? "reference file" :
      `warm-up reference ${plain(ref.events)}/${plain(ref.warmup_target)} events`;
    parts.push(el("h3", { data: { model: m.model, version: m.version } }, `${m.model} ${m.version}`));
    parts.push(note(`${warm}; window ${plain(m.window && m.window.events)} events; ` +
      (m.dataset_drift === undefined ? "not evaluated yet" :
       `dataset drift: ${plain(m.dataset_drift)} (${(100 * m.share_drifted).toFixed(0)}% of columns drifted)`)));
    if (m.features) {
      parts.push(table("drift", [["feature", "column"], ["role", "role"], ["test", "test"], ["statistic", "statistic"],
        ["p_adjusted", "adjusted p"], ["effect", "effect size"], ["effect_name", "measure"], ["n_current", "rows"],
        ["missing_current", "missing", r => isNum(r.missing_current) ? (100 * r.missing_current).toFixed(1) + "%" : "—"], ["drifted", "decision", r => verdictPill(r.drifted ? "drifted" : (r.status || "ok"))]],
        m.features));
    }
  }
  fill("drift", ...parts);
}

function pct(v, digits) { return isNum(v) ? (100 * v).toFixed(digits === undefined ? 1 : digits) + "%" : "—"; }

function ago(unix) {
  if (!isNum(unix)) return "";
  const s = Date.now() / 1000 - unix;
  return s >= 0 ? " (" + seconds(s) + " ago)" : "";
}

// Where a verdict's since-when comes from (export/summary.py): the component's own time of the change, the start
// of the window that first showed it, or the first time this sidecar saw it (which starts over on a restart).
function sinceNote(v) {
  if (v.since_source === "window") return ", the start of the window that first showed it";
  if (v.since_source === "first seen") return ", first seen by this sidecar (it starts over on a restart)";
  return v.since_source ? ", the " + v.component + " component's own time" : "";
}

// The verdicts that are bad now (the daemon's summary), then the overall request rates and accuracy.
function renderSummary(st) {
  const sec = document.getElementById("summary");
  const s = st.summary || {};
  const found = s.verdicts || [];
  const parts = [];
  if (s.error) parts.push(note("The summary failed: " + s.error));
  const worst = found.some(v => v.severity === "bad") ? "bad" : (found.length ? "warn" : "ok");
  sec.className = "wide " + worst;
  sec.dataset.worst = worst;
  if (!found.length) {
    parts.push(el("p", { cls: "note", data: { verdicts: "none" } }, verdictPill("ok"),
                  " Nothing is bad now: no leak, drift, accuracy drop, failing canary, saturation, retry storm " +
                  "or high error rate."));
  } else {
    parts.push(el("ul", { cls: "verdicts" }, ...found.map(v => {
      const li = el("li", { cls: "verdict " + (v.severity === "bad" ? "bad" : "warn"),
                            data: { verdict: String(v.verdict), component: String(v.component), severity: String(v.severity) } },
        verdictPill(v.severity === "bad" ? "bad" : "warn"),
        el("span", { cls: "what" }, `${v.component}: ${v.subject} — ${v.verdict}`),
        el("span", { cls: "since", data: { since: String(v.since_unix), sinceSource: String(v.since_source) } },
           "since " + when(v.since_unix) + ago(v.since_unix) + sinceNote(v)),
        el("span", { cls: "detail" }, v.detail || ""));
      if (v.runbook_url) {
        const a = el("a", { cls: "runbook-link" }, "runbook: " + (v.alert || "section"));
        a.href = v.runbook_url;
        li.append(el("span", { cls: "runbook" }, a));
      }
      return li;
    })));
  }
  const stats = el("ul", { cls: "stats" });
  const rates = outcomeRates((st.latency || {}).models || []);
  for (const r of rates.filter(r => r.model === "(all)")) {
    for (const [k, label] of OUTCOME_LABELS) {
      if (k in r || k === "error") stats.append(el("li", { data: { stat: k } }, label + " ", el("b", null, pct(r[k], 2))));
    }
    stats.append(el("li", { data: { stat: "requests" } }, "requests ", el("b", null, plain(r.requests)),
                    ` in ${seconds(st.latency.window_s)}`));
  }
  for (const m of accuracyRows(st)) {
    stats.append(el("li", { data: { stat: `accuracy ${m.model} ${m.version}` } }, `accuracy ${m.model} ${m.version} `,
                    el("b", null, m.estimate_text)));
  }
  parts.push(stats);
  fill("summary", ...parts);
}

// Outcomes other than ok, in the order shown; any further outcome the sidecar reports follows under its own name.
const OUTCOME_LABELS = [["error", "error rate"], ["client_error", "4xx rate"], ["4xx", "4xx rate"],
                        ["cancelled", "cancelled rate"], ["shed", "shed rate"]];

// Per label set (and all together): requests in the window and the share of each outcome other than ok.
function outcomeRates(models) {
  const rows = [];
  const all = { model: "(all)", service: "", model_version: "", requests: 0, counts: {} };
  for (const m of models) {
    const o = m.outcomes;
    if (!o) continue;
    const n = Object.values(o).reduce((a, b) => a + (isNum(b) ? b : 0), 0);
    const row = { service: m.service, model: m.model, model_version: m.model_version, requests: n };
    for (const [k, v] of Object.entries(o)) {
      if (k === "ok") continue;
      row[k] = n ? v / n : null;
      all.counts[k] = (all.counts[k] || 0) + v;
    }

    all.requests += n;
    rows.push(row);
  }
  if (rows.length) {
    for (const [k, v] of Object.entries(all.counts)) all[k] = all.requests ? v / all.requests : null;
    rows.push(all);
  }
  return rows;
}

function renderRequests(st) {
  const lat = st.latency || {};
  const rows = outcomeRates(lat.models || []);
  if (!rows.length) { fill("requests", note("No requests yet.")); return; }
  const keys = [];
  for (const r of rows) for (const k of Object.keys(r)) {
    if (!["service", "model", "model_version", "requests", "counts"].includes(k) && !keys.includes(k)) keys.push(k);
  }
  const order = OUTCOME_LABELS.map(([k]) => k);
  keys.sort((a, b) => (order.includes(a) ? order.indexOf(a) : 99) - (order.includes(b) ? order.indexOf(b) : 99) || a.localeCompare(b));
  const label = k => (OUTCOME_LABELS.find(([x]) => x === k) || [k, k.replace(/_/g, " ") + " rate"])[1].replace(/ rate$/, "");
  const cols = [["model", "service, model, version", r => r.model === "(all)" ? "all" : `${r.service} ${r.model} ${r.model_version}`],
                ["requests", "requests"], ...keys.map(k => [k, label(k), r => pct(r[k], 2)])];
  // Where the SDK's middleware sees HTTP: attempts per unique request, and how long clients waited before giving up.
  const http = (lat.models || []).filter(m => m.http && m.http.attempts).map(m => ({
    model: `${m.service} ${m.model} ${m.model_version}`, attempts: m.http.attempts,
    amplification: m.http.attempts > m.http.retries ? m.http.attempts / (m.http.attempts - m.http.retries) : null,
    giveups: m.http.giveups / m.http.attempts, giveup_wait_p50_s: m.http.giveup_wait_p50_s }));
  fill("requests", note(`Over the last ${seconds(lat.window_s)}, from each request's outcome.`),
       table("requests", cols, rows),
       http.length ? table("requests-http", [["model", "service, model, version"],
         ["amplification", "attempts per request", r => isNum(r.amplification) ? r.amplification.toFixed(2) : "—"],
         ["giveups", "given up", r => pct(r.giveups, 1)], ["giveup_wait_p50_s", "their wait (P50)"]], http) : null);
}

// The accuracy of each model version: the label-free estimate with its interval, and the labelled one.
function accuracyRows(st) {
  const d = st.components && st.components.drift;
  const out = [];
  for (const m of (d && d.models) || []) {
    const p = m.performance || {};
    const lab = m.labelled || {};
    if (!isNum(p.estimated_accuracy) && !isNum(lab.accuracy)) continue;
    const iv = p.estimated_accuracy_interval;
    const estimate_text = !isNum(p.estimated_accuracy) ? "—" : pct(p.estimated_accuracy) +
      (p.calibrated && iv ? ` [${pct(iv[0])}–${pct(iv[1])}]` : p.calibrated ? "" : " (mean confidence)");
    out.push({ model: m.model, version: m.version, estimated_accuracy: p.estimated_accuracy,
               estimate_text, reference_accuracy: p.reference_accuracy, method: p.calibrated ? p.method : "mean confidence (uncalibrated)",
               rows: p.rows, labelled_accuracy: lab.accuracy, labelled_events: lab.events });
  }
  return out;
}

function renderAccuracy(st) {
  const rows = accuracyRows(st);
  if (!rows.length) {
    const d = st.components && st.components.drift;
    fill("accuracy", componentUnavailable(d, "The drift engine") || note("No predictions with a confidence yet."));
    return;
  }
  fill("accuracy",
    table("accuracy", [["version", "model version", r => `${r.model} ${r.version}`],
      ["estimated_accuracy", "estimated [95%]", r => r.estimate_text], ["reference_accuracy", "reference", r => pct(r.reference_accuracy)],
      ["labelled_accuracy", "labelled", r => isNum(r.labelled_accuracy) ? `${pct(r.labelled_accuracy)} of ${plain(r.labelled_events)}` : "no labels yet"]], rows),
    note("Estimated from: " + [...new Set(rows.map(r => r.method))].join(", ") + "."),
    note("The estimate needs no labels: it reads the model's own confidences through a calibration fitted on the " +
         "labelled reference. It follows a shift of the inputs, but a new model version changes the confidences " +
         "and the calibration together, so it cannot see that version's own errors: only labels (POST /v1/labels) can."));
}

function renderCanary(st) {
  const comps = st.components || {};
  const parts = [];
  const c = comps.canary;
  const judgements = (c && c.judgements) || [];
  for (const j of judgements) {
    const h = el("h3", { data: { judgement: `${j.canary_version} vs ${j.baseline_version}` } },
      `${j.model} ${j.canary_version} against ${j.baseline_version}: `, verdictPill(j.verdict),
      ` score ${isNum(j.score) ? j.score.toFixed(0) : "—"}/100, ${plain(j.canary_requests)} against ${plain(j.baseline_requests)} requests`);
    parts.push(h);
    if (j.reasons && j.reasons.length) parts.push(el("ul", { cls: "reasons" }, ...j.reasons.map(r => el("li", null, r))));
    // Why the verdict may mislead (unequal load per replica), or is held back (a fail not yet confirmed).
    if (j.warnings && j.warnings.length) {
      parts.push(el("ul", { cls: "reasons warnings" }, ...j.warnings.map(w => el("li", { data: { warning: "canary" } },
                                                                               "warning: " + w))));
    }
    const rows = (j.metrics || []).map(m => ({ ...m, metric: m.stage ? `${m.name} [${m.stage}]` : m.name }));
    parts.push(table("canary-metrics", [["metric", "metric"], ["result", "result", r => verdictPill(r.result)],
      ["baseline", "stable"], ["canary", "canary"], ["unit", "unit"], ["effect", "effect"], ["effect_name", "measure"],
      ["tolerance", "tolerance"], ["statistic", "test"], ["p_adjusted", "adjusted p (Holm)"]], rows));
  }
  if (c && !judgements.length) {
    parts.push(componentUnavailable(c, "The canary judge") ||
               note(`No judgement yet: a canary needs ${plain(c.min_requests)} requests next to its stable version.`));
  }
  const d = comps.drift;
  const rows = (d && d.models ? d.models : []).filter(m => m.canary).map(m => ({
    model: m.model, version: m.version, baseline_version: m.canary.baseline_version,
    share_drifted: m.canary.share_drifted, drifted: m.canary.drifted }));
  if (rows.length) {
    parts.push(el("h3", null, "Inputs and outputs of each version against its baseline (drift engine)"));
    parts.push(table("canary", [["model", "model"], ["version", "canary"], ["baseline_version", "baseline"],
      ["share_drifted", "columns drifted", r => isNum(r.share_drifted) ? (100 * r.share_drifted).toFixed(0) + "%" : "—"],
      ["drifted", "drifted columns"]], rows));
  }
  if (!parts.length) parts.push(note("No canary: one model serves a single version, or none has been compared yet."));
  fill("canary", ...parts);
}

function renderTail(st) {
  const t = st.components && st.components.tail;
  const off = componentUnavailable(t, "Tail attribution");
  if (off) { fill("tail", off); return; }
  const parts = [];
  for (const m of t.models || []) {
    for (const [name, tail] of Object.entries(m.tails || {})) {
      const head = el("h3", { data: { tail: `${m.model} ${m.version} ${name}` } }, `${m.model} ${m.version}, ${name}: `);
      if (tail.status !== "ok") {
        head.append(`not enough requests yet (${plain(tail.requests)} of ${plain(tail.needed_requests)})`);
        parts.push(head);
        continue;
      }
      head.append(tail.summary || "");
      parts.push(head);
      const stages = (tail.stages || []).map(s => ({ ...s }));
      parts.push(table("tail-stages", [["stage", "stage"], ["seconds_s", "in the tail", r => seconds(r.seconds)],
        ["median_seconds_s", "at the median", r => seconds(r.median_seconds)],
        ["excess_share", "share of the extra time", r => pct(r.excess_share, 0)]],
        stages.map(s => ({ ...s, seconds_s: s.seconds, median_seconds_s: s.median_seconds }))));
      const feats = (tail.features || []).filter(f => f.distinguishes);
      if (feats.length) {
        parts.push(note("What the slowest requests have in common: " + feats.map(f => f.feature).join(", ")));
      }
    }
  }
  if (!parts.length) parts.push(note(`No complete window yet (windows of ${seconds(t.window_seconds)}).`));
  fill("tail", ...parts);
}

function renderGpu(st) {
  const g = st.components && st.components.gpu;
  const off = componentUnavailable(g, "The GPU monitor");
  if (off) { fill("gpu", off); return; }
  const parts = [note(`backend ${g.backend}, state `), null];
  parts[0].append(verdictPill(g.state), `, ${plain(g.samples)} samples every ${seconds(g.interval_s)}`);
  if (g.message) parts.push(note(g.message));
  for (const dev of g.devices || []) {
    const leak = dev.leak || {};
    const h = el("h3", { data: { gpu: String(dev.gpu) } }, `GPU ${dev.gpu} ${dev.name || ""}: ${bytes(dev.used_bytes)} of ${bytes(dev.total_bytes)} used, device `, verdictPill(leak.verdict));
    if (leak.verdict === "leak") h.append(` ${fmt("rate_bytes_per_s", leak.rate_bytes_per_s)}, out of memory in ${seconds(leak.time_to_oom_s)}`);
    parts.push(h);
    const procs = dev.processes || [];
    if (procs.length) {
      parts.push(table("gpu-process", [["pid", "pid"], ["container", "container"], ["used_bytes", "used"],
        ["verdict", "verdict", r => verdictPill(r.verdict)], ["kind", "kind"], ["rate_bytes_per_s", "rate"],
        ["time_to_oom_s", "time to OOM"], ["series", "series"]], procs));
    } else {
      parts.push(note(dev.per_process_memory ? "No processes on this device." : "This device reports no per-process memory."));
    }
  }
  // Copies of one model held by several processes of a GPU (docs/gpu.md, "Duplicated model copies").
  const copies = g.duplicate_model_copies || [];
  parts.push(el("h3", null, "Duplicated model copies"));
  if (copies.length) {
    parts.push(table("gpu-duplicates", [["gpu", "GPU"], ["pids", "pids"], ["used_bytes", "each uses"],
      ["copy_bytes", "one copy"], ["extra_bytes", "beyond one copy"], ["since", "since", r => when(r.since)]], copies));
    for (const fix of new Set(copies.map(c => c.fix))) {
      parts.push(el("p", { cls: "note", data: { fix: "duplicates" } }, "Fix: " + fix));
    }
  } else {
    parts.push(note((g.devices || []).some(d => d.per_process_memory) ? "None."
                    : "Not watched: no device reports per-process memory."));
  }
  const episodes = g.episodes || [];
  parts.push(el("h3", null, "Recent leak episodes"));
  parts.push(episodes.length ? table("gpu-episode", columnsOf(episodes, []), episodes.slice().reverse())
                             : note("None since start."));
  const faults = g.faults || [];
  if (faults.length) {
    parts.push(el("h3", null, "NVML faults"));
    parts.push(table("gpu-fault", columnsOf(faults, []), faults));
  }
  fill("gpu", ...parts);
}

function kvTable(name, obj) {
  const rows = Object.entries(obj || {}).map(([key, value]) => ({ key, value }));
  return rows.length ? table(name, [["key", "reason"], ["value", "count"]], rows) : note("none");
}

function renderIngest(st) {
  const i = st.ingest || {};
  const p = st.producers || {};
  const parts = [table("ingest", [["frames", "frames"], ["events", "events"], ["bytes", "bytes",
      r => bytes(r.bytes)], ["lost_frames", "lost frames"]], [i])];
  parts.push(el("h3", null, "SDK drops (reported by the producers)"), kvTable("sdk-drops", i.sdk_dropped));
  parts.push(el("h3", null, "Refused by the sidecar"), kvTable("ingest-dropped", i.dropped));
  parts.push(el("h3", null, "Decode errors"), kvTable("decode-errors", i.decode_errors));
  parts.push(el("h3", null, `Producers: ${plain(p.connected)} connected of ${plain(p.known)} known`));
  if (p.table && p.table.length) {
    parts.push(table("producers", [["pid", "pid"], ["transport", "transport"], ["frames", "frames"],
      ["lost_frames", "lost"], ["last_seen_age_s", "last seen", r => seconds(r.last_seen_age_s) + " ago"],
      ["sdk_drops", "drops", r => plain(r.sdk_drops)]], p.table));
  }
  fill("ingest", ...parts);
}

function isScalar(v) { return v === null || typeof v !== "object"; }

// A component this page has no view of: its scalar fields, a line per flat mapping, a table per list of rows.
function genericComponent(name, c) {
  const wrap = el("div", { data: { component: name } });
  const entries = Object.entries(c);
  const scalars = entries.filter(([k, v]) => isScalar(v) && k !== "state");
  if (scalars.length) {
    wrap.append(note(scalars.map(([k, v]) => `${k.replace(/_/g, " ")} ${fmt(k, v)}`).join(" · ")));
  }
  for (const [k, v] of entries) {
    if (isScalar(v)) continue;
    const title = k.replace(/_/g, " ");
    if (Array.isArray(v) && v.length && v.every(r => r !== null && typeof r === "object" && !Array.isArray(r))) {
      wrap.append(el("h3", null, title), table(name + "-" + k, columnsOf(v, []), v));
    } else if (Array.isArray(v)) {
      wrap.append(note(`${title}: ${v.length ? plain(v) : "none"}`));
    } else if (Object.values(v).every(isScalar)) {
      const kv = Object.entries(v);
      wrap.append(note(`${title}: ${kv.length ? kv.map(([a, b]) => `${a} ${fmt(a, b)}`).join(", ") : "none"}`));
    } else {
      wrap.append(el("h3", null, title), el("pre", null, JSON.stringify(v, null, 1)));
    }
  }
  return wrap;
}

function renderComponents(st) {
  const comps = st.components || {};
  const rows = Object.entries(comps).map(([name, c]) => ({ name, state: c.state, reason: c.reason || c.status_error }));
  rows.push({ name: "otlp exporter", state: st.otlp && st.otlp.state, reason: st.otlp && st.otlp.last_error });
  rows.push({ name: "otlp traces", state: st.traces && st.traces.enabled ? "enabled" : "disabled" });
  const parts = [table("components", [["name", "component"], ["state", "state", r => verdictPill(r.state)],
                                      ["reason", "detail"]], rows)];
  for (const [name, c] of Object.entries(comps)) {
    if (!["gpu", "drift", "canary", "tail"].includes(name) && c.state === "running") {
      parts.push(el("h3", null, name), genericComponent(name, c));
    }
  }
  fill("components", ...parts);
}

function render(st) {
  document.getElementById("h-version").textContent = plain(st.version);
  document.getElementById("h-ready").textContent = plain(st.ready);
  document.getElementById("h-uptime").textContent = seconds(st.uptime_s);
  document.getElementById("h-producers").textContent = plain(st.producers && st.producers.connected);
  document.getElementById("h-rate").textContent = plain(st.ingest && st.ingest.rates && st.ingest.rates.events_per_s_10s);
  const sections = [["summary", () => renderSummary(st)], ["requests", () => renderRequests(st)],
                    ["accuracy", () => renderAccuracy(st)], ["tail", () => renderTail(st)],
                    ["latency", () => renderLatency(st.latency)], ["drift", () => renderDrift(st)],
                    ["canary", () => renderCanary(st)], ["gpu", () => renderGpu(st)],
                    ["ingest", () => renderIngest(st)], ["components", () => renderComponents(st)]];
  for (const [id, fn] of sections) {
    try { fn(); } catch (e) { fill(id, note("cannot show this part of the status: " + e)); }
  }
}

async function refresh() {
  const banner = document.getElementById("error");
  try {
    const r = await fetch(STATUS_URL, { cache: "no-store" });
    if (!r.ok) throw new Error(`${STATUS_URL} answered ${r.status}`);
    render(await r.json());
    banner.classList.remove("shown");
    document.getElementById("refresh").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  } catch (e) {
    banner.textContent = "Cannot read the status: " + e.message;
    banner.classList.add("shown");
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.getElementById("every").textContent = REFRESH_MS / 1000 + " s";
refresh();
