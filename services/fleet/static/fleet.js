// podvisor fleet: every node's state over one server-sent event feed (/api/fleet/events:
// `fleet` when something changed, `usage` each node's last sample, `ping` otherwise); actions
// go to POST /api/nodes/NODE/action, which the fleet forwards with that node's credentials.
"use strict";
const API = location.origin + location.pathname.replace(/\/[^/]*$/, "");
const SIGNALS = ["KILL", "TERM", "INT", "HUP", "STOP", "CONT", "USR1", "USR2"];
let state = null, usage = {}, skew = 0, every = 15, lastEvent = Date.now(), source = null;
const open = new Set();  // nodes whose pod list is unfolded

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
const cpuText = m => m == null ? "-" : m >= 1000 ? `${(m / 1000).toFixed(2)}` : `${m}m`;
const memText = k => k == null ? "-" : `${(k / 1024).toFixed(1)} MiB`;
function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg; t.hidden = false; setTimeout(() => { t.hidden = true; }, 5000);
}
async function act(node, action, name, signal) {
  const r = await fetch(`${API}/api/nodes/${encodeURIComponent(node)}/action`, { method: "POST",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ action, name, signal }) });
  if (!r.ok) toast(await r.text().then(t => { try { return `${node}: ${JSON.parse(t).faultString}`; }
    catch (e) { return `${node}: ${action} ${name}: HTTP ${r.status}`; } }));
}
function ago(t) {
  const s = Math.max(0, Math.round(Date.now() / 1000 + skew - t));
  return s < 90 ? `${s}s` : s < 5400 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}
function use(node, key) {
  const v = (usage[node] || {})[key];
  return el("td", { class: "usage", "data-usage": `${node}/${key}` }, v ? `${cpuText(v[0])} · ${memText(v[1])}` : "-");
}
function procRow(node, p, kind) {
  const btn = (label, fn) => el("button", { "data-node": node, "data-action": label, "data-name": p.namespec, onclick: fn }, label);
  const sel = el("select", { "data-signal": `${node}/${p.namespec}` }, ...SIGNALS.map(s => el("option", { value: s }, s)));
  return el("tr", { "data-proc": `${node}/${p.namespec}` },
    el("td", {}, p.name), el("td", {}, el("span", { class: `st ${p.state}` }, p.state)),
    kind === "agent" ? el("td", { class: "pid" }, p.pid || "-") : "",
    el("td", { class: "restarts" }, p.restarts), kind === "agent" ? use(node, p.namespec) : "",
    el("td", {}, btn("restart", () => act(node, "restart", p.namespec)), sel,
      btn("kill", () => act(node, "kill", p.namespec, sel.value))));
}
function card(n) {
  const down = !n.up;
  const head = el("h2", {}, n.name,
    el("span", { class: `nodestate ${down ? "down" : "up"}` }, down ? "DOWN" : "UP"),
    el("span", { class: "meta" }, `${down ? "down" : "up"} for ${ago(n.since)}`),
    el("a", { href: `${API}/nodes/${encodeURIComponent(n.name)}/`, "data-open": n.name }, "open node page →"));
  const box = el("div", { class: `node ${down ? "down" : "up"}`, "data-node": n.name }, head);
  if (down) box.append(el("div", { class: "why" }, n.error || "unreachable"));
  const body = el("div", { class: down ? "stale" : "" });
  const phases = Object.entries(n.phases).map(([ph, c]) => el("span", { class: "phase", "data-phase": ph }, `${ph} ${c}`));
  const conds = n.pressure.map(c => el("span", { class: `cond ${c.status === "True" ? "bad" : "ok"}`,
    "data-condition": c.type, title: c.message }, `${c.type} ${c.status}`));
  body.append(el("div", { class: "meta" }, `${n.pods.length} pods: `, ...(phases.length ? phases : ["-"])),
    el("div", { class: "meta" }, ...(conds.length ? conds : ["pressure: -"]),
      ` · subsystem restarts ${n.restarts}`));
  body.append(el("table", {}, el("thead", {}, el("tr", {}, ...["subsystem", "state", "pid", "restarts", "CPU · memory", "actions"].map(h => el("th", {}, h)))),
    el("tbody", {}, ...n.subsystems.map(s => procRow(n.name, s, "agent")))));
  const det = el("details", { "data-pods": n.name });
  if (open.has(n.name)) det.open = true;
  det.addEventListener("toggle", () => { if (det.open) open.add(n.name); else open.delete(n.name); });
  det.append(el("summary", {}, `pods and containers (${n.pods.length})`));
  const rows = [];
  for (const pod of n.pods) {
    rows.push(el("tr", { class: "podrow" }, el("td", { colspan: 2 }, el("b", {}, pod.group)),
      el("td", {}, pod.phase), use(n.name, pod.group), el("td")));
    for (const c of pod.containers) rows.push(procRow(n.name, c, "container"));
  }
  det.append(el("div", { class: "pods" }, el("table", {}, el("tbody", {}, ...rows))));
  body.append(det);
  box.append(body);
  return box;
}
function render() {
  if (!state) return;
  document.getElementById("nodes").replaceChildren(...state.nodes.map(card));
  document.getElementById("count").textContent = `${state.up} of ${state.total} nodes up`;
}
function renderUsage() {
  for (const td of document.querySelectorAll("[data-usage]")) {
    const [node, key] = td.dataset.usage.split(/\/(.*)/s);
    const v = (usage[node] || {})[key];
    td.textContent = v ? `${cpuText(v[0])} · ${memText(v[1])}` : "-";
  }
}
function live(now) {
  skew = now - Date.now() / 1000; lastEvent = Date.now();
  const c = document.getElementById("conn"); c.textContent = "live"; c.classList.remove("down");
}
function connect() {
  if (source) source.close();
  lastEvent = Date.now();
  const es = source = new EventSource(`${API}/api/fleet/events`);
  es.addEventListener("fleet", ev => { state = JSON.parse(ev.data); live(state.now); render(); });
  es.addEventListener("usage", ev => { const d = JSON.parse(ev.data); usage = d.nodes; live(d.now); renderUsage(); });
  es.addEventListener("ping", ev => { const p = JSON.parse(ev.data); every = p.every || every; live(p.now); });
  es.onerror = () => { const c = document.getElementById("conn"); c.textContent = "reconnecting…"; c.classList.add("down"); };
}
setInterval(() => {
  if (Date.now() - lastEvent > 3 * every * 1000) connect();
  document.getElementById("clock").textContent = new Date(Date.now() + skew * 1000).toLocaleString();
}, 1000);
connect();
