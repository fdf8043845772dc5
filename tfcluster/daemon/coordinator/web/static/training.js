/* tfcluster dashboard: training as it happens. Part of tfcluster, Apache License 2.0.
 *
 * A job's scalar curves (every tag its tasks write to their summaries: one chart per tag, a line per task) and
 * its tasks' CPU, memory and GPU use over time, redrawn on each refresh of the job page; and the sweeps page. Charts are
 * drawn as SVG here, as app.js draws the evaluation charts, with the helpers app.js defines (el, api, number...).
 */
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#2f6fdf", "#c93434", "#1f8a4c", "#b7791f", "#7b4fd0", "#0f8b8d", "#d04f9a", "#5a6275"];

// series: [{name, points: [[x, y], ...]}]; label(x) names an x on the axis; each point's x is in data-<xName>.
function multiLineChart(series, label, xName = "step") {
  const W = 400, H = 190, left = 56, right = 10, top = 10, bottom = 26;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  const all = series.flatMap(s => s.points).filter(p => p[1] !== null);
  if (!all.length) return svg;
  let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
  let y0 = Math.min(...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
  const x = v => left + (v - x0) / (x1 - x0) * (W - left - right);
  const y = v => top + (1 - (v - y0) / (y1 - y0)) * (H - top - bottom);
  add("line", {class: "axis", x1: left, y1: H - bottom, x2: W - right, y2: H - bottom});
  add("line", {class: "axis", x1: left, y1: top, x2: left, y2: H - bottom});
  for (const v of [y0, (y0 + y1) / 2, y1]) add("text", {x: left - 6, y: y(v) + 3, "text-anchor": "end"}, number(v));
  add("text", {x: x(x0), y: H - 8, "text-anchor": "start"}, label(x0));
  add("text", {x: x(x1), y: H - 8, "text-anchor": "end"}, label(x1));
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const shown = s.points.filter(p => p[1] !== null);
    add("polyline", {class: "series", stroke: colour, "data-run": s.name,
                     points: shown.map(p => `${x(p[0])},${y(p[1])}`).join(" ")});
    for (const p of shown) {
      add("circle", {class: "point", cx: x(p[0]), cy: y(p[1]), r: 1.8, fill: colour, "data-run": s.name,
                     [`data-${xName}`]: p[0]}).append(Object.assign(document.createElementNS(SVG, "title"),
                                                           {textContent: `${s.name} ${label(p[0])}: ${number(p[1])}`}));
    }
  });
  return svg;
}

function legend(names) {
  return el("div", {class: "legend"}, names.map((name, i) => el("span", {class: `key key-${i % COLOURS.length}`}, name)));
}

function chartPanel(attrs, title, series, label, xName) {
  return el("div", Object.assign({class: "panel chart"}, attrs), el("h3", {}, title),
            multiLineChart(series, label, xName), series.length > 1 ? legend(series.map(s => s.name)) : "");
}

// ---- a job's scalar curves and usage (drawn by jobView in app.js on each refresh) --------------------

async function drawScalars(container, id) {
  const doc = await api(`/api/jobs/${encodeURIComponent(id)}/scalars`);
  const byTag = new Map();
  for (const s of doc.series) {
    if (!byTag.has(s.tag)) byTag.set(s.tag, []);
    byTag.get(s.tag).push({name: s.run, points: s.points.map(p => [p[0], p[1]]), stride: s.stride});
  }
  const panels = [...byTag.entries()].map(([tag, series]) => chartPanel({"data-tag": tag},
    tag + (series.some(s => s.stride > 1) ? " (thinned)" : ""), series, step => `step ${Math.round(step)}`));
  const notes = doc.problems.map(p => el("p", {class: "error"}, p));
  container.replaceChildren(...(panels.length ? panels
    : [el("p", {class: "muted"}, "No scalars yet: tasks write them as TensorBoard summaries to $TFCLUSTER_SUMMARY_DIR.")]),
    ...notes);
}

async function drawUsage(container, id) {
  const doc = await api(`/api/jobs/${encodeURIComponent(id)}/usage`);
  const tasks = doc.tasks.filter(t => t.points.length);
  if (!tasks.length) {
    container.replaceChildren(el("p", {class: "muted"}, "No usage yet: running tasks report it with their heartbeats."));
    return;
  }
  const latest = Math.max(...tasks.flatMap(t => t.points.map(p => p[0])));
  const age = t => `-${ago(Math.max(0, latest - t))}`;
  const series = column => tasks.map(t => ({name: t.task, points: t.points.map(p => [p[0], p[column]])}));
  const gib = series(2).map(s => ({name: s.name, points: s.points.map(p => [p[0], p[1] / 2 ** 30])}));
  // GPU use where the agents read their GPUs through NVML (null elsewhere, and for tasks without GPUs)
  const gpu = series(3).map(s => ({name: s.name, points: s.points.filter(p => p[1] !== null && p[1] !== undefined)
                                                               .map(p => [p[0], p[1] * 100])}))
                       .filter(s => s.points.length);
  container.replaceChildren(chartPanel({"data-usage": "cpu"}, "CPU (cores in use)", series(1), age, "time"),
                            chartPanel({"data-usage": "memory"}, "memory (GiB resident)", gib, age, "time"),
                            ...(gpu.length ? [chartPanel({"data-usage": "gpu"}, "GPU utilisation (%)", gpu, age,
                                                         "time")] : []));
}

// ---- sweeps (/sweeps) --------------------------------------------------------------------------------

function sweepsView() {
  document.getElementById("nav-sweeps").classList.add("active");
  const body = el("tbody");
  replace(el("h1", {}, "Sweeps"),
          el("table", {id: "sweeps"}, el("thead", {}, el("tr", {}, ["sweep", "name", "owner", "state", "trials done",
            "best", "trials"].map(h => el("th", {}, h)))), body));
  every(async () => {
    await refreshSummary();
    const page = await api("/api/sweeps");
    body.replaceChildren(...page.sweeps.map(s => el("tr", {"data-sweep": s.id}, el("td", {}, s.id), el("td", {}, s.name),
      el("td", {}, s.owner || "-"), el("td", {}, badge(s.state), s.message ? el("div", {class: "muted"}, s.message) : ""),
      el("td", {class: "done"}, `${s.done}/${s.total}`),
      el("td", {class: "best"}, s.best === null ? "-" : `${s.metric} ${number(s.best)} (${s.goal})`),
      el("td", {class: "trials"}, s.trials.map(t => el("div", {"data-trial": t.index}, `#${t.index} `,
        t.job && t.kept ? jobLink(t.job) : (t.job || "not started"), t.state ? " " : "", t.state ? badge(t.state) : "",
        t.best === null || t.best === undefined ? "" : ` ${number(t.best)}`, t.stopped_early ? " (stopped early)" : ""))))));
    if (!page.sweeps.length) body.append(el("tr", {}, el("td", {colspan: 7, class: "muted"}, "No sweeps.")));
  });
}
