// podvisor dashboard: live state over server-sent events, actions over POST /api/action.
// The server sends a `state` when something changed and a `ping` ({now, every}) every `every`
// seconds otherwise: uptimes, the clock and the timeline move here, on the server's clock.
"use strict";
const COLORS = { RUNNING: "#2e9d5b", STARTING: "#d9a400", BACKOFF: "#e07b00",
  STOPPING: "#8a93a6", STOPPED: "#8a93a6", EXITED: "#8a93a6", FATAL: "#c8332e",
  UNKNOWN: "#c8332e" };
const SIGNALS = ["KILL", "TERM", "INT", "HUP", "STOP", "CONT", "USR1", "USR2"];
// absolute URLs from the origin: a page opened as http://user:pass@host/ resolves relative
// URLs with the credentials in them, which fetch() refuses
// (the page's own folder: "" at the node's root, "/nodes/NAME" behind the fleet's proxy)
const API = location.origin + location.pathname.replace(/\/[^/]*$/, "");
let state = null;
let skew = 0;  // server clock - local clock (s): uptimes tick locally between states
let every = 15, lastEvent = Date.now(), source = null;  // the ping period; the watchdog
let logName = null, logOffset = -1, logTimer = null;

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function dur(s) {
  if (s == null) return "-";
  const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, x = Math.floor(s) % 60;
  return `${h}:${String(m).padStart(2, "0")}:${String(x).padStart(2, "0")}`;
}
function badge(st) { return el("span", { class: `st ${st}` }, st); }
function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg; t.hidden = false; setTimeout(() => { t.hidden = true; }, 4000);
}
async function act(action, name, signal) {
  const r = await fetch(`${API}/api/action`, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ action, name, signal }) });
  if (!r.ok) toast(await r.text().then(t => { try { return JSON.parse(t).faultString; }
    catch (e) { return `${action} ${name}: HTTP ${r.status}`; } }));
}
function actions(p) {
  const td = el("td");
  const btn = (label, fn) => el("button", { "data-action": label, "data-name": p.namespec, onclick: fn }, label);
  if (p.kind === "agent") {
    td.append(btn("start", () => act("start", p.namespec)), btn("stop", () => act("stop", p.namespec)),
      btn("restart", () => act("restart", p.namespec)));
  } else {
    td.append(btn("restart", () => act("restart", p.namespec)));
  }
  const sel = el("select", { "data-signal": p.namespec }, ...SIGNALS.map(s => el("option", { value: s }, s)));
  td.append(sel, btn("kill", () => act("kill", p.namespec, sel.value)), btn("log", () => openLog(p.namespec)),
    btn("chart", () => Charts.select(p.kind === "agent" ? p.namespec : p.group)));
  return td;
}
// "ok", or since when (server seconds) the supervisor has had no heartbeat: the age ticks here
// (the supervisor says when it goes late and when it beats again, not every beat)
function heartbeat(p) {
  if (p.heartbeat === "ok") return el("td", { class: "hb" }, "ok");
  if (typeof p.heartbeat !== "number") return el("td", { class: "hb" }, "-");
  return el("td", { class: "hb late", "data-late": p.heartbeat },
    `late ${dur(Math.max(0, serverNow() - p.heartbeat))}`);
}
function renderProcs() {
  const tb = document.querySelector("#procs tbody");
  tb.replaceChildren(...state.processes.filter(p => p.kind === "agent").map(p => {
    const last = p.lastExit ? `${p.lastExit.reason || ""}` : "-";
    return el("tr", { "data-proc": p.namespec }, el("td", {}, p.name), el("td", {}, badge(p.statename)),
      el("td", { class: "pid" }, p.pid || "-"), el("td", { "data-start": p.statename === "RUNNING" ? p.start : "" }, dur(p.uptime)),
      heartbeat(p), el("td", { class: "restarts" }, p.restarts), el("td", {}, last),
      el("td", { class: "usage", "data-usage": p.namespec }, "-"), actions(p));
  }));
}
function renderPods() {
  const box = document.getElementById("pods");
  const byGroup = {};
  for (const p of state.processes) if (p.kind === "container") (byGroup[p.group] ||= []).push(p);
  box.replaceChildren(...state.pods.map(pod => {
    const rows = (byGroup[pod.group] || []).map(c => {
      const cs = pod.containers.find(x => x.name === c.name) || {};
      return el("tr", { "data-proc": c.namespec }, el("td", {}, c.name), el("td", {}, badge(c.statename)),
        el("td", { class: "pid" }, c.pid || "-"), el("td", { "data-start": c.statename === "RUNNING" ? c.start : "" }, dur(c.uptime)),
        el("td", { class: "restarts" }, cs.restartCount ?? c.restarts),
        el("td", {}, cs.ready ? "ready" : (cs.reason || "not ready")),
        el("td", { class: "usage", "data-usage": c.namespec }, "-"), actions(c));
    });
    const conds = pod.conditions.map(c => el("span", { class: `cond ${c.status}` }, `${c.type}`));
    return el("div", { class: "pod", "data-pod": pod.group },
      el("h3", {}, `${pod.namespace}/${pod.name} `, badge(pod.phase === "Running" ? "RUNNING" : pod.phase === "Failed" ? "FATAL" : "STARTING"), ` ${pod.phase}`),
      el("div", { class: "meta" }, `IP ${pod.podIP || "-"} · `, ...conds, " · ",
        el("span", { class: "usage", "data-usage": pod.group }, "-"), " ",
        el("button", { "data-action": "chart", "data-name": pod.group, onclick: () => Charts.select(pod.group) }, "chart")),
      el("table", {}, el("thead", {}, el("tr", {}, ...["container", "state", "pid", "uptime", "restarts", "readiness", "CPU · memory", "actions"].map(h => el("th", {}, h)))),
        el("tbody", {}, ...rows)));
  }));
}
function serverNow() { return Date.now() / 1000 + skew; }
function renderTimeline() {
  const now = serverNow(), start = now - 3600, W = 1000;
  const byName = {};
  for (const c of state.timeline) (byName[c.name] ||= []).push(c);
  const grid = el("div", { class: "tl" });
  for (const p of state.processes) {
    const changes = byName[p.namespec] || [];
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} 16`); svg.setAttribute("preserveAspectRatio", "none");
    changes.forEach((c, i) => {
      const x0 = Math.max(0, (c.t - start) / 3600 * W);
      const x1 = i + 1 < changes.length ? (changes[i + 1].t - start) / 3600 * W : W;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", x0); r.setAttribute("y", 2); r.setAttribute("height", 12);
      r.setAttribute("width", Math.max(1, x1 - x0)); r.setAttribute("fill", COLORS[c.state] || "#999");
      const t = document.createElementNS(ns, "title");
      t.textContent = `${c.state} at ${new Date(c.t * 1000).toLocaleTimeString()}`; r.append(t);
      svg.append(r);
      if (c.restart) {
        const m = document.createElementNS(ns, "path");
        m.setAttribute("d", `M${x0 - 4} 16 L${x0} 6 L${x0 + 4} 16 Z`); m.setAttribute("fill", "#c8332e");
        svg.append(m);
      }
    });
    grid.append(el("div", { class: "lbl", title: p.namespec }, p.namespec), svg);
  }
  document.getElementById("timeline").replaceChildren(grid);
}
function render() {
  renderProcs(); renderPods(); renderTimeline(); Charts.readouts();
  document.getElementById("clock").textContent = new Date(serverNow() * 1000).toLocaleString();
}
async function pollLog() {
  if (!logName) return;
  const r = await fetch(`${API}/api/log?name=${encodeURIComponent(logName)}&offset=${logOffset}`);
  if (r.ok) {
    const d = await r.json(), pre = document.getElementById("log");
    if (d.text) { pre.append(d.text); pre.scrollTop = pre.scrollHeight; }
    logOffset = d.offset;
  }
  logTimer = setTimeout(pollLog, 1000);
}
function openLog(name) {
  clearTimeout(logTimer);
  logName = name; logOffset = -1;
  document.getElementById("logname").textContent = name;
  document.getElementById("log").textContent = "";
  document.getElementById("logpane").hidden = false;
  pollLog();
}
document.getElementById("logclose").onclick = () => {
  logName = null; clearTimeout(logTimer); document.getElementById("logpane").hidden = true;
};
function live(now) {
  skew = now - Date.now() / 1000; lastEvent = Date.now();
  const conn = document.getElementById("conn");
  conn.textContent = "live"; conn.classList.remove("down");
}
function down() {
  const conn = document.getElementById("conn");
  conn.textContent = "reconnecting…"; conn.classList.add("down");
}
function connect() {
  if (source) source.close();
  lastEvent = Date.now();
  const es = source = new EventSource(`${API}/api/events`);
  es.addEventListener("state", ev => { state = JSON.parse(ev.data); live(state.now); render(); });
  es.addEventListener("usage", ev => { const d = JSON.parse(ev.data); live(d.t); Charts.usage(d); });
  es.addEventListener("ping", ev => { const p = JSON.parse(ev.data); every = p.every || every;
    live(p.now); if (state) renderTimeline(); });
  es.onerror = down;  // EventSource retries by itself (the server asks for 1 s)
}
setInterval(() => {  // uptimes and the clock between states; a silent connection is dead
  if (Date.now() - lastEvent > 3 * every * 1000) { down(); connect(); }
  const now = serverNow();
  for (const td of document.querySelectorAll("td[data-start]")) {
    if (td.dataset.start) td.textContent = dur(now - Number(td.dataset.start));
  }
  for (const td of document.querySelectorAll("td[data-late]")) {
    td.textContent = `late ${dur(Math.max(0, now - Number(td.dataset.late)))}`;
  }
  if (state) document.getElementById("clock").textContent = new Date(now * 1000).toLocaleString();
}, 1000);
window.podvisorSkew = () => skew;
Charts.load(API);
connect();
