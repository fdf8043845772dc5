/* tfcluster dashboard. Part of tfcluster, Apache License 2.0.
 *
 * Two small scripts, no libraries (clusters are often offline; nothing comes from a CDN): it picks the view from
 * the address, fetches one bounded page of the coordinator's JSON API, and fetches it again every few seconds.
 * The log view streams the task's log as it is written. training.js draws a job's curves and lists the sweeps.
 */
"use strict";

const REFRESH_MS = 2000;
const view = document.getElementById("view");
let timer = null;

// ---- helpers ---------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  if (!response.ok) throw new Error(`${response.status}: ${(await response.text()).trim()}`);
  return response.json();
}

function badge(state) { return el("span", {class: `state ${state}`}, state); }

function ago(seconds) {
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

function when(unix, now) { return unix ? `${ago(Math.max(0, now - unix))} ago` : "-"; }

function duration(job, now) {
  if (!job.created) return "-";
  return ago((job.finished || now) - job.created);
}

function number(value) {
  if (value === null || value === undefined) return "n/a";
  return Math.abs(value) >= 1000 || Number.isInteger(value) ? String(value) : value.toPrecision(4);
}

function jobLink(id) { return el("a", {href: `/jobs/${encodeURIComponent(id)}`}, id); }

// A name-prefix box and a state menu (its states come with the first summary: addStates); changing either loads
// the view again with them in its address.
function filters(params, what) {
  const name = el("input", {id: "filter-name", placeholder: `${what} name starts with…`, value: params.get("name") || ""});
  const state = el("select", {id: "filter-state"}, el("option", {value: ""}, "any state"));
  const apply = () => {
    const next = new URLSearchParams();
    if (name.value) next.set("name", name.value);
    if (state.value) next.set("state", state.value);
    location.search = next.toString();
  };
  name.addEventListener("change", apply);
  state.addEventListener("change", apply);
  return [name, state];
}

function addStates(select, states, params) {
  for (const s of states) select.append(el("option", {value: s, selected: params.get("state") === s}, s));
}

function replace(...nodes) { view.replaceChildren(...nodes); }

function showError(error) {
  const box = document.getElementById("load-error") || el("p", {id: "load-error", class: "error"});
  box.textContent = `Cannot reach the coordinator: ${error.message}`;
  if (!box.isConnected) view.prepend(box);
}

function every(refresh) {
  const run = () => refresh().then(() => {
    const box = document.getElementById("load-error");
    if (box) box.remove();
  }).catch(showError).finally(() => { timer = setTimeout(run, REFRESH_MS); });
  run();
}

// ---- header ----------------------------------------------------------------------------------------

let clockSkew = 0;  // the coordinator's clock minus this browser's: ages are computed on the coordinator's time

function now() { return Date.now() / 1000 + clockSkew; }

async function refreshSummary() {
  const s = await api("/api/summary");
  clockSkew = s.time - Date.now() / 1000;
  const nodes = s.nodes_by_state || {};
  const jobs = s.jobs_by_state || {};
  const chips = [
    el("span", {class: "chip", id: "nodes-ready"}, `${nodes.READY || 0} nodes ready`),
    nodes.LOST ? el("span", {class: "chip bad"}, `${nodes.LOST} lost`) : null,
    el("span", {class: "chip"}, `GPUs ${s.gpus_allocated}/${s.gpus_total} allocated`),
    el("span", {class: "chip"}, `${jobs.RUNNING || 0} running`),
    jobs.PENDING ? el("span", {class: "chip"}, `${jobs.PENDING} pending`) : null,
    s.insecure ? el("span", {class: "chip bad"}, "no TLS") : null,
  ];
  document.getElementById("summary").replaceChildren(...chips.filter(Boolean));
  document.getElementById("footer").textContent =
    `tfcluster ${s.version}${s.viewer ? ` · signed in as ${s.viewer}` : ""} · refreshed every ${REFRESH_MS / 1000} s`;
  return s;
}

// ---- the job list (/) ------------------------------------------------------------------------------

function jobsView(params) {
  document.getElementById("nav-jobs").classList.add("active");
  const [name, state] = filters(params, "job");
  const body = el("tbody");
  const pager = el("div", {class: "pager"});
  replace(el("h1", {}, "Jobs"), el("div", {class: "filters"}, name, state),
          el("table", {id: "jobs"}, el("thead", {}, el("tr", {}, ["job", "owner", "state", "strategy", "restarts", "tasks",
            "evaluation", "last failure / message", "started", "took"].map(h => el("th", {}, h)))), body), pager);
  every(async () => {
    const summary = await refreshSummary();
    if (state.options.length === 1) addStates(state, summary.job_states, params);
    const query = new URLSearchParams(params);
    const page = await api(`/api/jobs?${query}`);
    body.replaceChildren(...page.jobs.map(j => el("tr", {"data-job": j.id},
      // Another person's job has no page for a user: its id is not a link.
      el("td", {}, j.readable ? jobLink(j.id) : j.id), el("td", {class: "owner"}, j.owner || "-"),
      el("td", {}, badge(j.state)), el("td", {}, j.strategy),
      el("td", {}, j.restarts + (j.preemptions ? ` (+${j.preemptions} preempted)` : "")),
      el("td", {}, j.gpus ? `${j.tasks} (${j.gpus} GPUs)` : j.tasks),
      el("td", {}, j.evaluation ? `step ${j.evaluation.step}: ` + Object.entries(j.evaluation.metrics).slice(0, 2)
        .map(([k, v]) => `${k} ${number(v)}`).join(", ") : "-"),
      el("td", {class: "message"}, j.last_failure || j.message || ""),
      el("td", {}, when(j.created, now())), el("td", {}, duration(j, now())))));
    if (!page.jobs.length) body.append(el("tr", {}, el("td", {colspan: 10, class: "muted"}, "No jobs.")));
    const older = new URLSearchParams(params);
    older.set("before", page.next);
    pager.replaceChildren(params.get("before") ? el("a", {href: "/"}, "← newest") : "",
                          page.next ? el("a", {href: `/?${older}`, id: "older"}, "older →") : "");
  });
}

// ---- one job (/jobs/<id>) --------------------------------------------------------------------------

function jobView(id) {
  const head = el("div");
  const failure = el("div");
  const tasks = el("tbody");
  const charts = el("div", {class: "charts", id: "charts"});
  const scalars = el("div", {class: "charts", id: "scalars"});
  const usage = el("div", {class: "charts", id: "usage"});
  replace(head, failure, el("h2", {}, "Tasks"),
          el("table", {id: "tasks"}, el("thead", {}, el("tr", {}, ["task", "state", "node", "address", "GPUs",
            "attempt", "exit", "message", "log"].map(h => el("th", {}, h)))), tasks),
          el("h2", {}, "Evaluation"), charts, el("h2", {}, "Training scalars"), scalars,
          el("h2", {}, "Usage"), usage);
  every(async () => {
    await refreshSummary();
    const job = await api(`/api/jobs/${encodeURIComponent(id)}`);
    document.title = `${job.id} · tfcluster`;
    head.replaceChildren(
      el("h1", {}, job.id, el("span", {id: "job-state", class: `state ${job.state}`}, job.state)),
      el("div", {class: "facts"},
        el("span", {}, "owner ", el("b", {id: "job-owner"}, job.owner || "-")),
        el("span", {}, "strategy ", el("b", {}, job.strategy)),
        el("span", {}, "restarts ", el("b", {}, job.restarts)),
        el("span", {}, "preemptions ", el("b", {}, job.preemptions)),
        job.preempted_by ? el("span", {id: "preempted-by"}, "last preempted by ",
          el("b", {}, (job.preempted_by_owner ? `${job.preempted_by_owner}'s job ` : "job ") + job.preempted_by),
          " ", when(job.preempted_at, now())) : "",
        el("span", {}, "evaluator restarts ", el("b", {}, job.evaluator_restarts)),
        job.queue_position ? el("span", {id: "queue-position"}, "queue position ",
          el("a", {href: "/queue"}, el("b", {}, job.queue_position)), ` · waiting ${ago(now() - job.waiting_since)}`) : null,
        el("span", {}, "started ", el("b", {}, when(job.created, now()))),
        el("span", {}, "took ", el("b", {}, duration(job, now())))),
      job.message ? el("p", {class: "muted", id: "job-message"}, job.message) : "");
    const f = job.last_failure;
    failure.replaceChildren(f ? el("div", {class: "panel failure"},
      el("b", {}, "Last failure: "), f.description,
      f.log_tail.length ? el("pre", {}, collapseRedraws(f.log_tail.join("\n"))) : "") : "");
    tasks.replaceChildren(...job.tasks.map(t => {
      const key = `${t.type}:${t.index}`;
      const exit = t.exit;  // `3`, or the signal that killed it: `SIGKILL`, as its failure says
      return el("tr", {"data-task": key}, el("td", {}, key), el("td", {}, badge(t.state)),
        el("td", {}, t.node ? el("a", {href: `/nodes?name=${encodeURIComponent(t.node)}`}, t.node) : "-"),
        el("td", {}, t.address || "-"), el("td", {}, t.gpus.map(g => g.index).join(", ") || "-"),
        el("td", {}, t.attempt), el("td", {}, exit), el("td", {class: "message"}, t.message),
        el("td", {}, t.attempt ? el("a", {href: `/jobs/${encodeURIComponent(job.id)}/tasks/${key}/log`}, "log") : "-"));
    }));
    drawCharts(charts, job.evaluation.history);
    await Promise.all([drawScalars(scalars, job.id), drawUsage(usage, job.id)]);  // training.js
  });
}

// ---- evaluation charts: one per metric, a point per evaluated checkpoint ----------------------------

function drawCharts(container, history) {
  if (!history.length) {
    container.replaceChildren(el("p", {class: "muted"}, "No evaluation yet."));
    return;
  }
  const names = [...new Set(history.flatMap(e => Object.keys(e.metrics)))].sort();
  container.replaceChildren(...names.map(name => {
    const points = history.filter(e => e.metrics[name] !== null && e.metrics[name] !== undefined)
      .map(e => ({step: e.step, value: e.metrics[name], checkpoint: e.checkpoint}))
      .sort((a, b) => a.step - b.step);
    return el("div", {class: "panel chart", "data-metric": name}, el("h3", {}, name), lineChart(points));
  }));
}

// One series, drawn by training.js's chart: a circle per evaluated checkpoint, its step in data-step.
function lineChart(points) {
  return multiLineChart([{name: "evaluator", points: points.map(p => [p.step, p.value])}], s => `step ${Math.round(s)}`);
}

// ---- nodes (/nodes) --------------------------------------------------------------------------------

// A drained node says so (Slurm's DRAINING/DRAINED), with who, why and since when; a LOST one stays LOST.
function nodeState(n) {
  if (n.state !== "READY" || (!n.drain && !n.condition)) return badge(n.state);
  const why = n.drain ? `drained by ${n.drain.by || "an admin"} ${ago(Date.now() / 1000 - n.drain.since)} ago: `
    + n.drain.reason : `takes no new tasks: ${n.condition}`;
  return el("span", {}, badge(n.drain ? n.drain.state : "READY"), el("div", {class: "muted drain"}, why));
}

function nodesView(params) {
  document.getElementById("nav-nodes").classList.add("active");
  const [name, state] = filters(params, "node");
  const body = el("tbody");
  const pager = el("div", {class: "pager"});
  replace(el("h1", {}, "Nodes"), el("div", {class: "filters"}, name, state),
          el("table", {id: "nodes"}, el("thead", {}, el("tr", {}, ["node", "state", "address", "GPUs", "tasks", "CPUs",
            "memory", "agent", "heartbeat"].map(h => el("th", {}, h)))), body), pager);
  every(async () => {
    const summary = await refreshSummary();
    if (state.options.length === 1) addStates(state, summary.node_states, params);
    const page = await api(`/api/nodes?${params}`);
    body.replaceChildren(...page.nodes.map(n => {
      const holders = {};
      for (const t of n.tasks) for (const g of t.gpus) holders[g] = t;
      return el("tr", {"data-node": n.name}, el("td", {}, n.name), el("td", {}, nodeState(n)), el("td", {}, n.address),
        el("td", {}, n.gpus.length ? n.gpus.map(g => holders[g.index]
          ? el("span", {class: "gpu held", title: g.uuid}, `${g.index} `, jobLink(holders[g.index].job),
               ` ${holders[g.index].task}`)
          : el("span", {class: "gpu", title: g.uuid}, `${g.index} free`)) : "-"),
        el("td", {}, n.tasks.length ? n.tasks.map(t => el("div", {}, jobLink(t.job), ` ${t.task}`)) : "-"),
        el("td", {}, n.cpu_count), el("td", {}, `${(n.memory_bytes / 2 ** 30).toFixed(1)} GiB`),
        el("td", {}, n.agent_version), el("td", {}, `${ago(n.last_seen_seconds_ago)} ago`));
    }));
    if (!page.nodes.length) body.append(el("tr", {}, el("td", {colspan: 9, class: "muted"}, "No nodes.")));
    const more = new URLSearchParams(params);
    more.set("after", page.next);
    pager.replaceChildren(params.get("after") ? el("a", {href: "/nodes"}, "← first") : "",
                          page.next ? el("a", {href: `/nodes?${more}`}, "more →") : "");
  });
}

// ---- the queue (/queue) -----------------------------------------------------------------------------

function queueView() {
  document.getElementById("nav-queue").classList.add("active");
  const body = el("tbody");
  const total = el("p", {class: "muted"});
  replace(el("h1", {}, "Queue"), total,
          el("table", {id: "queue"}, el("thead", {}, el("tr", {}, ["#", "job", "owner", "class", "tasks", "GPUs",
            "waiting", "reason"].map(h => el("th", {}, h)))), body));
  every(async () => {
    await refreshSummary();
    const page = await api("/api/queue");
    total.textContent = `${page.total} pending, in the order they will be placed` +
      (page.jobs.length < page.total ? ` (the first ${page.jobs.length} shown)` : "");
    body.replaceChildren(...page.jobs.map(q => el("tr", {"data-job": q.id}, el("td", {}, q.position),
      el("td", {}, jobLink(q.id)), el("td", {}, q.owner || "-"), el("td", {}, q.priority || "-"), el("td", {}, q.tasks),
      el("td", {}, q.gpus), el("td", {}, ago(q.waiting_seconds)), el("td", {}, q.reason))));
    if (!page.jobs.length) body.append(el("tr", {}, el("td", {colspan: 8, class: "muted"}, "Nothing waits.")));
  });
}

// ---- a task's log (/jobs/<id>/tasks/<task>/log) ------------------------------------------------------

// Progress bars redraw a line with carriage returns: show each line as it ended up, as a terminal would.
function collapseRedraws(text) {
  return text.split("\n").map(line => {
    const parts = line.split("\r").filter((p, i, all) => p !== "" || i === all.length - 1);
    return parts.length ? parts[parts.length - 1] : "";
  }).join("\n");
}

async function logView(id, task) {
  const state = el("span", {id: "log-state", class: "muted"}, "following…");
  const pre = el("pre", {id: "log"});
  replace(el("h1", {}, jobLink(id), ` ${task} log`), state, pre);
  refreshSummary().catch(showError);
  let raw = "";
  try {
    const response = await fetch(`/api/jobs/${encodeURIComponent(id)}/tasks/${task}/log?follow=1`,
                                 {credentials: "same-origin"});
    if (!response.ok) throw new Error(`${response.status}: ${(await response.text()).trim()}`);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      raw += decoder.decode(value, {stream: true});
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
      pre.textContent = collapseRedraws(raw);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    state.textContent = "the task has ended";
  } catch (error) {
    state.textContent = `log stream ended: ${error.message}`;
    state.className = "error";
  }
}

// ---- routing ---------------------------------------------------------------------------------------

function route() {
  const path = decodeURIComponent(location.pathname);
  const params = new URLSearchParams(location.search);
  let match;
  if ((match = path.match(/^\/jobs\/([^/]+)\/tasks\/([^/]+)\/log$/))) return logView(match[1], match[2]);
  if ((match = path.match(/^\/jobs\/([^/]+)$/))) return jobView(match[1]);
  if (path === "/nodes") return nodesView(params);
  if (path === "/queue") return queueView();
  if (path === "/sweeps") return sweepsView();  // training.js
  return jobsView(params);
}

route();
