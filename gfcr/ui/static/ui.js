// gfcr ui: charts (inline SVG), the live feed (server-sent events), runs filter and overlay.
// Served from the package; no dependencies, no build step.
"use strict";
(function () {
  const dataTag = document.getElementById("page-data");
  const page = dataTag ? JSON.parse(dataTag.textContent) : {};
  const COLOURS = ["#1f6feb", "#d9480f", "#2b8a3e", "#862e9c"];
  const SVGNS = "http://www.w3.org/2000/svg";

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVGNS, name);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : (+v.toPrecision(3)).toString();
  }

  function chart(name, runs) {
    const W = 320, H = 170, L = 46, R = 8, T = 20, B = 22;
    let xs = [], ys = [];
    for (const r of runs) {
      const s = r.data.series[name] || [];
      r.data.steps.forEach((step, i) => { if (s[i] !== null && s[i] !== undefined) { xs.push(step); ys.push(s[i]); } });
    }
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.metric = name;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "plot" }, box);
    el("text", { x: 4, y: 13, class: "title" }, svg).textContent = name;
    if (!xs.length) { el("text", { x: W / 2, y: H / 2, class: "empty", "text-anchor": "middle" }, svg).textContent = "no data"; return box; }
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
    const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const py = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }, svg);
    el("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }, svg);
    el("text", { x: L - 3, y: T + 4, "text-anchor": "end", class: "tick" }, svg).textContent = fmt(y1);
    el("text", { x: L - 3, y: H - B, "text-anchor": "end", class: "tick" }, svg).textContent = fmt(y0);
    el("text", { x: L, y: H - 6, class: "tick" }, svg).textContent = x0;
    el("text", { x: W - R, y: H - 6, "text-anchor": "end", class: "tick" }, svg).textContent = "step " + x1;
    runs.forEach((r, k) => {
      const s = r.data.series[name] || [];
      const pts = [];
      r.data.steps.forEach((step, i) => { if (s[i] !== null && s[i] !== undefined) pts.push([step, s[i]]); });
      el("polyline", { points: pts.map(([x, y]) => `${px(x)},${py(y)}`).join(" "), class: "data", stroke: COLOURS[k % 4] }, svg);
      for (const [x, y] of pts) {
        const a = el("a", { href: `/runs/${encodeURIComponent(r.id)}/rollouts?step=${x}` }, svg);
        const c = el("circle", { cx: px(x), cy: py(y), r: 3, fill: COLOURS[k % 4], class: "point", "data-step": x }, a);
        el("title", {}, c).textContent = `${r.id} step ${x}: ${fmt(y)}`;
      }
    });
    return box;
  }

  async function drawCharts(source) {
    const box = document.getElementById("charts");
    if (!box || !page.runs) return;
    const resp = await fetch("/api/series?source=" + (source || "all") + "&runs=" + page.runs.map(encodeURIComponent).join(","));
    const got = await resp.json();
    if (got.error) { box.textContent = got.error; return; }
    const runs = page.runs.map((id) => ({ id: id, data: got[id] || { steps: [], series: {} } }));
    const names = page.series.filter((n) => runs.some((r) => n in r.data.series));
    box.replaceChildren(...names.map((n) => chart(n, runs)));
    if (runs.length > 1) {
      const legend = document.createElement("p");
      legend.innerHTML = runs.map((r, k) => `<span style="color:${COLOURS[k % 4]}">■ ${r.id.replace(/[<&]/g, "")}</span>`).join(" ");
      box.prepend(legend);
    }
    box.dataset.steps = runs.map((r) => r.data.steps.length).join(",");
    box.dataset.source = source || "all";
  }

  async function replace(id, url) {
    const node = document.getElementById(id);
    if (!node) return;
    const resp = await fetch(url);
    if (resp.ok) node.innerHTML = await resp.text();
  }

  function live(url, onChange) {
    if (!window.EventSource) return;
    const badge = document.getElementById("live");
    const source = new EventSource(url);
    source.addEventListener("marker", (ev) => {
      const m = JSON.parse(ev.data);
      if (badge) badge.textContent = m && m.error ? "live feed: " + m.error : (m && m.status ? "live · " + m.status + (m.last_step !== null && m.last_step !== undefined ? " · step " + m.last_step : "") : "live");
      onChange(m);  // the first event too: the page may have been rendered before it
      if (m && m.status && m.status !== "running") { if (badge) badge.textContent = "run " + m.status; }
    });
    source.onerror = () => { if (badge) badge.textContent = "live feed lost; retrying"; };
  }

  function runsPage() {
    const filter = document.getElementById("run-filter");
    const button = document.getElementById("overlay");
    const apply = () => {
      const q = (filter.value || "").toLowerCase();
      document.querySelectorAll("#runs-body tr").forEach((tr) => { tr.style.display = tr.textContent.toLowerCase().includes(q) ? "" : "none"; });
    };
    const picked = () => [...document.querySelectorAll("input.pick:checked")].map((c) => c.value);
    const update = () => { const n = picked().length; button.disabled = n < 2 || n > 4; };
    filter.addEventListener("input", apply);
    document.addEventListener("change", (ev) => { if (ev.target.classList.contains("pick")) update(); });
    button.addEventListener("click", () => { location.href = "/compare?runs=" + picked().map(encodeURIComponent).join(","); });
    live("/events", async () => {
      const keep = new Set(picked());
      const resp = await fetch("/fragment/runs");
      if (!resp.ok) return;
      const tmp = document.createElement("div");
      tmp.innerHTML = await resp.text();
      document.getElementById("runs-body").replaceWith(tmp.querySelector("#runs-body"));
      document.querySelectorAll("input.pick").forEach((c) => { c.checked = keep.has(c.value); });
      apply(); update();
    });
  }

  function runPage() {
    const run = encodeURIComponent(page.runs[0]);
    drawCharts("steps").then(() => drawCharts("all"));  // the steps table's first, then the store's
    live("/events?run=" + run, async () => {
      await replace("run-head", `/fragment/runs/${run}/head`);
      await replace("run-steps", `/fragment/runs/${run}/steps`);
      await drawCharts("steps");  // at once; the store's per-rollout figures follow
      await drawCharts("all");
    });
  }

  document.querySelectorAll(".lazy[data-src]").forEach((node) => {
    fetch(node.dataset.src).then((r) => r.text()).then((t) => { node.innerHTML = t; node.classList.remove("lazy"); });
  });
  if (page.page === "runs") runsPage();
  else if (page.page === "run") runPage();
  else if (page.page === "compare") drawCharts("steps").then(() => drawCharts("all"));
})();
