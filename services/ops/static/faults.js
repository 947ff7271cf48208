// podvisor dashboard: the faults panel (issue 28). Lists the faults in force (GET /api/faults),
// injects one from the form (POST /api/faults: the `fault-inject` request) and clears one or
// all (POST /api/faults/clear). While faults are in force the list is fetched every 5 s (they
// end by themselves); with none, only on load, after an action, and when the page is shown.
"use strict";
let faultTimer = null;

function faultText(spec) {
  const skip = new Set(["kind", "target", "for"]);
  const parts = Object.entries(spec).filter(([k, v]) => !skip.has(k) && v !== "" && v !== 0
    && !(Array.isArray(v) && !v.length) && !(k === "rate" && v === 1))
    .map(([k, v]) => `${k}=${Array.isArray(v) ? v.join(",") : v}`);
  return `${spec.kind} ${spec.target} ${parts.join(" ")}`;
}

async function faultCall(path, body) {
  const r = await fetch(`${API}${path}`, body === undefined ? {} : { method: "POST",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const text = await r.text();
  let doc = null;
  try { doc = JSON.parse(text); } catch (e) { doc = { faultString: `HTTP ${r.status}` }; }
  if (!r.ok) { toast(doc.faultString || `HTTP ${r.status}`); return null; }
  return doc;
}

async function refreshFaults() {
  const doc = await faultCall("/api/faults");
  if (!doc) return;
  const body = document.querySelector("#faultlist tbody");
  body.replaceChildren(...doc.faults.map(f => el("tr", {},
    el("td", {}, f.id), el("td", {}, faultText(f.spec)),
    el("td", {}, f.expires == null ? "until cleared" : new Date(f.expires * 1000).toLocaleTimeString()),
    el("td", {}, el("button", { onclick: async () => {
      await faultCall("/api/faults/clear", { id: f.id }); refreshFaults(); } }, "clear")))));
  clearTimeout(faultTimer);
  if (doc.faults.length) faultTimer = setTimeout(refreshFaults, 5000);
}

document.getElementById("faultform").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const form = new FormData(ev.target);
  const req = { kind: form.get("kind"), target: form.get("target") };
  if (form.get("action")) req.action = form.get("action");
  for (const k of ["delay", "for"]) if (form.get(k)) req[k] = Number(form.get(k));
  const done = await faultCall("/api/faults", req);
  if (done) toast(`injected ${done.id}: ${faultText(done.spec)}`);
  refreshFaults();
});
document.getElementById("faultclearall").addEventListener("click", async () => {
  await faultCall("/api/faults/clear", {}); refreshFaults();
});
document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshFaults(); });
refreshFaults();
