// product_crawl dashboard: plain JavaScript, no build step, no library, nothing loaded from elsewhere.
// Every piece of text from the deployment goes into the page as text (textContent), never as HTML.
"use strict";

const S = {
  status: null, samples: [], lastT: null, session: null, view: "cluster", cell: null, product: null,
  items: {product: "", site: "", q: ""}, sites: [], refresh: 2, timer: null, busy: false,
};
const SITE_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
  "#9c755f", "#bab0ac"];
const NODE_COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285", "#5f3dc4", "#e67700"];
const SVGNS = "http://www.w3.org/2000/svg";

// --- DOM helpers ----------------------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === "style") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false)
    el.append(c instanceof Node ? c : String(c));
  return el;
}
function s(tag, attrs) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}
function fmt(x, d = 2) { return x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d); }
function int(x) { return x === null || x === undefined ? "–" : Number(x).toLocaleString("en"); }
function clock(t) { return t ? new Date(t * 1000).toLocaleTimeString([], {hour12: false}) : "–"; }
function ago(now, t) {
  if (!t || !now) return "never";
  const d = Math.max(0, now - t);
  return d < 90 ? `${d.toFixed(0)} s ago` : d < 5400 ? `${(d / 60).toFixed(0)} min ago` : `${(d / 3600).toFixed(1)} h ago`;
}
function empty(...parts) { return h("div", {class: "empty"}, ...parts); }
function table(headers, rows, attrs) {
  return h("div", {class: "scroll"}, h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((x) => typeof x === "string" ? h("th", {}, x) : x))),
    h("tbody", {}, rows)));
}
function th(text, cls) { return h("th", {class: cls}, text); }
function swatch(color) { const e = h("span", {class: "swatch"}); e.style.background = color; return e; }
function siteColor(site) {
  let i = S.sites.indexOf(site);
  if (i < 0) { S.sites.push(site); i = S.sites.length - 1; }
  return SITE_COLORS[i % SITE_COLORS.length];
}
function site(name) { return h("span", {class: "site"}, swatch(siteColor(name)), name); }
function nodeColor(id) {
  const ids = (S.status?.nodes || []).map((n) => n.id);
  const i = Math.max(0, ids.indexOf(id));
  return NODE_COLORS[i % NODE_COLORS.length];
}
// Completion 0..1 -> red, yellow, green (the same scale as the legend).
function heat(c) {
  const stops = [[215, 48, 39], [254, 224, 139], [26, 152, 80]];
  const x = Math.max(0, Math.min(1, c)) * 2, i = Math.min(1, Math.floor(x)), f = x - i;
  const rgb = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f));
  return {bg: `rgb(${rgb.join(",")})`, ink: c < 0.2 || c > 0.8 ? "#fff" : "#1d2330"};
}

// --- charts: lines over time, axes with units ----------------------------------------------------------------
function niceStep(span, n) {
  const raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw || 1)));
  return [1, 2, 5, 10].map((m) => m * p).find((x) => x >= raw) || raw;
}
function lineChart(series, {unit, yMax, title}) {
  // Scaled uniformly (text keeps its shape): as wide as a phone's screen, at most 640 units.
  const W = Math.max(300, Math.min(640, window.innerWidth - 60)), H = 200, L = 52, R = 10, T = 18, B = 30;
  const svg = s("svg", {class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img"});
  const pts = series.flatMap((x) => x.points);
  if (!pts.length) return empty("No history yet: samples are taken every few seconds while the dashboard runs.");
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]), t0 + 1);
  const peak = Math.max(...pts.map((p) => p[1]));
  const top = yMax ?? (peak > 0 ? peak * 1.1 : 1);
  const X = (t) => L + (t - t0) / (t1 - t0) * (W - L - R), Y = (v) => H - B - v / top * (H - T - B);
  const step = niceStep(top, 4);
  for (let v = 0; v <= top + 1e-9; v += step) {
    svg.append(s("line", {class: "grid", x1: L, x2: W - R, y1: Y(v), y2: Y(v)}));
    const label = s("text", {x: L - 6, y: Y(v) + 4, "text-anchor": "end"});
    label.textContent = step < 1 ? v.toFixed(step < 0.1 ? 2 : 1) : Math.round(v).toLocaleString("en");
    svg.append(label);
  }
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (t1 - t0) * i / 4, label = s("text", {x: X(t), y: H - 12, "text-anchor": i ? (i === 4 ? "end" : "middle") : "start"});
    label.textContent = clock(t);
    svg.append(label);
  }
  svg.append(s("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
  const yl = s("text", {x: 4, y: 12});
  yl.textContent = unit;
  const xl = s("text", {x: W - R, y: H - 1, "text-anchor": "end"});
  xl.textContent = "time (local)";
  svg.append(yl, xl);
  for (const x of series) {
    if (!x.points.length) continue;
    const d = x.points.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join("");
    svg.append(s("path", {d, fill: "none", stroke: x.color, "stroke-width": x.width || 2,
      "vector-effect": "non-scaling-stroke"}));
  }
  const legend = h("div", {class: "legend"}, series.map((x) => h("span", {}, swatch(x.color), x.name)));
  return h("div", {class: "panel"}, h("h3", {}, title), svg, legend);
}

// --- API ------------------------------------------------------------------------------------------------------
function headers(extra) {
  const hs = Object.assign({Accept: "application/json"}, extra || {});
  const token = sessionStorage.getItem("pc-token");
  if (token) hs.Authorization = "Bearer " + token;
  return hs;
}
async function api(path, opts) {
  const r = await fetch(path, Object.assign({headers: headers(opts?.headers), cache: "no-store"}, opts || {},
    {headers: headers(opts?.headers)}));
  let body = null;
  try { body = await r.json(); } catch (e) { body = {error: `HTTP ${r.status}`}; }
  if (!r.ok) { const err = new Error(body?.error || `HTTP ${r.status}`); err.status = r.status; throw err; }
  return body;
}
function showError(msg) {
  const e = document.getElementById("error");
  e.hidden = !msg;
  e.textContent = msg || "";
}

// --- session: read-only, or an operator --------------------------------------------------------------------------
async function loadSession() {
  try {
    S.session = await api("/api/session");
  } catch (e) {
    if (e.status === 401 && sessionStorage.getItem("pc-token")) {
      sessionStorage.removeItem("pc-token");
      S.session = await api("/api/session");
      S.session.refused = true;
    } else throw e;
  }
  S.refresh = S.session.refresh || 2;
  document.getElementById("refresh").textContent = S.refresh;
  renderSession();
}
function renderSession() {
  const box = document.getElementById("session"), ss = S.session;
  box.replaceChildren();
  if (!ss.actions) { box.append(h("span", {class: "muted", title: "set PC_DASHBOARD_TOKEN to allow actions"}, "read-only")); return; }
  if (ss.operator) {
    box.append(h("span", {}, `operator: ${ss.operator}`));
    if (sessionStorage.getItem("pc-token"))
      box.append(h("button", {on: {click: () => { sessionStorage.removeItem("pc-token"); loadSession().then(render); }}}, "Sign out"));
    return;
  }
  if (ss.refused) box.append(h("span", {class: "pill bad", id: "refused"}, "token refused"));
  if (ss.methods.includes("token")) {
    const input = h("input", {type: "password", id: "token", placeholder: "operator token", autocomplete: "off"});
    const go = () => { sessionStorage.setItem("pc-token", input.value.trim()); loadSession().then(render); };
    input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") go(); });
    box.append(input, h("button", {id: "sign-in", on: {click: go}}, "Sign in"));
  }
  if (ss.methods.includes("basic")) box.append(h("a", {class: "button", href: "/login"}, "Sign in with password"));
}
function canAct() { return Boolean(S.session?.actions && S.session?.operator); }

// --- polling -------------------------------------------------------------------------------------------------------
async function tick() {
  if (S.busy) return;
  S.busy = true;
  try {
    // The first load takes the last hour at 5 s samples; then only what is new.
    const since = S.lastT === null ? "?limit=720" : `?since=${S.lastT}`;
    const [status, hist] = await Promise.all([api("/api/status"), api("/api/history" + since)]);
    S.status = status;
    if (S.lastT === null || (hist.samples.length && hist.samples[0].t < (S.samples.at(-1)?.t ?? 0))) S.samples = [];
    S.samples.push(...hist.samples);
    if (S.samples.length) S.lastT = S.samples.at(-1).t;
    for (const site of Object.keys(status.completion || {}).sort()) siteColor(site);
    showError(null);
    const deadChanged = S.dead !== undefined && S.dead !== (status.queues?.dead ?? 0);
    S.dead = status.queues?.dead ?? 0;
    renderHeader();
    // Views with forms (items) or open details (dead letters) redraw only when their data changed.
    if (["cluster", "matrix", "products"].includes(S.view) || (S.view === "deadletters" && deadChanged)) render();
  } catch (e) {
    showError(`Cannot read the deployment: ${e.message}. Retrying every ${S.refresh} s.`);
  } finally {
    S.busy = false;
  }
}
function renderHeader() {
  const st = S.status, q = st.queues || {};
  const alive = (st.nodes || []).filter((n) => n.alive).length;
  document.getElementById("summary").textContent =
    `prefix ${st.prefix} · leader ${st.leader || "none"} · nodes ${alive}/${(st.nodes || []).length} alive · ` +
    `waiting ${q.waiting ?? 0} · leased ${q.leased ?? 0} · updated ${clock(st.time)}`;
  document.getElementById("dead-count").textContent = q.dead ? String(q.dead) : "";
}

// --- views ---------------------------------------------------------------------------------------------------------
function rates() {
  const out = {pages: [], items: []}, xs = S.samples;
  for (let i = 1; i < xs.length; i++) {
    const dt = xs[i].t - xs[i - 1].t;
    if (dt <= 0) continue;
    out.pages.push([xs[i].t, Math.max(0, (xs[i].pages - xs[i - 1].pages) / dt)]);
    if (xs[i].items !== undefined && xs[i - 1].items !== undefined)
      out.items.push([xs[i].t, Math.max(0, (xs[i].items - xs[i - 1].items) / dt)]);
  }
  return out;
}
function card(label, value, id) { return h("div", {class: "card", id}, h("div", {class: "label"}, label), h("div", {class: "value"}, value)); }

function viewCluster(root) {
  const st = S.status, q = st.queues || {}, nodes = st.nodes || [], r = rates();
  const last = (xs) => (xs.length ? fmt(xs.at(-1)[1], 1) : "–");
  const crawl = Object.values(q.crawl || {}).reduce((a, b) => a + b, 0);
  root.append(h("div", {class: "cards"},
    card("leader", st.leader || "none"), card("nodes alive", `${nodes.filter((n) => n.alive).length} / ${nodes.length}`),
    card("pages / s", last(r.pages)), card("items / s", last(r.items)),
    card("waiting", int(q.waiting)), card("in crawl queues", int(crawl)), card("leased", int(q.leased)),
    card("virtual", int(q.virtual)), card("dead letters", int(q.dead))));
  const series = (key, name, color) => ({name, color, points: S.samples.map((x) => [x.t, x.queues?.[key] ?? 0])});
  root.append(h("div", {class: "grid2"},
    lineChart([series("waiting", "waiting", "#4e79a7"), series("crawl", "crawl queues", "#f28e2b"),
      series("leased", "leased", "#59a14f"), series("virtual", "virtual", "#b07aa1"), series("dead", "dead", "#e15759")],
    {unit: "subtasks", title: "Queue depths"}),
    lineChart([{name: "pages / s", color: "#2f6fde", points: r.pages}, {name: "items / s", color: "#2b8a3e", points: r.items}],
      {unit: "per second", title: "Throughput"}),
    lineChart([["moved_out", "moved", "#4e79a7"], ["modified", "modified", "#f28e2b"], ["recalled", "recalled", "#e15759"],
      ["dead", "dead-lettered", "#1d2330"]].map(([c, name, color]) => ({name, color, points: S.samples.map((x) =>
      [x.t, Object.values(x.counts || {}).reduce((a, n) => a + (n[c] || 0), 0)])})),
    {unit: "subtasks (total)", title: "What the control did: moved, modified, recalled"})));
  root.append(h("h2", {}, "Nodes"));
  if (!nodes.length) {
    root.append(empty("No node has registered yet. Start one: ",
      h("code", {}, "scrapy crawl search -s SCHEDEXT_NODE_ID=node1"), " (same REDIS_URL and SCHEDEXT_PREFIX)."));
    return;
  }
  root.append(table(["node", "state", "last heartbeat", "address", th("leases held", "num"), th("crawl queue", "num"),
    th("moved out", "num"), th("moved in", "num"), th("modified", "num"), th("recalled", "num"), th("dead", "num")],
  nodes.map((n) => h("tr", {"data-node": n.id},
    h("td", {}, swatch(nodeColor(n.id)), n.id),
    h("td", {}, h("span", {class: "pill " + (n.alive ? "ok" : "bad")}, n.alive ? "alive" : "dead")),
    h("td", {}, ago(st.time, n.last_seen)), h("td", {}, n.address || "–"),
    h("td", {class: "num", title: (n.subtasks || []).join(", ")}, (n.subtasks || []).length),
    h("td", {class: "num"}, n.crawl_queue ?? 0),
    ...["moved_out", "moved_in", "modified", "recalled", "dead"].map((c) => h("td", {class: "num"}, n.counts?.[c] ?? 0))))));
}

function viewMatrix(root) {
  const st = S.status, comp = st.completion || {}, sites = Object.keys(comp).sort();
  const nodes = [...new Set([...(st.nodes || []).map((n) => n.id), ...sites.flatMap((x) => Object.keys(comp[x]))])].sort();
  root.append(h("h2", {}, "Completion per site and node"),
    h("p", {class: "muted"}, "Moving estimate of results collected / results the engine offered (0–1), and the number of runs. Click a cell for its history and seconds per page."));
  if (!sites.length) {
    root.append(empty("No run has finished yet. Inject products (", h("code", {}, "scrapy inject --product NAME"),
      ") and start nodes and a control; cells fill as runs are reported."));
    return;
  }
  const rows = sites.map((x) => h("tr", {}, h("th", {}, site(x)), nodes.map((n) => {
    const c = comp[x][n];
    if (!c) return h("td", {class: "cell empty-cell", "data-site": x, "data-node": n, title: "no run yet"}, "–");
    const sel = S.cell && S.cell.site === x && S.cell.node === n;
    const pick = () => { S.cell = {site: x, node: n}; render(); };
    const td = h("td", {class: "cell" + (sel ? " sel" : ""), "data-site": x, "data-node": n, tabindex: 0,
      "aria-label": `${x} on ${n}: completion ${fmt(c.completion)}, ${c.runs} runs`,
      on: {click: pick, keydown: (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); pick(); } }}},
    h("div", {class: "c"}, fmt(c.completion)), h("div", {class: "r"}, `${c.runs} run${c.runs === 1 ? "" : "s"}`));
    if (c.completion !== null && c.completion !== undefined) {
      const {bg, ink} = heat(c.completion);
      td.style.background = bg; td.style.color = ink;
    }
    return td;
  })));
  root.append(h("div", {class: "panel"}, table(["site", ...nodes.map((n) => th(n, "num"))], rows, {class: "heat", id: "matrix"}),
    h("div", {class: "legend"}, h("span", {}, "0 ", h("span", {class: "scale"}), " 1"), h("span", {}, "– : no run yet"))));
  if (!S.cell || !comp[S.cell.site]) return;
  const {site: cs, node: cn} = S.cell, c = comp[cs][cn] || {};
  const hist = nodes.map((n) => ({name: n, color: nodeColor(n), width: n === cn ? 4 : 1.5,
    points: S.samples.filter((x) => x.completion?.[cs]?.[n] !== undefined && x.completion[cs][n] !== null)
      .map((x) => [x.t, x.completion[cs][n]])}));
  const spp = Object.entries(st.seconds_per_page || {}).filter(([, bySite]) => bySite[cs] && cn in bySite[cs])
    .map(([p, bySite]) => h("tr", {}, h("td", {}, p), h("td", {class: "num"}, fmt(bySite[cs][cn], 3))));
  root.append(h("div", {class: "grid2", id: "cell-detail"},
    lineChart(hist, {unit: "completion (0–1)", yMax: 1, title: `Completion on ${cs} over time (${cn} bold)`}),
    h("div", {class: "panel"}, h("h3", {}, site(cs), ` × ${cn}`),
      table(["figure", th("value", "num")], [
        ["moving completion", fmt(c.completion, 3)], ["collected / offered, all runs", fmt(c.ratio, 3)],
        ["runs (failed)", `${c.runs ?? 0} (${c.failures ?? 0})`], ["results offered", int(c.offered)],
        ["results collected", int(c.collected)], ["pages", int(c.pages)], ["seconds per page (site)", fmt(c.seconds_per_page, 3)],
      ].map(([a, b]) => h("tr", {}, h("td", {}, a), h("td", {class: "num"}, b)))),
      h("h3", {}, "Seconds per page per product"),
      spp.length ? table(["product", th("s / page", "num")], spp) : empty("No successful run of this node on this site yet."))));
}

async function viewProducts(root) {
  const data = await api("/api/products" + (S.product ? `?product=${encodeURIComponent(S.product)}` : ""));
  const prods = Object.keys(data.products || {}).sort();
  root.append(h("h2", {}, "Products"));
  if (!prods.length) {
    root.append(empty("No product yet. Inject one: ", h("code", {}, "scrapy inject --product 特仑苏"), " (a control splits it into tasks)."));
    return;
  }
  root.append(table(["product", "tasks done / total", th("pages", "num"), th("results collected", "num"), th("items stored", "num"), ""],
    prods.map((p) => {
      const x = data.products[p], share = x.tasks ? x.done / x.tasks : 0, bar = h("span");
      bar.style.width = `${(share * 100).toFixed(0)}%`;
      const pick = () => { S.product = p; render(); };
      return h("tr", {class: "clickable" + (p === S.product ? " selected" : ""), "data-product": p, tabindex: 0,
        on: {click: pick, keydown: (ev) => { if (ev.key === "Enter") pick(); }}},
      h("td", {}, p), h("td", {}, h("div", {class: "bar", title: `${x.done} of ${x.tasks}`}, bar), `${x.done} / ${x.tasks}`),
      h("td", {class: "num"}, int(x.pages)), h("td", {class: "num"}, int(x.collected)),
      h("td", {class: "num"}, data.items ? int(data.items[p] ?? 0) : "–"), h("td", {}, "details ›"));
    })));
  if (!S.product || !data.tasks) return;
  const ex = (f) => h("a", {class: "button", href: `/api/export?product=${encodeURIComponent(S.product)}&format=${f}`, download: ""}, `Export ${f.toUpperCase()}`);
  root.append(h("h2", {}, `${S.product}: tasks `, ex("jsonl"), " ", ex("csv")));
  root.append(data.tasks.length ? table(["site", "engine", th("page limit", "num"), th("time limit (s)", "num"), h("th", {class: "num", title: "pages handed to subtasks so far (crawled, or out now) / the results' page count, once a run saw it"}, "pages given / total"),
    th("runs", "num"), th("collected", "num"), "last node", "state"],
  data.tasks.map((t) => h("tr", {}, h("td", {}, site(t.site)), h("td", {}, t.engine || "–"), h("td", {class: "num"}, t.page_limit ?? "–"),
    h("td", {class: "num"}, fmt(t.time_limit, 1)), h("td", {class: "num"}, `${t.next_page ?? 0} / ${t.total_pages ?? "?"}`),
    h("td", {class: "num"}, t.subtasks ?? 0), h("td", {class: "num"}, int(t.collected)), h("td", {}, t.last_node || "–"),
    h("td", {}, t.done ? h("span", {class: "pill ok"}, "done") : "running")))) : empty("No task of this product is recorded yet."));
  root.append(h("h3", {}, "Recent runs: the limits each subtask had, as the modification strategy set them"));
  root.append(data.runs.length ? table(["ended", "node", "site", "outcome", th("first page", "num"), th("page limit", "num"),
    th("time limit (s)", "num"), th("pages", "num"), th("collected / offered", "num"), th("s / page", "num")],
  data.runs.map((r) => h("tr", {}, h("td", {}, clock(r.ended)), h("td", {}, r.node), h("td", {}, site(r.site)),
    h("td", {title: r.reason || ""}, h("span", {class: "pill " + (r.outcome === "failed" ? "bad" : "ok")}, r.outcome)),
    h("td", {class: "num"}, r.first_page), h("td", {class: "num"}, r.page_limit), h("td", {class: "num"}, fmt(r.time_limit, 1)),
    h("td", {class: "num"}, r.pages), h("td", {class: "num"}, `${r.collected} / ${r.offered}`),
    h("td", {class: "num"}, r.pages ? fmt((r.ended - r.started) / r.pages, 3) : "–")))) : empty("No run of this product yet."));
}

async function act(action, id) {
  if (!window.confirm(`${action === "requeue" ? "Requeue" : "Drop"} dead-letter entry ${id}?`)) return;
  try {
    const r = await api(`/api/deadletter/${action}`, {method: "POST", body: JSON.stringify({id}),
      headers: {"Content-Type": "application/json", "X-CSRF-Token": S.session.csrf}});
    showError(null);
    flash(`${action === "requeue" ? "Requeued" : "Dropped"} ${r.id}${r.to ? " into " + r.to : ""}.`);
  } catch (e) {
    showError(`${action} ${id} refused: ${e.message}`);
  }
  render();
}
function flash(msg) { S.flash = msg; }

async function viewDeadletters(root) {
  const data = await api("/api/deadletter");
  root.append(h("h2", {}, "Dead letters (manual handling)"));
  if (S.flash) { root.append(h("div", {class: "panel", id: "flash"}, S.flash)); S.flash = null; }
  if (!canAct()) root.append(h("p", {class: "muted", id: "read-only"}, S.session?.actions
    ? "Sign in (top right) to requeue or drop entries." : "Read-only: set PC_DASHBOARD_TOKEN (or PC_DASHBOARD_USER and PC_DASHBOARD_PASSWORD) for the dashboard to allow requeue and drop."));
  if (!data.entries.length) root.append(empty("The dead-letter list is empty: nothing waits for manual handling."));
  else root.append(table(["id", "kind", "reason", th("attempts", "num"), "last node", "at", "entry", ""],
    data.entries.map((e) => {
      const requeueable = (e.kind === "subtask" && e.subtask) || (e.kind === "virtual" && e.raw);
      return h("tr", {"data-id": e.id}, h("td", {}, e.id), h("td", {}, e.kind), h("td", {}, e.reason || "–"),
        h("td", {class: "num"}, e.attempts ?? "–"), h("td", {}, e.last_node || "–"), h("td", {}, clock(e.at)),
        h("td", {}, h("details", {}, h("summary", {}, "raw entry"), h("pre", {}, JSON.stringify(e, null, 2)))),
        h("td", {}, canAct() ? [
          requeueable ? h("button", {class: "primary requeue", on: {click: () => act("requeue", e.id)}}, "Requeue") : null, " ",
          h("button", {class: "danger drop", on: {click: () => act("drop", e.id)}}, "Drop")] : null));
    }), {id: "deadletters"}));
  root.append(h("h2", {}, "Recent failed runs (each one recalled by the control)"));
  root.append((data.failures || []).length ? table(["ended", "node", "site", "product", "reason", th("attempt", "num"), th("pages", "num")],
    data.failures.map((r) => h("tr", {}, h("td", {}, clock(r.ended)), h("td", {}, r.node), h("td", {}, site(r.site)),
      h("td", {}, r.group), h("td", {}, r.reason || "–"), h("td", {class: "num"}, r.attempt ?? 0), h("td", {class: "num"}, r.pages))), {id: "failures"})
    : empty("No failed run among the latest runs."));
  root.append(h("h2", {}, "Audit: who did what, and when"));
  root.append(data.audit.length ? table(["at", "who", "action", "entry", "kind", "into"],
    data.audit.map((a) => h("tr", {}, h("td", {}, new Date(a.at * 1000).toLocaleString([], {hour12: false})), h("td", {}, a.actor),
      h("td", {}, a.action), h("td", {}, a.id), h("td", {}, a.kind || "–"), h("td", {}, a.to || "–"))), {id: "audit"})
    : empty("No requeue or drop yet (from this page or `scrapy deadletter`)."));
}

async function viewItems(root) {
  const f = S.items, prods = Object.keys(S.status?.products || {}).sort(), sites = S.sites.slice().sort();
  const sel = (name, options, value) => h("select", {name}, h("option", {value: ""}, "all"),
    options.map((o) => h("option", {value: o, selected: o === value}, o)));
  const form = h("form", {class: "filters", on: {submit: (ev) => {
    ev.preventDefault();
    const fd = new FormData(ev.target);
    S.items = {product: fd.get("product"), site: fd.get("site"), q: fd.get("q")};
    render();
  }}},
  h("label", {}, "product", sel("product", prods, f.product)), h("label", {}, "site", sel("site", sites, f.site)),
  h("label", {}, "words in title or snippet", h("input", {name: "q", value: f.q, placeholder: "e.g. 质量"})),
  h("button", {class: "primary", type: "submit"}, "Search"),
  f.product ? [h("a", {class: "button", href: `/api/export?product=${encodeURIComponent(f.product)}&format=jsonl`, download: ""}, "Export JSONL"),
    h("a", {class: "button", href: `/api/export?product=${encodeURIComponent(f.product)}&format=csv`, download: ""}, "Export CSV")] : null);
  root.append(h("h2", {}, "Latest items"), form);
  const qs = new URLSearchParams({product: f.product, site: f.site, q: f.q, limit: "100"});
  const data = await api("/api/items?" + qs);
  if (!data.items.length) {
    root.append(empty(f.q || f.product || f.site ? "No item matches: try fewer words or all sites."
      : "No item is stored yet: items appear as nodes crawl (MongoDB collection of the deployment)."));
    return;
  }
  const link = (it) => /^https?:\/\//i.test(it.url || "") ? h("a", {href: it.url, target: "_blank", rel: "noopener noreferrer"}, it.title || it.url) : (it.title || "–");
  root.append(table(["crawled", "product", "site", "title and snippet", "node"],
    data.items.map((it) => h("tr", {}, h("td", {}, clock(it.crawled_at)), h("td", {}, it.product), h("td", {}, site(it.site)),
      h("td", {}, link(it), h("div", {class: "snippet"}, it.snippet || "")), h("td", {}, it.node_id || "–"))), {id: "items"}));
}

const VIEWS = {cluster: viewCluster, matrix: viewMatrix, products: viewProducts, deadletters: viewDeadletters, items: viewItems};
let renderSeq = 0;
async function render() {
  const seq = ++renderSeq, view = S.view;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === view);
  for (const v of document.querySelectorAll(".view")) v.classList.toggle("active", v.id === "view-" + view);
  if (!S.status) return;
  const root = h("div", {"data-ready": view});
  try {
    await VIEWS[view](root);
  } catch (e) {
    root.append(empty(`Cannot load this view: ${e.message}`));
  }
  if (seq === renderSeq) document.getElementById("view-" + view).replaceChildren(root);
}

function route() {
  const v = location.hash.slice(1);
  S.view = v in VIEWS ? v : "cluster";
  render();
}

async function main() {
  window.addEventListener("hashchange", route);
  try { await loadSession(); } catch (e) { showError(`Cannot reach the dashboard: ${e.message}`); }
  await tick();
  route();
  const loop = async () => { await tick(); S.timer = setTimeout(loop, S.refresh * 1000); };
  S.timer = setTimeout(loop, S.refresh * 1000);
}
main();
