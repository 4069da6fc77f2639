/* trainmaster portal: token, API calls, routing, live refresh, shared formatting. Pages live in pages/*.js. */
"use strict";
const TM = (() => {
  const KEY = "trainmaster.token", PROJECT = "trainmaster.project", POLL_MS = 1500;
  const pages = {};
  const charts = {};
  let me = null, timer = null, current = null, nodeCache = { at: 0, items: [] }, known = [];

  const $ = (sel, root = document) => root.querySelector(sel);
  const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  const token = () => sessionStorage.getItem(KEY) || localStorage.getItem(KEY);
  function saveToken(value, remember) {
    (remember ? localStorage : sessionStorage).setItem(KEY, value);
  }
  function forget() { localStorage.removeItem(KEY); sessionStorage.removeItem(KEY); }

  class ApiError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
    toString() { return `${this.code ? this.code + ": " : ""}${this.message}`; }
  }

  /** fetch with the bearer token; JSON in and out; failures as ApiError(error_code, error_msg). */
  async function api(path, { method = "GET", body, params, raw = false } = {}) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      for (const one of [].concat(v)) if (one !== undefined && one !== null && one !== "") url.searchParams.append(k, one);
    }
    const headers = { Authorization: `Bearer ${token()}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) { setLive(false); throw new ApiError(0, "", `cannot reach the API: ${e.message}`); }
    setLive(true);
    if (response.status === 401) { forget(); showLogin("Your token is no longer valid; sign in again."); }
    if (!response.ok) {
      let data = {};
      try { data = await response.json(); } catch (_) { /* not JSON */ }
      throw new ApiError(response.status, data.error_code || String(response.status), data.error_msg || response.statusText);
    }
    if (raw) return response.text();
    return response.status === 204 ? null : response.json();
  }

  function setLive(ok) {
    const el = $(".live");
    if (!el) return;
    el.classList.toggle("stale", !ok);
    $("#live-text").textContent = ok ? "live" : "reconnecting…";
  }

  const project = () => localStorage.getItem(PROJECT) || "";
  const jobsPath = (id = "") => `/v2/${encodeURIComponent(project())}/training-jobs${id ? "/" + encodeURIComponent(id) : ""}`;

  async function nodes(maxAgeMs = 4000) {
    if (Date.now() - nodeCache.at > maxAgeMs) {
      try { nodeCache = { at: Date.now(), items: (await api("/v2/nodes")).items }; } catch (_) { /* keep the old ones */ }
    }
    return nodeCache.items;
  }

  // formatting ----------------------------------------------------------------------------------------------
  function duration(s) {
    if (s === null || s === undefined || isNaN(s)) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor(s % 86400 / 3600)}h`;
  }
  function ago(ms) {
    if (!ms) return "–";
    const s = (Date.now() - ms) / 1000;
    return s < 5 ? "just now" : `${duration(s)} ago`;
  }
  const badge = (phase, secondary) => `<span class="badge b-${esc(phase)}" data-phase="${esc(phase)}" title="${esc(secondary || phase)}">${esc(phase)}${secondary && secondary !== phase ? ` · ${esc(secondary)}` : ""}</span>`;
  const kind = (k) => k ? `<span class="kind k-${esc(k)}">${esc(k.replace("_", "-"))}</span>` : "";
  const money = (v) => (v > 0 && v < 0.01 ? `$${v.toPrecision(2)}`
    : `$${(v || 0).toLocaleString(undefined, { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`);
  function progressOf(job) {
    const eta = job.status.eta;
    if (eta && eta.progress !== null && eta.progress !== undefined) return eta.progress;
    return job.status.phase === "Completed" ? 1 : null;
  }
  function progress(job) {
    const p = progressOf(job);
    if (p === null) return `<span class="muted">–</span>`;
    return `<div class="progress"><div class="track"><div class="fill" style="width:${(p * 100).toFixed(1)}%"></div></div><span class="pct">${Math.round(p * 100)}%</span></div>`;
  }
  // An ETA whose 10-90% band is wider than the estimate itself is a rough range, not a precise time
  // (the CLI's services/cli/render.py eta_phrase says the same).
  function etaWide(e) { return e.high_s - e.low_s >= Math.max(e.remaining_s, 20); }
  function rough(s) {
    if (s < 90) return `${Math.max(5, 5 * Math.round(s / 5))} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    return `${Math.round(s / 1800) / 2} h`;
  }
  function roughRange(low, high) {
    const [step, unit, scale] = high < 90 ? [5, "s", 5] : high < 5400 ? [60, "min", 1] : [3600, "h", 1];
    return `${Math.floor(low / step) * scale}–${Math.max(Math.ceil(high / step) * scale, 1)} ${unit}`;
  }
  function etaText(e) {
    return etaWide(e) ? { main: `about ${rough(e.remaining_s)}`, band: `could be ${roughRange(e.low_s, e.high_s)}` }
      : { main: duration(e.remaining_s), band: `80% between ${duration(e.low_s)} and ${duration(e.high_s)}` };
  }
  // When the job should end: to the second when the band is narrow; to the minute, with the band's ends, when
  // it is wide (a precise clock time would claim what etaText does not).
  function finishText(e) {
    const end = Date.parse(e.finish_time), clock = (ms, opts) => new Date(ms).toLocaleTimeString([], opts);
    if (!etaWide(e)) return { main: clock(end, { hour: "2-digit", minute: "2-digit", second: "2-digit" }), band: "" };
    const now = end - e.remaining_s * 1000, hm = { hour: "2-digit", minute: "2-digit" };
    return { main: `around ${clock(end, hm)}`, band: `between ${clock(now + e.low_s * 1000, hm)} and ${clock(now + e.high_s * 1000, hm)}` };
  }
  function eta(job) {
    const e = job.status.eta;
    if (!e) return `<span class="muted">–</span>`;
    if (etaWide(e)) { const t = etaText(e); return `<span class="eta"><b>${t.main}</b> <span class="band">(${t.band})</span></span>`; }
    return `<span class="eta"><b>${duration(e.remaining_s)}</b> <span class="band">(${duration(e.low_s)}–${duration(e.high_s)})</span></span>`;
  }
  // What the progress counts and who said so (the CLI's render.work_text says the same): "300/1000 it · 30.1 it/s
  // · from tqdm"; and what the time left runs to, with a declared target's state.
  const SOURCES = { declaration: "the job's declaration", sdk: "the job's reports (SDK)", mllog: "its MLLOG",
                    tqdm: "its tqdm bar", keras: "its Keras progress", lightning: "its Lightning bar",
                    "hf-trainer": "its Hugging Face Trainer", steps: "its step lines" };
  function workText(e) {
    if (!e || e.done === null || e.done === undefined || !e.source) return "";
    const num = (v) => Number(v.toPrecision(4)).toLocaleString(), unit = e.unit ? ` ${esc(e.unit)}` : "";
    const count = e.total ? `${num(e.done)}/${num(e.total)}${unit}` : `${num(e.done)}${unit}`;
    const rate = e.rate ? ` · ${num(e.rate)}${unit || " units"}/s` : "";
    return `${count}${rate} · from ${esc(SOURCES[e.source] || e.source)}`;
  }
  function etaLabel(e) {
    if (!e) return "Time left";
    if (e.target === "reached") return e.until === "end" ? "Target reached · time to the end" : "Target reached";
    if (e.target === "unreachable") return "Target unreachable before the end · time to the end";
    return e.until === "target" ? "Time to target" : "Time left";
  }
  const FINISHED = ["Completed", "Failed", "Terminated"];

  // shell, routing, refresh ---------------------------------------------------------------------------------
  function flash(message, kind = "error") {
    const el = $("#flash");
    el.className = `alert ${kind}`;
    el.textContent = message;
    clearTimeout(flash.t);
    flash.t = setTimeout(() => el.classList.add("hidden"), kind === "error" ? 8000 : 4000);
  }

  function showLogin(message) {
    stop();
    $("#shell").classList.add("hidden");
    $("#login").classList.remove("hidden");
    const err = $("#login-error");
    err.textContent = message || "";
    err.classList.toggle("hidden", !message);
    $("#login-token").focus();
  }

  async function signIn(value, remember) {
    forget();
    saveToken(value, remember);
    try {
      me = await api("/v2/me");
    } catch (e) {
      forget();
      showLogin(e.status === 401 ? "That token is not valid." : String(e));
      return;
    }
    $("#login").classList.add("hidden");
    $("#shell").classList.remove("hidden");
    $("#who").innerHTML = `<b>${esc(me.user_name)}</b>${me.admin ? " · admin" : ""}`;
    known = me.admin ? await allProjects() : me.projects;
    $("#project-list").innerHTML = known.map((p) => `<option value="${esc(p)}">`).join("");
    if (!project() || (!me.admin && !me.projects.includes(project()))) {
      if (me.projects.length) localStorage.setItem(PROJECT, me.projects[0]); else localStorage.removeItem(PROJECT);
    }
    $("#project").value = project();
    route();
  }

  /** The admin's projects: every project some user belongs to (GET /v2/users), sorted. */
  async function allProjects() {
    try {
      const users = await api("/v2/users");
      return [...new Set(users.flatMap((u) => u.projects))].sort();
    } catch (_) { return []; }
  }

  /** A link that opens a job after sign-in, in its project. */
  const jobLink = (id) => `${location.origin}/ui/#/job/${encodeURIComponent(id)}?project=${encodeURIComponent(project())}`;

  function stop() { clearInterval(timer); timer = null; }

  async function tick() {
    if (!current || !current.refresh || tick.busy) return;
    tick.busy = true;
    try { await current.refresh(); } catch (e) { if (e.status !== 401) console.warn(e); } finally { tick.busy = false; }
  }

  function route() {
    if (!token()) return showLogin();
    stop();
    if (current && current.leave) current.leave();
    const [path, query = ""] = (location.hash || "#/jobs").split("?");
    const linked = new URLSearchParams(query).get("project");  // a shared link names its project: #/job/ID?project=P
    if (linked && /^[A-Za-z0-9_-]{1,64}$/.test(linked) && linked !== project() && me && (me.admin || me.projects.includes(linked))) {
      localStorage.setItem(PROJECT, linked);
      $("#project").value = linked;
    }
    const [, name = "jobs", ...rest] = path.split("/");
    const page = pages[name] || pages.jobs;
    document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === ({ job: "jobs", search: "searches" }[name] || name)));
    $("#page-title").textContent = page.title;
    const view = $("#view");
    view.innerHTML = "";
    current = page;
    if (!project() && page.needsProject !== false) {
      view.innerHTML = `<div class="card empty">Choose a project at the top right (${me && me.admin ? "type any project name" : "one of yours"}).</div>`;
      if (known.length) {
        view.innerHTML += `<div class="card"><h2>Projects</h2><ul class="project-links">${known.map((p) => `<li><a href="#/jobs" data-project="${esc(p)}">${esc(p)}</a></li>`).join("")}</ul></div>`;
        view.querySelectorAll("[data-project]").forEach((a) => a.addEventListener("click", (e) => {
          e.preventDefault();
          localStorage.setItem(PROJECT, a.dataset.project);
          $("#project").value = a.dataset.project;
          if (location.hash === "#/jobs") route(); else location.hash = "#/jobs";
        }));
      }
      return;
    }
    page.mount(view, ...rest.map(decodeURIComponent));
    tick();
    timer = setInterval(tick, POLL_MS);
  }

  function start() {
    $("#login-form").addEventListener("submit", (e) => {
      e.preventDefault();
      signIn($("#login-token").value.trim(), $("#login-remember").checked);
    });
    $("#logout").addEventListener("click", () => { forget(); me = null; showLogin(); });
    $("#project").addEventListener("change", (e) => {
      const value = e.target.value.trim();
      if (!/^[A-Za-z0-9_-]{1,64}$/.test(value)) { flash("A project name is 1–64 letters, digits, _ or -."); return; }
      localStorage.setItem(PROJECT, value);
      if ((location.hash || "").startsWith("#/job/")) location.hash = "#/jobs"; else route();
    });
    window.addEventListener("hashchange", route);
    if (token()) signIn(token(), !!localStorage.getItem(KEY)); else showLogin();
  }

  return { pages, charts, api, ApiError, jobsPath, jobLink, project, nodes, esc, $, duration, ago, badge, kind, money,
           progress, progressOf, eta, etaText, finishText, workText, etaLabel, FINISHED, flash, start, me: () => me };
})();
