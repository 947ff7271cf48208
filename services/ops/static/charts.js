// podvisor charts: CPU and memory of every subsystem, pod and container over the last hour
// (the last 10 minutes at full resolution), restarts and faults marked on the same time axis.
// Drawn with uPlot (vendored: static/uPlot.iife.min.js, MIT). The history comes once from
// /api/usage, then each sample as a `usage` event of the dashboard's feed (app.js hands it to
// Charts.usage). Values: CPU in millicores, memory in KiB (shown in MiB).
"use strict";
const Charts = (() => {
  const PALETTE = ["#3467d8", "#2e9d5b", "#d9822b", "#9b59b6", "#c8332e", "#16a2b8",
    "#8c6d1f", "#e84393", "#5d6d7e", "#27ae60", "#f39c12", "#6c5ce7"];
  const TOP = 8;  // pods drawn one by one; the others as one "other pods" line
  let hist = null, range = 600, selected = null, base = "";
  const latest = {};  // key -> [cpu, mem] of the last sample
  const plots = {};  // chart id -> {u, keys}
  let bucket = [];  // the client's own coarse step in progress (the server's rule: the mean)

  function el(tag, attrs = {}, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  const cpuText = m => m == null ? "-" : m >= 1000 ? `${(m / 1000).toFixed(2)}` : `${m}m`;
  const memText = k => k == null ? "-" : k >= 1024 * 1024 ? `${(k / 1048576).toFixed(2)} GiB`
    : `${(k / 1024).toFixed(1)} MiB`;

  function xRange() {
    const now = Date.now() / 1000 + (window.podvisorSkew ? window.podvisorSkew() : 0);
    return [now - range, now];
  }
  function view() { return range <= (hist ? hist.fineWindow : 600) ? hist.fine : hist.coarse; }
  function column(cols, key, i) {
    const s = cols.series[key];
    return s ? s[i] : cols.t.map(() => null);
  }
  // a pod's containers, a pod, or the pods: the keys one chart draws
  function podKeys(cols) {
    return Object.keys(cols.series).filter(k => !k.includes(":"));
  }
  function mean(arr) {
    let s = 0, n = 0;
    for (const v of arr) if (v != null) { s += v; n++; }
    return n ? s / n : 0;
  }

  // the charts' definitions (the pods beyond the top 8: one line, their mean): [id, title, keys (with labels), marks filter]
  function definitions(cols) {
    const defs = [];
    const agents = Object.keys(cols.series).filter(k => k.startsWith("agent:")).sort();
    defs.push({ id: "agents", title: "Subsystems", lines: agents.map(k => ({ key: k, label: k.slice(6) })),
      marks: m => m.name.startsWith("agent:") });
    const pods = podKeys(cols);
    for (const [which, idx] of [["cpu", 0], ["mem", 1]]) {
      const ranked = pods.map(k => [k, mean(column(cols, k, idx))]).sort((a, b) => b[1] - a[1]);
      const top = ranked.slice(0, TOP).map(r => r[0]);
      const rest = ranked.slice(TOP).map(r => r[0]);
      defs.push({ id: `pods-${which}`, only: idx, title: `Pods by ${which === "cpu" ? "CPU" : "memory"}` +
        (rest.length ? ` (top ${TOP} of ${pods.length})` : ""),
        lines: top.map(k => ({ key: k, label: k })).concat(rest.length
          ? [{ key: rest, label: `other ${rest.length} pods (mean)` }] : []),
        marks: m => !m.name.startsWith("agent:") });
    }
    if (selected) {
      const own = Object.keys(cols.series).filter(k => k.startsWith(selected + ":")).sort();
      const lines = [{ key: selected, label: selected.includes(":") ? selected : `${selected} (pod)` }]
        .concat(own.map(k => ({ key: k, label: k.slice(selected.length + 1) })));
      defs.push({ id: "detail", title: selected, lines, detail: true,
        marks: m => m.name === selected || m.name.startsWith(selected + ":") });
    }
    return defs;
  }
  function values(cols, key, idx) {
    if (!Array.isArray(key)) return column(cols, key, idx).map(v => v == null ? null
      : idx === 1 ? v / 1024 : v);
    return cols.t.map((_, i) => {  // the mean of many keys ("other pods"): on the lines' scale
      let s = 0, n = 0;
      for (const k of key) { const v = (cols.series[k] || [[], []])[idx][i]; if (v != null) { s += v; n++; } }
      return n ? (idx === 1 ? s / n / 1024 : s / n) : null;
    });
  }
  function markLayer(u, filter) {
    const over = u.over;
    for (const old of over.querySelectorAll(".mark")) old.remove();
    const [lo, hi] = [u.scales.x.min, u.scales.x.max];
    for (const m of hist.marks) {
      if (!filter(m) || m.t < lo || m.t > hi) continue;
      const x = u.valToPos(m.t, "x");
      const when = new Date(m.t * 1000).toLocaleTimeString();
      over.append(el("div", { class: `mark ${m.kind}`, style: `left:${x}px`, "data-name": m.name,
        "data-t": m.t, title: `${m.name}: ${m.kind === "restart" ? "restarted" : "fault"} at ${when}` +
        (m.text ? ` (${m.text})` : "") }));
    }
  }
  function draw(box, def, idx, cols) {
    const id = `${def.id}-${idx}`;
    const data = [cols.t, ...def.lines.map(l => values(cols, l.key, idx))];
    const sig = JSON.stringify(def.lines.map(l => l.label)) + box.clientWidth;
    let p = plots[id];
    if (p && p.u && p.sig === sig && p.u.root.isConnected) {
      p.filter = def.marks;
      p.u.setData(data);  // the x scale's range: xRange(), the window ending now
      return;
    }
    if (p && p.u) p.u.destroy();
    let holder = box.querySelector(`[data-chart="${id}"]`);
    if (!holder) { holder = el("div", { class: "plot", "data-chart": id }); box.append(holder); }
    holder.replaceChildren();
    const width = Math.max(300, Math.floor((box.clientWidth || 900) / (def.only == null ? 2 : 1)) - 16);
    const entry = plots[id] = { u: null, sig, filter: def.marks };
    entry.u = new uPlot({
      width, height: def.detail ? 200 : 170, title: idx === 0 ? "CPU (millicores)" : "memory (MiB)",
      scales: { x: { time: true, range: () => xRange() } },
      series: [{}, ...def.lines.map((l, i) => ({ label: l.label, stroke: PALETTE[i % PALETTE.length],
        width: 1.5, spanGaps: false, points: { show: false } }))],
      axes: [{ space: 70 }, { size: 56, values: (u, vs) => vs.map(v => idx === 0 ? cpuText(Math.round(v)) : `${v.toFixed(1)}`) }],
      legend: { live: true },
      hooks: { draw: [uu => markLayer(uu, entry.filter)] },
    }, data, holder);
  }
  function render() {
    if (!hist) return;
    const cols = view();
    const defs = definitions(cols);
    const root = document.getElementById("charts");
    const wanted = new Set();
    for (const def of defs) {
      let box = root.querySelector(`[data-panel="${def.id}"]`);
      if (!box) {
        box = el("div", { class: "panel", "data-panel": def.id },
          el("h3", {}, def.title, el("span", { class: "now" })),
          el("div", { class: "plots" }));
        if (def.detail) box.querySelector("h3").append(el("button", { onclick: () => select(null) }, "close"));
        root.append(box);
      }
      box.querySelector("h3").firstChild.textContent = def.title;
      wanted.add(def.id);
      const plotsBox = box.querySelector(".plots");
      for (const idx of def.only == null ? [0, 1] : [def.only]) {
        wanted.add(`${def.id}-${idx}`);
        draw(plotsBox, def, idx, cols);
      }
      if (def.detail) {
        const v = latest[selected] || [];
        const now = box.querySelector(".now");
        now.textContent = ` now: CPU ${cpuText(v[0])} · memory ${memText(v[1])}`;
        now.dataset.cpu = v[0] ?? ""; now.dataset.mem = v[1] ?? "";
      }
    }
    for (const [id, p] of Object.entries(plots)) {
      if (!wanted.has(id)) { if (p.u) p.u.destroy(); delete plots[id]; }
    }
    for (const box of root.querySelectorAll("[data-panel]")) {
      if (!wanted.has(box.dataset.panel)) box.remove();
    }
    readouts();
  }
  // the CPU and memory cells of the tables (app.js renders them with data-usage="KEY")
  function readouts() {
    for (const td of document.querySelectorAll("[data-usage]")) {
      const v = latest[td.dataset.usage];
      const text = v ? `${cpuText(v[0])} · ${memText(v[1])}` : "-";
      if (td.textContent !== text) td.textContent = text;
    }
  }
  function pressure(conds) {
    const box = document.getElementById("pressure");
    if (!box || !conds) return;
    box.replaceChildren(...conds.map(c => el("span", { class: `cond ${c.status === "True" ? "False" : "True"}`,
      "data-condition": c.type, "data-status": c.status, title: c.message },
      `${c.type}${c.status === "True" ? "!" : ""}`)));
  }
  function appendTo(cols, t, v, keep) {
    const n = cols.t.length;
    cols.t.push(t);
    for (const [k, s] of Object.entries(cols.series)) {
      const x = v[k];
      s[0].push(x ? x[0] : null); s[1].push(x ? x[1] : null);
    }
    for (const [k, x] of Object.entries(v)) {
      if (cols.series[k]) continue;
      const pad = new Array(n).fill(null);
      cols.series[k] = [[...pad, x[0]], [...pad, x[1]]];
    }
    let drop = 0;
    while (drop < cols.t.length && cols.t[drop] < t - keep) drop++;
    if (drop) {
      cols.t.splice(0, drop);
      for (const s of Object.values(cols.series)) { s[0].splice(0, drop); s[1].splice(0, drop); }
    }
  }
  function usage(d) {
    if (!hist) return;
    Object.assign(latest, d.v);
    for (const k of Object.keys(latest)) if (!(k in d.v)) delete latest[k];
    appendTo(hist.fine, d.t, d.v, hist.fineWindow);
    // the coarse step: the mean of the samples in it (the last point moves until it closes)
    const step = hist.coarseStep, end = (Math.floor(d.t / step) + 1) * step;
    if (bucket.length && bucket.end !== end) {
      bucket = [];
    } else if (bucket.length) {
      hist.coarse.t.pop();
      for (const s of Object.values(hist.coarse.series)) { s[0].pop(); s[1].pop(); }
    }
    bucket.push(d.v); bucket.end = end;
    const sums = {};
    for (const v of bucket) for (const [k, x] of Object.entries(v)) {
      const a = sums[k] ||= [0, 0, 0]; a[0] += x[0]; a[1] += x[1]; a[2]++;
    }
    const means = Object.fromEntries(Object.entries(sums).map(([k, a]) => [k, [Math.round(a[0] / a[2]), Math.round(a[1] / a[2])]]));
    appendTo(hist.coarse, d.t, means, hist.window);
    for (const m of d.marks || []) hist.marks.push(m);
    while (hist.marks.length && hist.marks[0].t < d.t - hist.window) hist.marks.shift();
    pressure(d.pressure);
    render();
  }
  async function load(apiBase) {
    base = apiBase;
    const r = await fetch(`${base}/api/usage`);
    if (!r.ok) return;
    hist = await r.json();
    const f = hist.fine;
    if (f.t.length) {
      const i = f.t.length - 1;
      for (const [k, s] of Object.entries(f.series)) if (s[0][i] != null) latest[k] = [s[0][i], s[1][i]];
    }
    pressure(hist.pressure);
    render();
  }
  function setRange(seconds) {
    range = seconds;
    for (const b of document.querySelectorAll("[data-range]")) b.classList.toggle("on", Number(b.dataset.range) === seconds);
    render();
  }
  function select(key) {
    selected = key;
    render();
    if (key) document.querySelector('[data-panel="detail"]')?.scrollIntoView({ block: "nearest" });
  }
  window.addEventListener("resize", () => { for (const p of Object.values(plots)) p.sig = ""; render(); });
  return { load, usage, select, setRange, readouts, latest: () => latest, marks: () => hist ? hist.marks : [] };
})();
