/* Searches: the project's hyperparameter searches; one search: its trials' curves on one chart and a table of
   parameters, value and state (pruned trials greyed). Everything shown is escaped or set as text. */
"use strict";
(() => {
  const CURVE_MS = 5000;  // trials' curves are fetched at most this often (finished trials once)
  const path = (id = "") => `/v2/${encodeURIComponent(TM.project())}/searches${id ? "/" + encodeURIComponent(id) : ""}`;
  const num = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? String(Number(v.toPrecision(6))) : TM.esc(v));

  let listView = null;
  TM.pages.searches = {
    title: "Searches",
    mount(root) {
      listView = root;
      root.innerHTML = `<div class="card"><table id="searches-table">
        <thead><tr><th>Search</th><th>User</th><th>Phase</th><th>Pruner</th><th class="num">Trials</th><th class="num">Best</th><th class="num">Created</th></tr></thead>
        <tbody><tr><td colspan="7" class="empty">Loading…</td></tr></tbody></table>
        <p class="muted small">Start one with <code>trainmaster search create -f search.yaml</code> or <code>POST ${TM.esc(path())}</code>.</p></div>`;
    },
    async refresh() {
      const page = await TM.api(path(), { params: { limit: 200 } });
      if (!listView || !listView.isConnected) return;
      listView.querySelector("tbody").innerHTML = page.items.length ? page.items.map((s) => {
        const done = s.trials.filter((t) => t.state !== "Running").length, best = s.status.best;
        return `<tr data-search="${TM.esc(s.metadata.id)}">
          <td class="name-cell"><a href="#/search/${encodeURIComponent(s.metadata.id)}">${TM.esc(s.metadata.name)}</a><div class="sub mono">${TM.esc(s.metadata.id)}</div></td>
          <td>${TM.esc(s.metadata.user_name)}</td><td>${TM.badge(s.status.phase)}</td><td>${TM.esc(s.spec.pruner)}</td>
          <td class="num">${done}/${TM.esc(s.spec.max_trials)}</td><td class="num">${best ? num(best.value) : "–"}</td>
          <td class="num muted">${TM.ago(s.metadata.create_time)}</td></tr>`;
      }).join("") : `<tr><td colspan="7" class="empty">No searches in project <b>${TM.esc(TM.project())}</b> yet.</td></tr>`;
    },
    leave() { listView = null; },
  };

  let view = null, searchId = null, curves = {}, fetched = {};
  TM.pages.search = {
    title: "Search",
    mount(root, id) {
      view = root; searchId = id; curves = {}; fetched = {};
      root.innerHTML = `
        <div class="card"><h2><span id="search-title"></span><span class="muted" id="search-note"></span></h2>
          <div id="search-summary" class="muted"></div>
          <button id="search-stop" class="btn ghost small hidden">Stop search</button></div>
        <div class="card"><h2>Trials' curves <span class="muted" id="curve-note"></span></h2>
          <div class="chart-box"><canvas id="search-chart"></canvas></div></div>
        <div class="card"><table id="trials-table"><thead></thead><tbody></tbody></table></div>`;
      root.querySelector("#search-stop").addEventListener("click", async () => {
        try { await TM.api(path(searchId) + "/actions", { method: "POST", body: { action_type: "stop" } }); TM.flash("Stopping the search.", "ok"); }
        catch (e) { TM.flash(String(e)); }
      });
    },
    async refresh() {
      const search = await TM.api(path(searchId));
      if (!view || !view.isConnected) return;
      const s = search.status, spec = search.spec;
      view.querySelector("#search-title").textContent = `${search.metadata.name} · ${s.phase}`;
      view.querySelector("#search-note").textContent = `${spec.objective.mode} ${spec.objective.metric} · pruner ${spec.pruner} · parallelism ${spec.parallelism}`;
      const best = s.best ? `best: trial ${s.best.trial} = ${num(s.best.value)}` : "no value yet";
      const states = {};
      search.trials.forEach((t) => { states[t.state.toLowerCase()] = (states[t.state.toLowerCase()] || 0) + 1; });
      const counts = Object.entries(states).map(([k, n]) => `${n} ${k}`).join(", ") || "none started";
      view.querySelector("#search-summary").textContent = `${best} · trials: ${counts} (of ${spec.max_trials}) · ${s.gpu_hours.toFixed(3)} GPU-hours${s.message ? " · " + s.message : ""}${s.reason ? " · " + s.reason : ""}`;
      view.querySelector("#search-stop").classList.toggle("hidden", s.phase !== "Running");
      table(search);
      await fetchCurves(search);
      if (view && view.isConnected) chart(search);
    },
    leave() { view = null; if (TM.charts.search) { TM.charts.search.destroy(); TM.charts.search = null; } },
  };

  function table(search) {
    const names = Object.keys(search.spec.space).sort(), bestTrial = search.status.best ? search.status.best.trial : -1;
    view.querySelector("#trials-table thead").innerHTML = `<tr><th>Trial</th><th>State</th>${names.map((n) => `<th class="num">${TM.esc(n)}</th>`).join("")}<th class="num">Value</th><th class="num">Step</th><th>Reason</th></tr>`;
    view.querySelector("#trials-table tbody").innerHTML = search.trials.map((t) => `
      <tr data-trial="${t.trial}" data-state="${TM.esc(t.state)}" class="${t.state === "Pruned" ? "pruned" : ""}${t.trial === bestTrial ? " best" : ""}">
        <td><a href="#/job/${encodeURIComponent(t.job_id)}">#${t.trial}</a><div class="sub mono">${TM.esc(t.job_id)}</div></td>
        <td>${TM.badge(t.state)}</td>
        ${names.map((n) => `<td class="num">${num(t.parameters[n])}</td>`).join("")}
        <td class="num">${num(t.value)}</td><td class="num">${num(t.step)}</td><td class="small muted">${TM.esc(t.reason)}</td></tr>`).join("")
      || `<tr><td colspan="${names.length + 5}" class="empty">No trial started yet.</td></tr>`;
  }

  async function fetchCurves(search) {
    const metric = search.spec.objective.metric, now = Date.now();
    const due = search.trials.filter((t) => !(t.job_id in curves) || (t.state === "Running" && now - (fetched[t.job_id] || 0) > CURVE_MS)
                                            || (t.state !== "Running" && !fetched[t.job_id + ":final"]));
    await Promise.all(due.slice(0, 16).map(async (t) => {
      try {
        const report = await TM.api(`/v2/${encodeURIComponent(TM.project())}/training-jobs/${encodeURIComponent(t.job_id)}/metrics`, { params: { max_points: 500 } });
        const series = report.series.find((x) => x.name === metric);
        curves[t.job_id] = series ? series.points : [];
        fetched[t.job_id] = now;
        if (t.state !== "Running") fetched[t.job_id + ":final"] = true;
      } catch (_) { curves[t.job_id] = curves[t.job_id] || []; }
    }));
  }

  /** The y axis: the 2nd to 98th percentile of every value (a first loss of 25 does not flatten the rest), on a
   * log scale when the values are positive and span more than a factor of 20. */
  function yScale(values) {
    const v = values.filter(Number.isFinite).sort((a, b) => a - b);
    if (v.length < 2) return { type: "linear", min: undefined, max: undefined };
    const q = (f) => v[Math.min(v.length - 1, Math.floor(f * (v.length - 1)))];
    const low = q(0.02), high = q(0.98);
    if (low > 0 && high / low > 20) return { type: "logarithmic", min: low / 1.2, max: high * 1.2 };
    const pad = (high - low) * 0.05 || Math.abs(high) * 0.05 || 1;
    return { type: "linear", min: low - pad, max: high + pad };
  }

  function chart(search) {
    const bestTrial = search.status.best ? search.status.best.trial : -1;
    const datasets = search.trials.map((t) => {
      const points = curves[t.job_id] || [], t0 = points.length ? points[0][0] : 0;
      const pruned = t.state === "Pruned" || t.state === "Failed";
      return { label: `#${t.trial} ${t.state}`, data: points.map(([time, v, step], i) => ({ x: step ?? (time - t0), y: v })),
               borderColor: t.trial === bestTrial ? "#16a34a" : pruned ? "#cbd5e1" : `hsl(${(t.trial * 47) % 360} 65% 50%)`,
               borderDash: pruned ? [4, 3] : [], borderWidth: t.trial === bestTrial ? 3 : 1.5, pointRadius: 0, fill: false };
    });
    view.querySelector("#curve-note").textContent = `${search.spec.objective.metric} by step · pruned greyed · best in green`;
    let c = TM.charts.search;
    if (!c || c.canvas !== view.querySelector("#search-chart")) {
      if (c) c.destroy();
      c = TM.charts.search = new Chart(view.querySelector("#search-chart"), {
        type: "line", data: { datasets: [] },
        options: { animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
                   scales: { x: { type: "linear", title: { display: true, text: "step", color: "#64748b" } },
                             y: { title: { display: true, text: search.spec.objective.metric, color: "#64748b" } } },
                   plugins: { legend: { display: false } } },
      });
    }
    Object.assign(c.options.scales.y, yScale(datasets.flatMap((d) => d.data.map((p) => p.y))));
    c.data.datasets = datasets;
    c.update("none");
  }
})();
