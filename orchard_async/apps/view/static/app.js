// orchard-async view: the page. Plain DOM, no framework, no build step.
// Trajectory text is untrusted (a model wrote it): it only ever enters the page as text
// (textContent), never as markup.
"use strict";

const PHASE_ORDER = ["create", "setup", "agent", "exec", "score", "destroy"];
const OUTPUT_HEAD = 3000; // characters of a long output shown before the cut, and after it
const SVG = "http://www.w3.org/2000/svg";
const state = { runs: [], summaries: {}, filters: {} };

// -- helpers ---------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style") Object.assign(el.style, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, value);
  for (const child of children) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return el;
}

async function api(path, params) {
  const query = new URLSearchParams(params || {}).toString();
  const response = await fetch(`/api/${path}${query ? "?" + query : ""}`);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  return String(value);
}
const pct = (value) => (value === null || value === undefined ? "–" : `${(value * 100).toFixed(1)}%`);
const secs = (value) => (value === null || value === undefined ? "–" : value < 1 ? `${(value * 1000).toFixed(1)} ms` : `${value.toFixed(2)} s`);
const runHref = (run, rest = "") => `#/run/${run}${rest}`;

// A number of the summary; data-field/data-value hold inspect --json's key and exact value.
const num = (field, value, text) => h("span", { "data-field": field, "data-value": JSON.stringify(value), text: text === undefined ? fmt(value) : text });

// pass@k for k = 1, 2, 3 and the largest k: a group of 64 would give 64 numbers.
function someOf(byK) {
  const entries = Object.entries(byK);
  return entries.length <= 4 ? entries : [...entries.slice(0, 3), entries[entries.length - 1]];
}

function card(label, cls, ...values) {
  return h("div", { class: "card" }, h("div", { class: "label", text: label }), h("div", { class: `value ${cls || ""}` }, ...values));
}

function shareBar(shares, phases) {
  const bar = h("div", { class: "share", "data-testid": "time-share" });
  const legend = h("div", { class: "legend" });
  for (const phase of phases) {
    const share = shares[phase] || 0;
    const cls = PHASE_ORDER.includes(phase) ? phase : "other";
    bar.append(h("span", { class: cls, title: `${phase} ${pct(share)}`, style: { width: `${share * 100}%` } }));
    legend.append(h("span", {}, h("i", { class: cls }), `${phase} ${pct(share)}`));
  }
  return h("div", {}, bar, legend);
}

function histogramChart(title, histogram, label) {
  const width = 360, height = 140, pad = 22;
  const counts = histogram.counts;
  const svg = s("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
  const most = Math.max(1, ...counts);
  const slot = (width - 2 * pad) / Math.max(1, counts.length);
  counts.forEach((count, i) => {
    const barHeight = ((height - 2 * pad) * count) / most;
    const from = histogram.discrete ? histogram.edges[i] : histogram.edges[i];
    const to = histogram.discrete ? null : histogram.edges[i + 1];
    const rect = s("rect", { class: "bar", x: pad + i * slot + 1, y: height - pad - barHeight, width: Math.max(1, slot - 2), height: barHeight });
    rect.append(s("title", {}, `${to === null ? label(from) : `${label(from)} – ${label(to)}`}: ${count}`));
    svg.append(rect);
    if (histogram.discrete && counts.length <= 12) {
      svg.append(s("text", { x: pad + i * slot + slot / 2, y: height - 6, "text-anchor": "middle" }, label(from)));
    }
  });
  if (!histogram.discrete && counts.length) {
    svg.append(s("text", { x: pad, y: height - 6 }, label(histogram.edges[0])));
    svg.append(s("text", { x: width - pad, y: height - 6, "text-anchor": "end" }, label(histogram.edges[histogram.edges.length - 1])));
  }
  svg.append(s("text", { x: pad, y: 12 }, `max ${most}`));
  return h("div", { class: "chart" }, h("h3", { text: title }), svg);
}

function kvList(entries) {
  const list = h("dl", { class: "kv" });
  for (const [key, value] of entries) list.append(h("dt", { text: key }), h("dd", {}, value instanceof Node ? value : fmt(value)));
  return list;
}

// A long output: its head and tail with the cut marked; a click shows it whole.
function output(text, cutBytes) {
  const pre = h("pre", { class: "output" });
  const render = (whole) => {
    pre.replaceChildren();
    if (whole || text.length <= 2 * OUTPUT_HEAD + 200) {
      pre.append(text);
    } else {
      const hidden = text.length - 2 * OUTPUT_HEAD;
      pre.append(text.slice(0, OUTPUT_HEAD),
        h("a", { class: "cut", href: "#", onclick: (e) => { e.preventDefault(); render(true); }, text: `… ${hidden} characters hidden here (show all) …` }),
        text.slice(-OUTPUT_HEAD));
    }
  };
  render(false);
  const parts = [pre];
  if (cutBytes) parts.unshift(h("span", { class: "cut", text: `the sandbox cut ${cutBytes} bytes of this output (head and tail kept)` }));
  return parts;
}

function diff(text) {
  const pre = h("pre", { class: "diff", "data-testid": "diff" });
  for (const line of text.split("\n")) {
    let cls = "";
    if (line.startsWith("diff --git") || line.startsWith("+++ ") || line.startsWith("--- ")) cls = "file";
    else if (line.startsWith("@@")) cls = "hunk";
    else if (line.startsWith("+")) cls = "add";
    else if (line.startsWith("-")) cls = "del";
    pre.append(h("span", { class: cls, text: line || " " }));
  }
  return pre;
}

// -- pages ------------------------------------------------------------------------------

async function summaryOf(run) {
  if (!state.summaries[run]) state.summaries[run] = await api("summary", { run });
  return state.summaries[run];
}

function summarySection(data) {
  const sm = data.summary;
  const wrap = h("section", { id: "summary", "data-pending": String(Boolean(data.pending)) });
  for (const warning of data.warnings) wrap.append(h("div", { class: "banner", "data-testid": "warning", text: `warning: ${warning}` }));
  wrap.append(h("div", { class: "cards" },
    card("episodes", "", num("episodes", sm.episodes)),
    card("finished / failed", "", num("finished", sm.finished), " / ", num("failed", sm.failed)),
    card("success rate", "", num("success_rate", sm.success_rate, pct(sm.success_rate))),
    card("reward mean", "", num("mean_reward", sm.mean_reward)),
    card("steps", "", num("steps", sm.steps)),
    card("verifier errors", sm.verifier_errors ? "bad" : "", num("verifier_errors", sm.verifier_errors)),
    card("model unavailable", sm.model_unavailable ? "bad" : "", num("model_unavailable", sm.model_unavailable)),
    card("exec p50 / p99", "", num("exec_p50_ms", sm.exec_p50_ms, fmt(sm.exec_p50_ms, 1)), " / ", num("exec_p99_ms", sm.exec_p99_ms, fmt(sm.exec_p99_ms, 1)), " ms"),
    card("infra retries", sm.retries ? "warn" : "", num("retries", sm.retries)),
    data.pending ? card("pass@k, pass^k", "muted", "computing…") : null,
    Object.keys(sm.pass_at_k || {}).length ? card("pass@k", "", num("pass_at_k", sm.pass_at_k, someOf(sm.pass_at_k).map(([k, v]) => `@${k} ${fmt(v)}`).join("  "))) : null,
    Object.keys(sm.pass_hat_k || {}).length ? card("pass^k", "", num("pass_hat_k", sm.pass_hat_k, someOf(sm.pass_hat_k).map(([k, v]) => `^${k} ${fmt(v)}`).join("  "))) : null,
  ));
  wrap.append(kvList([
    ["episode end reasons", Object.entries(sm.exit_reasons).map(([k, v]) => `${k} ${v}`).join(", ") || "–"],
    ["command exit reasons", Object.entries(sm.command_reasons).map(([k, v]) => `${k} ${v}`).join(", ") || "–"],
  ]));
  wrap.append(h("h3", { text: "where the time went (share of summed episode time)" }), shareBar(sm.time_share, data.phases));
  wrap.append(h("div", { class: "row" },
    histogramChart("reward", data.reward_histogram, (v) => fmt(v, 2)),
    histogramChart("episode time", data.time_histogram, (v) => secs(v))));
  return wrap;
}

const FILTER_FIELDS = ["task", "group", "policy", "end", "status", "success", "min_reward", "max_reward", "verifier", "retries", "sort", "order", "offset"];

function filtersFromHash(query) {
  const filters = {};
  for (const key of FILTER_FIELDS) if (query.get(key)) filters[key] = query.get(key);
  return filters;
}

function episodesSection(run, data, filters) {
  const facets = data.facets;
  const input = (name, attrs) => h("input", { name, value: filters[name] || "", ...attrs });
  const select = (name, options) => {
    const el = h("select", { name }, h("option", { value: "", text: "any" }), options.map((o) => h("option", { value: o, text: o })));
    el.value = filters[name] || "";
    return el;
  };
  const check = (name, label) => h("label", { class: "check" }, h("input", { type: "checkbox", name, checked: filters[name] === "1" }), label);
  const taskList = h("datalist", { id: "task-ids" }, facets.tasks.map((t) => h("option", { value: t })));
  const sort = h("select", { name: "sort" }, ["file", "reward", "time", "steps", "retries"].map((o) => h("option", { value: o, text: o === "file" ? "file order" : o })));
  sort.value = filters.sort || "file";
  const order = h("select", { name: "order" }, h("option", { value: "asc", text: "ascending" }), h("option", { value: "desc", text: "descending" }));
  order.value = filters.order || "asc";
  const form = h("form", { class: "filters", "data-testid": "filters" },
    h("label", {}, "task", input("task", { list: "task-ids", placeholder: `${facets.task_count} tasks` })), taskList,
    h("label", {}, "group", input("group", { placeholder: `${facets.groups} groups` })),
    h("label", {}, "policy", select("policy", facets.policies)),
    h("label", {}, "end reason", select("end", facets.end_reasons)),
    h("label", {}, "status", select("status", ["finished", "failed"])),
    h("label", {}, "success", select("success", ["yes", "no"])),
    h("label", {}, "reward ≥", input("min_reward", { class: "narrow", type: "number", step: "any" })),
    h("label", {}, "reward ≤", input("max_reward", { class: "narrow", type: "number", step: "any" })),
    check("verifier", "verifier errors"), check("retries", "retried"),
    h("label", {}, "sort by", sort), h("label", {}, "order", order),
    h("button", { type: "submit", text: "apply" }),
    h("button", { type: "button", text: "clear", onclick: () => { location.hash = runHref(run); } }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const params = new URLSearchParams();
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el.type === "checkbox") { if (el.checked) params.set(el.name, "1"); }
      else if (el.value) params.set(el.name, el.value);
    }
    location.hash = runHref(run, params.toString() ? `?${params}` : "");
  });
  const body = h("tbody");
  const info = h("span", { class: "muted", "data-testid": "total" });
  const prev = h("button", { type: "button", text: "← previous" });
  const next = h("button", { type: "button", text: "next →" });
  const section = h("section", { id: "episodes" }, h("h2", { text: "episodes" }), form,
    h("div", { class: "pager" }, prev, next, info),
    h("table", { "data-testid": "episodes" },
      h("thead", {}, h("tr", {}, ["#", "episode", "task", "group", "policy", "status", "end reason", "reward", "steps", "retries", "time"].map((c, i) => h("th", { class: i >= 7 ? "num" : "", text: c })))),
      body));
  const load = async () => {
    const page = await api("episodes", { run, ...filters });
    const offset = page.offset;
    info.textContent = page.total ? `${offset + 1}–${offset + page.rows.length} of ${page.total} episodes` : "no episode matches";
    info.dataset.total = page.total;
    prev.disabled = offset === 0;
    next.disabled = offset + page.rows.length >= page.total;
    const go = (to) => { const params = new URLSearchParams({ ...filters, offset: String(to) }); location.hash = runHref(run, `?${params}`); };
    prev.onclick = () => go(Math.max(0, offset - page.limit));
    next.onclick = () => go(offset + page.limit);
    body.replaceChildren(...page.rows.map((r) => h("tr", { "data-row": r.row },
      h("td", { class: "num", text: r.row }),
      h("td", {}, h("a", { href: runHref(run, `/episode/${r.row}`), text: r.episode_id })),
      h("td", { text: r.task_id }),
      h("td", {}, h("a", { href: runHref(run, `/group/${encodeURIComponent(r.group_id)}`), text: r.group_id })),
      h("td", { text: r.policy }),
      h("td", { class: r.status === "finished" ? "" : "bad", text: r.status }),
      h("td", { text: r.end_reason }),
      h("td", { class: `num ${r.success ? "ok" : ""}`, text: fmt(r.reward) }),
      h("td", { class: "num", text: r.steps }),
      h("td", { class: `num ${r.retries ? "warn" : ""}`, text: r.retries }),
      h("td", { class: "num", text: secs(r.time_s) }))));
  };
  return { section, load };
}

async function runPage(run, query) {
  const data = await summaryOf(run);
  const filters = filtersFromHash(query);
  const table = episodesSection(run, data, filters);
  const header = data.header || {};
  const about = [header.recipe, header.policy, header.adapter].filter(Boolean).join(" · ");
  main(h("h1", { text: data.path }), about ? h("p", { class: "muted", text: about }) : null, summarySection(data), table.section);
  await table.load();
  if (data.pending) fillInWhenComplete(run);
}

// pass@k takes the server a while on a large run: the page opens without it, then asks
// again until it is there, and redraws the summary (only while this run's page is shown).
function fillInWhenComplete(run) {
  const shownAt = location.hash;
  setTimeout(async () => {
    if (location.hash !== shownAt) return;
    const data = await api("summary", { run });
    if (data.pending) return fillInWhenComplete(run);
    state.summaries[run] = data;
    const old = document.getElementById("summary");
    if (old && location.hash === shownAt) old.replaceWith(summarySection(data));
  }, 1500);
}

function screenshotView(run, shot, action) {
  if (!shot) return null;
  if (!shot.available) return h("p", { class: "muted", text: `screenshot sha256=${shot.sha256.slice(0, 12)}… is not in the run's folder (view --screenshots DIR names the folder that holds them)` });
  const img = h("img", { src: `/api/screenshot?run=${run}&sha256=${shot.sha256}`, alt: "screenshot", "data-testid": "screenshot" });
  const box = h("div", { class: "shot" }, img);
  const draw = () => {
    const width = shot.width || img.naturalWidth, height = shot.height || img.naturalHeight;
    if (!action || !width) return;
    const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" });
    if (typeof action.x === "number" && typeof action.y === "number") {
      svg.append(s("circle", { class: "mark", cx: action.x, cy: action.y, r: 14 }));
    }
    const target = action.element !== undefined && (shot.marks || []).find((mark) => mark.element === String(action.element));
    if (target) {  // a set-of-marks observation: the box of the element the action named
      const [x, y, w, hgt] = target.box;
      svg.append(s("rect", { class: "target", x, y, width: w, height: hgt }));
    }
    if (typeof action.x1 === "number") {
      svg.append(s("line", { class: "drag", x1: action.x1, y1: action.y1, x2: action.x2, y2: action.y2 }));
      svg.append(s("circle", { class: "mark", cx: action.x2, cy: action.y2, r: 10 }));
    }
    if (svg.childNodes.length) box.append(svg);
  };
  img.addEventListener("load", draw);
  return box;
}

function stepView(run, step) {
  const action = step.action || {};
  const kind = action.kind || "exec";
  const head = h("header", {},
    h("span", { class: "kind", text: `step ${step.index}` }),
    h("span", { class: "pill", text: kind }),
    step.reason ? h("span", { class: step.reason === "ok" ? "ok" : "bad", text: `${step.reason}${step.exit_code !== undefined && step.exit_code !== null ? ` (exit ${step.exit_code})` : ""}` }) : null,
    h("span", { class: "muted", text: `agent ${secs(step.agent_s || 0)} · exec ${secs(step.exec_s || 0)}` }));
  const parts = [head];
  if (action.raw) parts.push(h("details", {}, h("summary", { text: "model reply" }), h("pre", { text: action.raw })));
  if (step.tool_calls) {
    parts.push(h("h3", { text: "tool calls" }), ...step.tool_calls.map((call) => {
      const fn = call.function || call;
      return h("pre", { class: "tool-call", text: `${fn.name || "?"}(${typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments)})` });
    }));
  }
  if (step.gui_action) {
    parts.push(h("div", {}, h("span", { class: "muted", text: "GUI action " }), h("code", { text: JSON.stringify(step.gui_action) })));
    const shown = screenshotView(run, step.acted_on, step.gui_action);
    if (shown) parts.push(h("details", { open: true }, h("summary", { text: "the screenshot it acted on" }), shown));
  } else if (action.command) {
    parts.push(h("pre", { class: "command", text: `$ ${action.command}` }));
  }
  if (action.error) parts.push(h("p", { class: "bad", text: `invalid reply: ${action.error}` }));
  if (step.observation) parts.push(...output(step.observation, (step.stdout_cut || 0) + (step.stderr_cut || 0)));
  if (step.screenshot && !step.gui_action) parts.push(screenshotView(run, step.screenshot, null));
  if (action.usage && Object.keys(action.usage).length) parts.push(h("p", { class: "muted", text: `tokens: ${Object.entries(action.usage).map(([k, v]) => `${k} ${v}`).join(", ")}` }));
  return h("div", { class: "step", "data-testid": "step" }, ...parts);
}

function statusTable(title, entries) {
  return h("div", {}, h("h3", { text: title }), h("table", { "data-testid": "tests" },
    h("thead", {}, h("tr", {}, h("th", { text: "name" }), h("th", { text: "status" }))),
    h("tbody", {}, entries.map(([name, status]) => h("tr", {}, h("td", { text: name }), h("td", { class: `status-${status}`, text: String(status) }))))));
}

// One state change of a Claw audit entry ({op, at, key, before, after}) as a line of text.
function changeText(change) {
  if (change === null || typeof change !== "object") return String(change);
  const where = [change.at, change.key].filter((part) => part !== undefined && part !== null && part !== "").join(" ");
  // An insert's or a delete's record is in the call's arguments or the state: the key names it.
  const values = change.op === "insert" || change.op === "delete" ? "" : `: ${brief(change.before)} → ${brief(change.after)}`;
  return `${change.op || "change"} ${where}${values}`;
}

function brief(value) {
  if (value === null || value === undefined) return "–";
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
}

function infoView(run, info) {
  const parts = [];
  const rest = { ...info };
  const scalars = Object.entries(info).filter(([, v]) => typeof v === "number" || typeof v === "boolean");
  if (scalars.length) parts.push(h("h3", { text: "reward components and numbers" }), kvList(scalars.map(([k, v]) => [k, typeof v === "boolean" ? String(v) : v])));
  for (const [key] of scalars) delete rest[key];
  if (typeof info.patch === "string") {
    parts.push(h("h3", { text: "patch" }), info.patch ? diff(info.patch) : h("p", { class: "muted", text: "(empty patch)" }));
    delete rest.patch;
  }
  if (info.tests && typeof info.tests === "object" && !Array.isArray(info.tests)) {
    parts.push(statusTable("tests", Object.entries(info.tests)));
    delete rest.tests;
  }
  if (info.tests_status && typeof info.tests_status === "object") {
    const rows = [];
    for (const [group, outcome] of Object.entries(info.tests_status)) {
      for (const [verdict, names] of Object.entries(outcome || {})) for (const name of names || []) rows.push([`${group}: ${name}`, verdict === "success" ? "passed" : "failed"]);
    }
    parts.push(statusTable("graded tests (FAIL_TO_PASS, PASS_TO_PASS)", rows));
    delete rest.tests_status;
  }
  if (info.checks && typeof info.checks === "object") {
    const entries = Array.isArray(info.checks) ? info.checks.map((c, i) => [`${i}: ${c.type || ""}`, c.score !== undefined ? c.score : JSON.stringify(c)]) : Object.entries(info.checks);
    parts.push(statusTable("checks", entries));
    delete rest.checks;
  }
  for (const key of ["screenshot", "image"]) {
    if (typeof info[key] === "string") {
      parts.push(h("h3", { text: key }), h("img", { src: `/api/file?run=${run}&path=${encodeURIComponent(info[key])}`, alt: key, class: "shot", "data-testid": "info-image" }));
      delete rest[key];
    }
  }
  if (Array.isArray(info.audit)) {
    // The Claw services' audit: every tool call, as the grader saw it.
    parts.push(h("h3", { text: `service audit (${info.audit.length} tool calls)` }), h("table", { "data-testid": "audit" },
      h("thead", {}, h("tr", {}, ["#", "t (s)", "tool", "via", "arguments", "status", "changes or error"].map((t) => h("th", { text: t })))),
      h("tbody", {}, info.audit.map((call) => h("tr", { class: call.ok ? "" : "failed" },
        h("td", { text: String(call.seq ?? "") }), h("td", { text: String(call.t ?? "") }), h("td", { text: call.tool || "" }),
        h("td", { text: call.via || "" }), h("td", {}, h("code", { text: JSON.stringify(call.args ?? {}) })),
        h("td", { class: call.ok ? "status-PASSED" : "status-FAILED", text: String(call.status ?? "") + (call.fault ? " (injected)" : "") }),
        h("td", { text: call.ok ? (call.changes || []).map(changeText).join("; ") : call.error || "" }))))));
    delete rest.audit;
  }
  if (info.model_calls) {
    parts.push(h("h3", { text: "recorded model calls" }), h("pre", { text: JSON.stringify(info.model_calls, null, 2) }));
    delete rest.model_calls;
  }
  if (Object.keys(rest).length) parts.push(h("h3", { text: "other info" }), h("pre", { text: JSON.stringify(rest, null, 2) }));
  return parts;
}

async function episodePage(run, row) {
  const [ep, data] = await Promise.all([api("episode", { run, row }), summaryOf(run)]);
  const timings = ep.timings || {};
  const total = timings.total || PHASE_ORDER.reduce((sum, p) => sum + (timings[p] || 0), 0) || 1;
  const shares = {};
  for (const [phase, value] of Object.entries(timings)) if (phase !== "total") shares[phase] = value / total;
  const phases = [...PHASE_ORDER.filter((p) => p in shares), ...Object.keys(shares).filter((p) => !PHASE_ORDER.includes(p))];
  const parts = [
    h("p", {}, h("a", { href: runHref(run), text: `← ${data.path}` })),
    h("h1", { "data-testid": "episode-id", text: ep.episode_id }),
    kvList([
      ["task", ep.task_id],
      ["group", h("a", { href: runHref(run, `/group/${encodeURIComponent(ep.group_id)}`), text: `${ep.group_id} (sample ${ep.sample})` })],
      ["policy · adapter", `${ep.policy} · ${ep.adapter}`],
      ["status · end reason", h("span", { class: ep.status === "finished" ? "" : "bad", text: `${ep.status} · ${ep.end_reason}` })],
      ["reward", h("span", { class: ep.success ? "ok" : "", "data-testid": "reward", text: `${fmt(ep.reward)}${ep.success ? " (success)" : ""}` })],
      ["time", `${secs(timings.total)}: ${phases.map((p) => `${p} ${secs(timings[p])}`).join(", ")}`],
    ]),
    shareBar(shares, phases),
  ];
  if (ep.error) parts.push(h("div", { class: "error", text: ep.error }));
  if (ep.retries && ep.retries.length) {
    parts.push(h("h2", { text: "retried attempts (infrastructure)" }), h("table", {}, h("tbody", {}, ep.retries.map((r) => h("tr", {},
      h("td", { text: `attempt ${r.attempt}` }), h("td", { text: r.reason }), h("td", { text: secs(r.duration) }), h("td", { text: r.error }))))));
  }
  parts.push(h("h2", { text: "instruction" }), h("pre", { "data-testid": "instruction", text: ep.instruction || "(none)" }));
  if (ep.instruction_screenshot) parts.push(screenshotView(run, ep.instruction_screenshot, null));
  parts.push(h("h2", { text: `steps (${ep.steps.length})` }), ...ep.steps.map((step) => stepView(run, step)));
  parts.push(h("h2", { text: "reward and scoring" }), ...infoView(run, ep.info || {}));
  if (ep.ops && ep.ops.length) {
    parts.push(h("details", {}, h("summary", { text: `sandbox operations (${ep.ops.length})` }), h("table", {},
      h("thead", {}, h("tr", {}, ["operation", "start", "duration", "outcome"].map((c) => h("th", { text: c })))),
      h("tbody", {}, ep.ops.map(([name, start, duration, outcome]) => h("tr", {}, h("td", { text: name }), h("td", { class: "num", text: secs(start) }), h("td", { class: "num", text: secs(duration) }), h("td", { text: outcome })))))));
  }
  main(...parts);
}

async function groupPage(run, group) {
  const [data, sm] = await Promise.all([api("group", { run, group }), summaryOf(run)]);
  const samples = data.samples.map((x) => h("div", { class: "sample", "data-testid": "sample" },
    h("h3", {}, h("a", { href: runHref(run, `/episode/${x.row}`), text: `sample ${x.sample}` })),
    h("dl", {},
      h("dt", { text: "reward" }), h("dd", { class: x.success ? "ok" : "", text: fmt(x.reward) }),
      h("dt", { text: "advantage" }), h("dd", { text: x.advantage === null ? "not scored" : fmt(x.advantage) }),
      h("dt", { text: "advantage / std" }), h("dd", { text: x.advantage_std === null ? "not scored" : fmt(x.advantage_std) }),
      h("dt", { text: "end" }), h("dd", { class: x.status === "finished" ? "" : "bad", text: x.end_reason }),
      h("dt", { text: "steps" }), h("dd", { text: x.steps }),
      h("dt", { text: "time" }), h("dd", { text: secs(x.time_s) })),
    x.last_action ? h("pre", { text: x.last_action }) : null,
    x.patch ? h("details", {}, h("summary", { text: "patch" }), diff(x.patch)) : null));
  main(h("p", {}, h("a", { href: runHref(run), text: `← ${sm.path}` })),
    h("h1", { text: `group ${data.group_id}` }),
    kvList([["task", data.task_id], ["scored samples", data.scored], ["mean reward", data.mean], ["std", data.std]]),
    h("details", {}, h("summary", { text: "instruction" }), h("pre", { text: data.instruction })),
    h("div", { class: "samples" }, samples));
}

async function comparePage() {
  const data = await api("compare");
  const names = data.runs.map((p) => p.split("/").pop());
  const cell = (c, key, show) => h("td", { class: "num", text: c ? show(c[key]) : "–" });
  const delta = (value, show) => h("td", { class: `num ${value > 0 ? "ok" : value < 0 ? "bad" : ""}`, text: value === null ? "–" : `${value > 0 ? "+" : ""}${show(value)}` });
  main(h("h1", { text: `per task: ${names.join(" vs ")}` }),
    h("p", { class: "muted", text: data.runs.join("  vs  ") }),
    h("table", { "data-testid": "compare" },
      h("thead", {}, h("tr", {}, h("th", { text: "task" }),
        names.map((n) => [h("th", { class: "num", text: `${n} episodes` }), h("th", { class: "num", text: `${n} reward` }), h("th", { class: "num", text: `${n} success` }), h("th", { class: "num", text: `${n} time` })]),
        h("th", { class: "num", text: "Δ reward" }), h("th", { class: "num", text: "Δ time" }))),
      h("tbody", {}, data.tasks.map((t) => h("tr", {}, h("td", { text: t.task_id }),
        t.runs.map((c) => [cell(c, "episodes", fmt), cell(c, "mean_reward", fmt), cell(c, "success_rate", pct), cell(c, "mean_time_s", secs)]),
        delta(t.reward_delta, fmt), delta(t.time_delta_s, secs))))));
}

// -- routing ----------------------------------------------------------------------------

function main(...children) {
  document.getElementById("main").replaceChildren(...children);
}

async function route() {
  const [path, queryText] = location.hash.replace(/^#/, "").split("?");
  const query = new URLSearchParams(queryText || "");
  const parts = path.split("/").filter(Boolean);
  try {
    if (parts[0] === "compare") return await comparePage();
    const run = parts[0] === "run" ? Number(parts[1]) : 0;
    if (parts[2] === "episode") return await episodePage(run, parts[3]);
    if (parts[2] === "group") return await groupPage(run, decodeURIComponent(parts.slice(3).join("/")));
    return await runPage(run, query);
  } catch (error) {
    main(h("div", { class: "error", "data-testid": "error", text: String(error.message || error) }));
  } finally {
    document.body.dataset.ready = location.hash || "#/";
  }
}

async function start() {
  state.runs = await api("runs");
  const nav = document.getElementById("runs");
  for (const run of state.runs) nav.append(h("a", { href: runHref(run.run), text: `${run.name} (${run.episodes})` }));
  if (state.runs.length > 1) nav.append(h("a", { href: "#/compare", text: "compare per task" }));
  window.addEventListener("hashchange", route);
  await route();
}

start();
