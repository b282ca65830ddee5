/* flight-serve console: a page without a framework over /api/v1 (schemas/console-openapi.yaml). */
"use strict";

const main = document.getElementById("main");
let timers = [];
let plots = [];

function token() { return sessionStorage.getItem("flight-serve-token") || ""; }

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token()) headers["Authorization"] = "Bearer " + token();
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch("/api/v1" + path, {
    method: options.method || "GET", headers,
    body: options.body !== undefined ? JSON.stringify(options.body) : undefined,
  });
  if (res.status === 401) {
    const body = await res.json().catch(() => ({}));
    showLogin(token() ? (body.error || "unknown token") : "");
    throw new Error(body.error || "unauthenticated");
  }
  if (options.raw) {
    if (!res.ok) { const b = await res.json().catch(() => ({})); throw new Error(b.error || res.statusText); }
    return res;
  }
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
  document.getElementById("token").focus();
}

document.getElementById("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("flight-serve-token", document.getElementById("token").value.trim());
  document.getElementById("login").hidden = true;
  start();
});

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

/* --- formats ------------------------------------------------------------------------------ */
function hms(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const sign = seconds < 0 ? "-" : "";
  let s = Math.round(Math.abs(seconds));
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  return sign + String(h) + ":" + String(m).padStart(2, "0") + ":" + String(s).padStart(2, "0");
}
function date(iso) {
  if (!iso) return "-";
  if (iso === "+inf") return "end of input";
  const d = new Date(iso);
  if (isNaN(d)) return iso;
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$|Z$/, " UTC");
}
function num(v) { return v === null || v === undefined ? "-" : Number(v).toLocaleString("en-US"); }
function rate(v) { return v === null || v === undefined ? "-" : Number(v).toLocaleString("en-US", { maximumFractionDigits: 1 }); }
function age(iso) { return iso ? hms((Date.now() - new Date(iso).getTime()) / 1000) : "-"; }
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : v) + " " + units[i];
}

/* --- a sortable, filterable table ---------------------------------------------------------- */
function sortableTable(columns, rows, { id, filter } = {}) {
  let key = null; let dir = 1;
  const tbody = el("tbody");
  const heads = columns.map((c) => el("th", { class: "sortable", "data-key": c.key }, c.title));
  const table = el("table", { id }, el("thead", {}, el("tr", {}, heads)), tbody);
  function render() {
    let shown = rows.filter((r) => !filter || filter(r));
    if (key !== null) {
      const col = columns.find((c) => c.key === key);
      const value = col.sort || ((r) => r[key]);
      shown = shown.slice().sort((a, b) => {
        const x = value(a), y = value(b);
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    tbody.replaceChildren(...shown.map((r) => el("tr", { "data-id": r.id || r.name },
      columns.map((c) => el("td", { class: c.num ? "num" : (c.cls ? c.cls(r) : ""), "data-col": c.key },
        c.render ? c.render(r) : (r[c.key] ?? "-"))))));
  }
  heads.forEach((th) => th.addEventListener("click", () => {
    const k = th.dataset.key;
    dir = key === k ? -dir : 1; key = k;
    heads.forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
    th.classList.add(dir > 0 ? "sorted-asc" : "sorted-desc");
    render();
  }));
  render();
  table.rerender = render;
  table.setRows = (r) => { rows = r; render(); };
  return table;
}

function resultTable(columns, rows, id) {
  return el("div", { class: "scroll" }, el("table", { id },
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { title: c.type }, c.name)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((v) => el("td", { class: typeof v === "number" ? "num" : "" },
      v === null ? "null" : (typeof v === "object" ? JSON.stringify(v) : String(v)))))))));
}

/* replaceChildren without the nulls of "cond ? null : node" (it would show the text "null") */
function show(parent, ...nodes) { parent.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined)); }

function every(ms, fn) { fn(); timers.push(setInterval(fn, ms)); }
function clear() {
  timers.forEach(clearInterval); timers = [];
  plots.forEach((p) => p.destroy()); plots = [];
}

/* --- pages --------------------------------------------------------------------------------- */
async function pipelinesPage() {
  const filter = el("input", { id: "filter", placeholder: "filter by id, name or state", size: 30 });
  const status = el("span", { class: "muted", id: "updated" });
  const columns = [
    { key: "id", title: "Pipeline", render: (r) => el("a", { href: "#/pipeline/" + encodeURIComponent(r.id) }, r.id) },
    { key: "state", title: "State", cls: (r) => "state-" + r.state },
    { key: "watermark", title: "Watermark", render: (r) => date(r.watermark) },
    { key: "watermark_lag_s", title: "Lag", num: true, render: (r) => hms(r.watermark_lag_s) },
    { key: "rows_per_s", title: "Rows/s", num: true, render: (r) => rate(r.rows_per_s) },
    { key: "rows_in", title: "Rows in", num: true, render: (r) => num(r.rows_in) },
    { key: "late_rows", title: "Late rows", num: true, render: (r) => num(r.late_rows) },
    { key: "last_checkpoint_at", title: "Last checkpoint", num: true, render: (r) => age(r.last_checkpoint_at),
      sort: (r) => r.last_checkpoint_at ? -new Date(r.last_checkpoint_at).getTime() : null },
    { key: "waiting", title: "Waiting for", render: (r) => r.waiting || r.last_error || "-" },
  ];
  const table = sortableTable(columns, [], {
    id: "pipelines", filter: (r) => {
      const q = filter.value.trim().toLowerCase();
      return !q || [r.id, r.name, r.state].some((v) => String(v).toLowerCase().includes(q));
    },
  });
  filter.addEventListener("input", () => table.rerender());
  show(main, el("h1", {}, "Pipelines"), el("div", { class: "toolbar" }, filter, status), table,
    el("p", { class: "muted", id: "no-pipelines", hidden: "" }, "No pipelines yet: submit one with flight-serve submit FILE.sql"));
  every(1000, async () => {
    const data = await api("/pipelines");
    table.setRows(data.pipelines);
    document.getElementById("no-pipelines").hidden = data.pipelines.length > 0;
    status.textContent = "updated " + new Date().toLocaleTimeString();
  });
}

function card(k, v, id) { return el("div", { class: "card" }, el("div", { class: "k" }, k), el("div", { class: "v", id }, v)); }

function graphView(graph) {
  const kinds = [["source", "table", "function"], ["map", "window"], ["sink"]];
  const titles = ["Sources", "Queries", "Sinks"];
  const from = {};
  for (const [a, b] of graph.edges) (from[b] = from[b] || []).push(a);
  const byId = Object.fromEntries(graph.nodes.map((n) => [n.id, n]));
  return el("div", { class: "graph", id: "graph" }, kinds.map((ks, i) => el("div", { class: "col" },
    el("h3", {}, titles[i]),
    graph.nodes.filter((n) => ks.includes(n.kind)).map((n) => el("div", { class: "node kind-" + n.kind, "data-node": n.id },
      el("div", { class: "label" }, n.label),
      el("div", { class: "detail" }, n.kind + (n.detail ? " · " + n.detail : "")),
      (from[n.id] || []).length ? el("div", { class: "from" }, "← " + from[n.id].map((f) => (byId[f] || { label: f }).label).join(", ")) : null,
      el("div", { class: "counts" }, [
        n.rows_in !== undefined ? "rows in " + num(n.rows_in) : null,
        n.rows_out !== undefined ? "rows out " + num(n.rows_out) : null,
        n.late_rows !== undefined ? "late " + num(n.late_rows) : null,
        n.open_windows !== undefined ? "open windows " + num(n.open_windows) : null,
        n.watermark !== undefined ? "watermark " + date(n.watermark) : null,
      ].filter(Boolean).join(" · ")),
      n.partitions && n.partitions.length ? el("div", { class: "marks" },
        n.partitions.slice(0, 4).map((p) => el("div", { "data-partition": p.partition },
          partitionName(p.partition) + ": " + date(p.watermark) + partitionState(p))),
        n.partitions.length > 4 ? el("div", {}, "… " + (n.partitions.length - 4) + " more partitions below") : null) : null)))));
}

function partitionName(name) { return name === "" ? "(unnamed writer)" : name; }
function partitionState(p) { return p.finished ? " (ended)" : (p.idle ? " (idle)" : ""); }

/* every windowed node's input partitions, one row each (the engine's W_p) */
function partitionRows(graph) {
  const rows = [];
  for (const n of graph.nodes) for (const p of n.partitions || []) {
    rows.push({ id: n.id + "/" + p.partition, query: n.label, partition: p.partition, watermark: p.watermark,
      state: p.finished ? "ended" : (p.idle ? "idle" : "active") });
  }
  return rows;
}

/* Axis units: one unit for every tick of an axis, chosen by its largest tick, so the
   labels stay short (a lag of years is "4,749 d", not 410,000,000 s). [divisor, suffix] */
const DURATION_UNITS = [[86400, " d", 172800], [3600, " h", 7200], [60, " min", 120], [1, " s", 0]];
const NUMBER_UNITS = [[1e9, "G", 1e9], [1e6, "M", 1e6], [1e3, "k", 1e4], [1, "", 0]];
function unitFor(units, top) { return units.find(([, , from]) => Math.abs(top) >= from) || units[units.length - 1]; }
function scaled(units) {
  return {
    one: (v) => { const [d, s] = unitFor(units, v); return rate(v / d) + s; },
    ticks: (splits) => {  // as few decimals as keep the ticks apart
      const [d, s] = unitFor(units, Math.max(...splits.map(Math.abs)));
      let labels = [];
      for (let digits = 0; digits <= 3; digits++) {
        labels = splits.map((v) => v === 0 && !s.startsWith(" ") ? "0"  // "0", not "0k"
          : (v / d).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits }) + s);
        if (new Set(labels).size === labels.length) break;
      }
      return labels;
    },
  };
}
const shortDuration = scaled(DURATION_UNITS);
const shortNumber = scaled(NUMBER_UNITS);

function plot(title, id, label, color, integers, format = shortNumber) {
  const box = el("div", { class: "plot", id });
  if (typeof uPlot === "undefined") { box.append(el("p", { class: "error" }, "plot library missing: run make console-assets")); return { box, update() {} }; }
  const values = (u, splits) => format.ticks(splits);
  // room for the longest tick label (uPlot calls this with the labels it will draw)
  const size = (u, labels) => 18 + 7 * Math.max(3, ...(labels || []).map((l) => String(l).length));
  const axis = integers ? { size, values, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e4, 1e5, 1e6] } : { size, values };
  const u = new uPlot({
    title, width: 420, height: 200,
    series: [{}, { label, stroke: color, width: 2, fill: color + "22", value: (u, v) => v === null || v === undefined ? "--" : format.one(v) }],
    axes: [{}, axis],
    scales: { x: { time: true }, y: integers !== undefined ? { range: (u, lo, hi) => [0, Math.max(hi * 1.1, 1)] } : {} },
  }, [[], []], box);
  plots.push(u);
  return { box, u, update(xs, ys) { u.setData([xs, ys]); box.dataset.points = String(xs.length); box.dataset.last = ys.length ? String(ys[ys.length - 1]) : ""; } };
}

async function pipelinePage(pid) {
  const data = await api("/pipelines/" + encodeURIComponent(pid));
  const who = await api("/whoami");
  const admin = who.roles.includes("admin");
  const lag = plot("Watermark lag", "plot-lag", "lag", "#2a62d8", undefined, shortDuration);
  const thr = plot("Throughput (rows/s)", "plot-throughput", "rows/s", "#237a3b", false);
  const panes = plot("Open windows", "plot-panes", "open panes", "#a05a00", true);
  const message = el("span", { id: "action-message" });
  const act = (what) => async () => {
    message.textContent = what + "…";
    try { const r = await api("/pipelines/" + encodeURIComponent(pid) + "/" + what, { method: "POST" }); message.textContent = what + ": " + JSON.stringify(r); }
    catch (e) { message.textContent = what + " refused: " + e.message; message.className = "error"; }
  };
  const logs = el("pre", { class: "logs", id: "logs" });
  const checkpoints = el("div", { id: "checkpoints" });
  const partitions = el("div", { id: "partitions" });
  const cards = el("div", { class: "cards", id: "cards" });
  show(main,
    el("h1", {}, "Pipeline ", el("span", { id: "pipeline-id" }, pid)),
    el("div", { class: "toolbar" },
      el("button", { id: "checkpoint", onclick: act("checkpoint"), disabled: admin ? null : "", title: admin ? "" : "needs the admin role" }, "Checkpoint now"),
      el("button", { id: "cancel", class: "danger", onclick: act("cancel"), disabled: admin ? null : "", title: admin ? "" : "needs the admin role" }, "Cancel"),
      el("a", { href: "#/late/" + encodeURIComponent(pid) }, "late rows"), message),
    cards,
    el("h2", {}, "Graph"), el("div", { id: "graph-box" }, graphView(data.graph)),
    el("h2", {}, "Over time"), el("div", { class: "plots" }, lag.box, thr.box, panes.box),
    el("div", { class: "two" },
      el("div", {}, el("h2", {}, "Watermark per partition"), partitions),
      el("div", {}, el("h2", {}, "Checkpoints"), checkpoints)),
    el("h2", {}, "Logs"), logs,
    el("h2", {}, "SQL"), el("pre", { id: "sql" }, data.sql));
  function renderSummary(d) {
    const s = d.summary;
    cards.replaceChildren(
      card("state", s.state, "card-state"), card("watermark", date(s.watermark), "card-watermark"),
      card("lag", hms(s.watermark_lag_s), "card-lag"), card("rows/s", rate(s.rows_per_s), "card-rate"),
      card("rows in", num(s.rows_in), "card-rows-in"), card("late rows", num(s.late_rows), "card-late"),
      card("open windows", num(s.open_panes), "card-panes"), card("epoch", s.epoch ?? "-", "card-epoch"),
      card("last checkpoint", age(s.last_checkpoint_at), "card-checkpoint-age"),
      card("waiting for", s.waiting || "-", "card-waiting"));
    if (s.last_error) cards.append(card("last error", s.last_error, "card-error"));
    const marks = partitionRows(d.graph);
    const markers = d.partitions.filter((p) => p.watermark !== null);
    show(partitions,
      marks.length
        ? sortableTable([{ key: "query", title: "Query" }, { key: "partition", title: "Partition", render: (r) => partitionName(r.partition) },
          { key: "watermark", title: "Watermark", render: (r) => date(r.watermark) }, { key: "state", title: "State" }],
          marks, { id: "partitions-table" })
        : el("p", { class: "muted" }, "no windowed query: no watermark"),
      markers.length ? el("h3", {}, "Writers' watermark markers") : null,
      markers.length ? sortableTable([{ key: "stream", title: "Stream" }, { key: "writer", title: "Writer", render: (r) => partitionName(r.writer) },
        { key: "watermark", title: "Marker", render: (r) => date(r.watermark) },
        { key: "last_offset", title: "Last offset", num: true }, { key: "ended", title: "Ended", render: (r) => r.ended ? "yes" : "no" }],
        markers.map((p) => Object.assign({ id: p.stream + "/" + p.writer }, p)), { id: "markers-table" }) : null);
  }
  renderSummary(data);
  let after = 0;
  let since = null;
  const xs = [], ys = [[], [], []];
  every(1000, async () => {
    const d = await api("/pipelines/" + encodeURIComponent(pid));
    renderSummary(d);
    document.getElementById("graph-box").replaceChildren(graphView(d.graph));
    const s = await api("/pipelines/" + encodeURIComponent(pid) + "/samples" + (since !== null ? "?since=" + since : ""));
    for (const p of s.samples) { xs.push(p.t); ys[0].push(p.watermark_lag_s); ys[1].push(p.rows_per_s); ys[2].push(p.open_panes); since = p.t; }
    lag.update(xs, ys[0]); thr.update(xs, ys[1]); panes.update(xs, ys[2]);
    const c = await api("/pipelines/" + encodeURIComponent(pid) + "/checkpoints");
    checkpoints.replaceChildren(c.checkpoints.length ? el("div", { class: "scroll" }, sortableTable([
      { key: "epoch", title: "Epoch", num: true }, { key: "taken_at", title: "When", render: (r) => date(r.taken_at) },
      { key: "duration_ms", title: "Duration ms", num: true, render: (r) => r.duration_ms === null ? "-" : r.duration_ms.toFixed(1) },
      { key: "bytes", title: "Size", num: true, render: (r) => bytes(r.bytes) }],
      c.checkpoints.slice(0, 50).map((x) => Object.assign({ id: String(x.epoch) }, x)), { id: "checkpoints-table" }))
      : el("p", { class: "muted" }, "no checkpoint yet"));
    const l = await api("/pipelines/" + encodeURIComponent(pid) + "/logs?after=" + after);
    for (const line of l.lines) { logs.append(line.ts + " " + line.level + ": " + line.message + "\n"); after = line.seq; }
    if (l.lines.length) logs.scrollTop = logs.scrollHeight;
  });
}

async function streamsPage() {
  const data = await api("/streams");
  const detail = el("div", { id: "stream-detail" });
  const columns = [
    { key: "name", title: "Stream", render: (r) => el("a", { href: "#/stream/" + encodeURIComponent(r.name) }, r.name) },
    { key: "rows", title: "Rows", num: true, render: (r) => num(r.rows) },
    { key: "bytes", title: "Bytes", num: true, render: (r) => bytes(r.bytes) },
    { key: "first_offset", title: "First offset", num: true }, { key: "next_offset", title: "Next offset", num: true },
    { key: "writers", title: "Writers (pipeline)", sort: (r) => r.writers.length,
      render: (r) => r.writers.map((w) => (w.name || "(unnamed)") + (w.pipeline ? " (" + w.pipeline + ")" : "")).join(", ") || "-" },
    { key: "created_at", title: "Created", render: (r) => date(r.created_at) },
  ];
  const table = sortableTable(columns, data.streams, { id: "streams" });
  show(main, el("h1", {}, "Streams"), table, data.streams.length ? null : el("p", { class: "muted" }, "no streams"), detail);
}

async function streamPage(name) {
  const s = await api("/streams/" + encodeURIComponent(name));
  const rows = el("div", { id: "newest-rows" });
  const ret = s.retention;
  show(main,
    el("h1", {}, "Stream ", el("span", { id: "stream-name" }, s.name)),
    el("div", { class: "cards" }, card("rows", num(s.rows), "card-rows"), card("bytes", bytes(s.bytes), "card-bytes"),
      card("offsets", s.first_offset + " … " + s.next_offset, "card-offsets"),
      card("retention", (ret.bytes ? bytes(ret.bytes) : "all bytes") + " · " + (ret.age_s ? hms(ret.age_s) : "any age"), "card-retention")),
    el("div", { class: "two" },
      el("div", {}, el("h2", {}, "Schema"), resultTable([{ name: "column" }, { name: "type" }, { name: "nullable" }],
        s.schema.map((f) => [f.name, f.type, f.nullable ? "yes" : "no"]), "schema")),
      el("div", {}, el("h2", {}, "Writers"), sortableTable([{ key: "name", title: "Writer", render: (r) => r.name || "(unnamed)" }, { key: "pipeline", title: "Pipeline" },
        { key: "watermark", title: "Watermark", render: (r) => date(r.watermark) }, { key: "last_offset", title: "Last offset", num: true },
        { key: "ended", title: "Ended", render: (r) => r.ended ? "yes" : "no" }], s.writers.map((w) => Object.assign({ id: w.name }, w)), { id: "writers" }))),
    el("h2", {}, "Newest rows (live)"), rows);
  every(1000, async () => {
    const r = await api("/streams/" + encodeURIComponent(name) + "/rows?limit=20");
    rows.replaceChildren(resultTable([{ name: "offset", type: "int64" }, ...r.columns], r.rows.map((row, i) => [r.offsets[i], ...row]).reverse(), "rows"));
  });
}

async function sqlPage() {
  const box = el("textarea", { id: "sql-input", spellcheck: "false" }, sessionStorage.getItem("flight-serve-sql") || "SELECT 1 AS one");
  const out = el("div", { id: "sql-result" });
  const info = el("span", { id: "sql-info", class: "muted" });
  async function run() {
    sessionStorage.setItem("flight-serve-sql", box.value);
    info.textContent = "running…"; info.className = "muted";
    try {
      const r = await api("/query", { method: "POST", body: { sql: box.value } });
      info.textContent = num(r.row_count) + " rows in " + r.elapsed_ms.toFixed(1) + " ms" + (r.truncated ? " (first " + r.rows.length + " shown)" : "");
      info.dataset.rows = String(r.row_count);
      out.replaceChildren(resultTable(r.columns, r.rows, "result"));
    } catch (e) { info.textContent = e.message; info.className = "error"; out.replaceChildren(); }
  }
  async function download(format) {
    try {
      const res = await api("/query/download", { method: "POST", body: { sql: box.value, format }, raw: true });
      const url = URL.createObjectURL(await res.blob());
      const a = el("a", { href: url, download: "result." + format }); document.body.append(a); a.click(); a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { info.textContent = e.message; info.className = "error"; }
  }
  box.addEventListener("keydown", (ev) => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) run(); });
  show(main, el("h1", {}, "SQL"), el("p", { class: "muted" }, "Read-only queries over the streams (DataFusion). Ctrl+Enter runs."), box,
    el("div", { class: "toolbar" }, el("button", { id: "run", onclick: run }, "Run"),
      el("button", { id: "csv", onclick: () => download("csv") }, "CSV"),
      el("button", { id: "parquet", onclick: () => download("parquet") }, "Parquet"), info), out);
}

async function latePage(pid) {
  const list = await api("/pipelines");
  const pick = el("select", { id: "late-pipeline" }, el("option", { value: "" }, "choose a pipeline"),
    list.pipelines.map((p) => el("option", { value: p.id, selected: p.id === pid ? "" : null }, p.id + " (" + num(p.late_rows) + " late)")));
  pick.addEventListener("change", () => { location.hash = "#/late/" + encodeURIComponent(pick.value); });
  const out = el("div", { id: "late-outputs" });
  const PAGE = 100;
  let skip = 0;
  const newer = el("button", { id: "late-newer", disabled: "" }, "← newer");
  const older = el("button", { id: "late-older", disabled: "" }, "older →");
  const where = el("span", { id: "late-page", class: "muted" });
  show(main, el("h1", {}, "Late rows"), el("div", { class: "toolbar" }, pick, newer, older, where), out);
  if (!pid) return;
  async function load() {
    const d = await api("/pipelines/" + encodeURIComponent(pid) + "/late?limit=" + PAGE + "&skip=" + skip);
    const total = Math.max(0, ...d.outputs.map((o) => o.total_rows || 0));
    newer.disabled = skip === 0;
    older.disabled = skip + PAGE >= total;
    where.textContent = total ? "rows " + num(Math.min(skip + 1, total)) + " to " + num(Math.min(skip + PAGE, total)) + " of " + num(total) + ", newest first" : "";
    out.replaceChildren(...(d.outputs.length ? d.outputs.map((o) => el("div", {},
      el("h2", {}, "LATE of " + o.of + " → " + (o.sink || "-") + (o.stream ? " (stream " + o.stream + ")" : "")),
      el("p", {}, num(o.late_rows) + " late rows so far"),
      o.rows ? resultTable([{ name: "offset" }, ...o.columns], o.rows.map((r, i) => [o.offsets[i], ...r]).reverse(), "late-rows")
        : el("p", { class: "muted" }, "its sink is not a server stream of this server: the rows are at " + (o.sink || "-"))))
      : [el("p", { class: "muted" }, "this pipeline has no query reading LATE(x): its late rows are only counted (" + num(list.pipelines.find((p) => p.id === pid)?.late_rows) + ")")]));
  }
  newer.addEventListener("click", () => { skip = Math.max(0, skip - PAGE); load(); });
  older.addEventListener("click", () => { skip += PAGE; load(); });
  every(2000, load);
}

async function route() {
  clear();
  const [, page, arg] = (location.hash || "#/pipelines").split("/");
  const name = arg ? decodeURIComponent(arg) : "";
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active",
    a.dataset.nav === page || (page === "pipeline" && a.dataset.nav === "pipelines") || (page === "stream" && a.dataset.nav === "streams")));
  try {
    if (page === "pipeline") await pipelinePage(name);
    else if (page === "streams") await streamsPage();
    else if (page === "stream") await streamPage(name);
    else if (page === "sql") await sqlPage();
    else if (page === "late") await latePage(name);
    else await pipelinesPage();
  } catch (e) {
    if (e.message !== "unauthenticated") show(main, el("p", { class: "error", id: "page-error" }, e.message));
  }
}

async function start() {
  try {
    const who = await api("/whoami");
    document.getElementById("who").textContent = who.auth ? who.name + " (" + who.roles.join(", ") + ")" : "open server";
    route();
  } catch (e) { /* the login form is up */ }
}

window.addEventListener("hashchange", route);
start();
