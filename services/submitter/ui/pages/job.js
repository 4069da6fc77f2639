/* One job: live metric curve with its target and ETA band, attempts timeline, live log tail, terminate/migrate. */
"use strict";
TM.pages.job = (() => {
  let view = null, jobId = null, job = null, metric = null, gone = false, logBusy = false, finalLogs = 0, cost = null, why = "";

  // The ETA band: where the estimator says the run ends (low–high), and its best guess, over the metric curve.
  const etaBand = {
    id: "etaBand",
    beforeDatasetsDraw(chart, _args, opts) {
      if (!opts || opts.from === null || opts.from === undefined) return;
      const { ctx, chartArea: area, scales: { x } } = chart;
      const left = Math.max(area.left, x.getPixelForValue(opts.from)), right = Math.min(area.right, x.getPixelForValue(opts.to));
      const at = x.getPixelForValue(opts.at), now = x.getPixelForValue(opts.now);
      ctx.save();
      ctx.fillStyle = "rgba(99, 102, 241, 0.12)";
      ctx.fillRect(left, area.top, Math.max(2, right - left), area.bottom - area.top);
      ctx.setLineDash([5, 4]);
      ctx.lineWidth = 1.5;
      ctx.strokeStyle = "rgba(79, 70, 229, 0.9)";
      ctx.beginPath(); ctx.moveTo(at, area.top); ctx.lineTo(at, area.bottom); ctx.stroke();
      ctx.strokeStyle = "rgba(100, 116, 139, 0.7)";
      ctx.beginPath(); ctx.moveTo(now, area.top); ctx.lineTo(now, area.bottom); ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = "#4f46e5";
      ctx.font = "600 11px system-ui, sans-serif";
      ctx.textAlign = "center";
      ctx.fillText("ETA", Math.min(area.right - 14, at), area.top + 12);
      ctx.fillStyle = "#64748b";
      ctx.fillText("now", now, area.bottom - 6);
      ctx.restore();
      chart.canvas.dataset.band = "drawn";
    },
  };

  function mount(root, id) {
    view = root; jobId = id; job = null; metric = null; gone = false; finalLogs = 0;
    root.innerHTML = `
      <div class="job-head">
        <div><h2><span id="job-name">…</span><span id="job-phase"></span></h2><div class="sub" id="job-sub"></div></div>
        <div class="actions">
          <a class="btn ghost" href="#/jobs">← All jobs</a>
          <button class="btn" id="btn-migrate" title="Snapshot now and continue on another node">Migrate</button>
          <button class="btn danger" id="btn-terminate">Terminate</button>
        </div>
      </div>
      <div class="tiles" id="job-tiles"></div>
      <div class="grid two">
        <div class="card">
          <h2><span>Training curve</span><select id="metric-select" class="hidden"></select><span class="muted" id="curve-note"></span></h2>
          <div class="chart-box"><canvas id="metric-chart"></canvas></div>
          <div class="legend-note"><span><i style="background:#4f46e5"></i>metric</span><span><i style="background:#e11d48"></i>target</span>
            <span><i style="background:rgba(99,102,241,.25)"></i>ETA interval (10th–90th percentile)</span><span><i style="background:#a5b4fc"></i>projection</span></div>
        </div>
        <div class="card">
          <h2><span>GPUs</span><span class="muted" id="gpu-note"></span></h2>
          <div class="chart-box"><canvas id="gpu-chart"></canvas></div>
          <div class="legend-note"><span><i style="background:#0d9488"></i>utilisation %</span><span><i style="background:#d97706"></i>memory GB</span>
            <span><i style="background:#f59e0b"></i>peak memory GB</span></div>
        </div>
      </div>
      <div class="card"><h2>Details</h2><dl class="facts" id="job-facts"></dl></div>
      <div class="card"><h2><span>Attempts</span><span class="muted">placed → started → ended, per try</span></h2><div class="timeline" id="timeline"></div></div>
      <div class="card"><h2><span>Output</span><span class="muted" id="log-note">worker-0 · live</span></h2><pre class="logs" id="logs"></pre></div>`;
    root.querySelector("#btn-terminate").addEventListener("click", () => act("terminate"));
    root.querySelector("#btn-migrate").addEventListener("click", () => act("migrate"));
    root.querySelector("#metric-select").addEventListener("change", (e) => { metric = e.target.value; refresh(); });
  }

  async function act(action) {
    if (!job) return;
    const question = action === "terminate" ? `Terminate ${job.metadata.name}? Its tasks get SIGTERM, then SIGKILL after ${job.spec.termination_grace_s}s.`
                                            : `Migrate ${job.metadata.name}? It snapshots now and continues on another node.`;
    if (!confirm(question)) return;
    try {
      job = await TM.api(`${TM.jobsPath(jobId)}/actions`, { method: "POST", body: { action_type: action } });
      TM.flash(`${action === "terminate" ? "Termination" : "Migration"} of ${job.metadata.name} requested.`, "ok");
      render();
    } catch (e) { TM.flash(String(e)); }
  }

  async function refresh() {
    if (gone) return;
    try { job = await TM.api(TM.jobsPath(jobId)); } catch (e) {
      if (view) view.innerHTML = `<div class="card empty">${TM.esc(String(e))} · <a href="#/jobs">back to jobs</a></div>`;
      gone = true;
      return;
    }
    if (!view || !view.isConnected) return;
    const [nodes, curves, usage, placements] = await Promise.all([TM.nodes(), TM.api(`${TM.jobsPath(jobId)}/metrics`).catch(() => ({ series: [] })),
      TM.api(`/v2/${encodeURIComponent(TM.project())}/usage`, { params: { job_id: jobId } }).catch(() => null),
      TM.api(`${TM.jobsPath(jobId)}/placements`).catch(() => [])]);
    cost = usage ? usage.total.cost : null;
    why = placements.length ? placements[placements.length - 1].why : "";
    render(nodes, curves.series);
    logs();
  }

  // A node as the fleet lists it: kind, GPU model(s), price per hour.
  function nodeText(id, byId) {
    const n = byId[id];
    if (!n) return TM.esc(id);
    const models = [...new Set((n.gpus || []).map((g) => g.model))].join(", ");
    return `${TM.esc(id)} ${TM.kind(n.kind)}<span class="sub">${models ? TM.esc(models) + " · " : ""}${TM.money(n.price_per_hour || 0)}/h</span>`;
  }

  function render(nodes = [], series = null) {
    const s = job.status, m = job.metadata, r = job.spec.resource, p = job.spec.placement;
    const byId = Object.fromEntries(nodes.map((n) => [n.node_id, n]));
    const finished = TM.FINISHED.includes(s.phase);
    view.querySelector("#job-name").textContent = m.name;
    view.querySelector("#job-phase").innerHTML = TM.badge(s.phase, s.secondary_phase);
    view.querySelector("#job-sub").innerHTML = `<a class="mono" id="job-link" href="${TM.esc(TM.jobLink(m.id))}" title="a link that opens this job">${TM.esc(m.id)}</a> · ${TM.esc(m.user_name)} · created ${TM.ago(m.create_time)}${m.description ? " · " + TM.esc(m.description) : ""}`;
    view.querySelector("#btn-terminate").disabled = finished || s.phase === "Terminating";
    view.querySelector("#btn-migrate").disabled = s.phase !== "Running";
    const e = s.eta;
    view.querySelector("#job-tiles").innerHTML = `
      <div class="tile"><div class="k">Progress</div><div class="v">${TM.progressOf(job) === null ? "–" : Math.round(TM.progressOf(job) * 100) + "%"}</div><div class="s">${TM.progress(job)}</div><div class="s" id="progress-source">${TM.workText(e)}</div></div>
      <div class="tile"><div class="k" id="eta-label">${TM.etaLabel(e)}</div><div class="v" id="eta-text">${e && e.target === "reached" && e.until !== "end" ? "reached" : e ? TM.etaText(e).main : "–"}</div><div class="s">${e ? TM.etaText(e).band : finished ? "finished" : "estimating…"}</div></div>
      <div class="tile"><div class="k">Finishes</div><div class="v">${e ? TM.finishText(e).main : s.end_time ? new Date(s.end_time).toLocaleTimeString() : "–"}</div><div class="s">${e ? [TM.finishText(e).band, "method: " + TM.esc(e.method)].filter(Boolean).join(" · ") : s.end_time ? "ended" : ""}</div></div>
      <div class="tile"><div class="k">Running for</div><div class="v">${s.start_time ? TM.duration(s.duration / 1000) : "–"}</div><div class="s">attempt ${s.attempt || "–"}${p.expected_duration_s ? ` · expected ${TM.duration(p.expected_duration_s)}` : ""}</div></div>`;
    const exits = (s.task_statuses || []).filter((t) => t.exit_code !== null || t.message).map((t) => `${TM.esc(t.task)}: exit ${t.exit_code ?? "–"}${t.message ? " · " + TM.esc(t.message.trim().slice(0, 160)) : ""}`).join("<br>");
    view.querySelector("#job-facts").innerHTML = [
      ["Node", s.node_ids.length ? s.node_ids.map((n) => nodeText(n, byId)).join("<br>") : "–"],
      ["Cost so far", `<span id="job-cost">${cost === null ? "–" : TM.money(cost)}</span>`],
      ["Why here", `<span id="job-why" class="small">${TM.esc(why) || "–"}</span>`],
      ["Resources", `${r.node_count} × (${r.gpu_count} GPU${r.min_gpu_memory_gb ? ` ≥${r.min_gpu_memory_gb} GB` : ""}, ${r.cpu_count} CPU, ${r.memory_gb} GB)`],
      ["Placement", `${TM.esc(p.allowed)} nodes · optimise ${p.priority === "cost" ? "cost" : "time"}`],
      ["Command", `<pre class="cmd">${TM.esc(job.algorithm.command)}</pre>`],
      ["Parameters", job.algorithm.parameters.map((x) => `<code>${TM.esc(x.name)}=${TM.esc(x.value)}</code>`).join(" ") || "–"],
      ["Reason", TM.esc(s.reason) || "–"],
      ["Exit", exits || "–"],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
    timeline();
    if (series) { curve(series.filter((x) => !x.system)); gpus(series.filter((x) => x.system)); }
  }

  // The platform's own GPU telemetry of the job (system series): utilisation on the left axis, memory on the right.
  function gpus(series) {
    const by = Object.fromEntries(series.map((x) => [x.name, x]));
    const note = view.querySelector("#gpu-note");
    const util = by.gpu_util;
    if (!util || !util.points.length) { note.textContent = job.spec.resource.gpu_count ? "no GPU readings yet" : "no GPUs"; return; }
    const s = job.status, t0 = s.start_time ? s.start_time / 1000 : util.points[0][0];
    const xy = (name) => ((by[name] || { points: [] }).points).map(([t, v]) => ({ x: t - t0, y: v }));
    const last = (name) => { const p = (by[name] || { points: [] }).points; return p.length ? p[p.length - 1][1] : null; };
    const memory = last("gpu_memory_gb"), peak = last("gpu_memory_peak_gb");
    note.textContent = `now ${Math.round(last("gpu_util"))}% busy` + (memory === null ? "" : ` · ${memory.toFixed(1)} GB`)
      + (peak === null ? "" : ` · peak ${peak.toFixed(1)} GB`);
    const data = [xy("gpu_util"), xy("gpu_memory_gb"), xy("gpu_memory_peak_gb")];
    let chart = TM.charts.gpu;
    if (!chart || chart.canvas !== view.querySelector("#gpu-chart")) {
      if (chart) chart.destroy();
      const axis = (text) => ({ title: { display: true, text, color: "#64748b" }, grid: { color: "#f1f5f9" }, ticks: { color: "#64748b" } });
      chart = TM.charts.gpu = new Chart(view.querySelector("#gpu-chart"), {
        type: "line",
        data: { datasets: [
          { label: "utilisation %", data: [], yAxisID: "y", borderColor: "#0d9488", pointRadius: 0, borderWidth: 2 },
          { label: "memory GB", data: [], yAxisID: "mem", borderColor: "#d97706", pointRadius: 0, borderWidth: 2 },
          { label: "peak memory GB", data: [], yAxisID: "mem", borderColor: "#f59e0b", borderDash: [4, 3], pointRadius: 0, borderWidth: 1.5 },
        ] },
        options: {
          animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
          interaction: { mode: "nearest", intersect: false },
          scales: {
            x: { type: "linear", min: 0, title: { display: true, text: "seconds since start", color: "#64748b" }, grid: { color: "#f1f5f9" },
                 ticks: { color: "#64748b", callback: (v) => TM.duration(v) } },
            y: { ...axis("utilisation %"), min: 0, max: 100 },
            mem: { ...axis("memory GB"), min: 0, position: "right", grid: { drawOnChartArea: false } },
          },
          plugins: { legend: { display: false }, tooltip: { callbacks: { title: (items) => TM.duration(items[0].parsed.x) } } },
        },
      });
    }
    data.forEach((d, i) => { chart.data.datasets[i].data = d; });
    chart.update("none");
  }

  function curve(series) {
    const select = view.querySelector("#metric-select");
    const names = series.map((x) => x.name);
    if (!metric || !names.includes(metric)) metric = (series.find((x) => x.target !== null) || series[0] || {}).name;
    select.classList.toggle("hidden", names.length < 2);
    const options = names.map((n) => `<option ${n === metric ? "selected" : ""}>${TM.esc(n)}</option>`).join("");
    if (select.dataset.options !== options) { select.innerHTML = options; select.dataset.options = options; }
    const one = series.find((x) => x.name === metric);
    const note = view.querySelector("#curve-note");
    if (!one) { note.textContent = job.algorithm.metrics.length ? "waiting for the first point…" : "no metrics declared for this job"; return; }
    const s = job.status;
    const t0 = s.start_time ? s.start_time / 1000 : one.points.length ? one.points[0][0] : Date.now() / 1000;
    const points = one.points.map(([t, v]) => ({ x: t - t0, y: v }));
    const now = Date.now() / 1000 - t0, e = s.eta;
    const band = e ? { from: now + e.low_s, to: now + e.high_s, at: now + e.remaining_s, now } : { from: null };
    const last = points[points.length - 1];
    const xmax = Math.max(last ? last.x : 1, e ? band.to : 0) * 1.04 + 1;
    const target = one.target === null ? [] : [{ x: 0, y: one.target }, { x: xmax, y: one.target }];
    const projection = e && last && one.target !== null ? [last, { x: band.at, y: one.target }] : [];
    note.textContent = `${points.length} points · ${one.mode === "max" ? "higher" : "lower"} is better${one.target !== null ? ` · target ${one.target}` : ""}`;
    const data = [points, target, projection];
    let chart = TM.charts.metric;
    if (!chart || chart.canvas !== view.querySelector("#metric-chart")) {
      if (chart) chart.destroy();
      chart = TM.charts.metric = new Chart(view.querySelector("#metric-chart"), {
        type: "line",
        data: { datasets: [
          { label: one.name, data: [], borderColor: "#4f46e5", fill: false, pointRadius: 0, borderWidth: 2, tension: .25 },
          { label: "target", data: [], borderColor: "#e11d48", borderDash: [6, 4], pointRadius: 0, borderWidth: 1.5 },
          { label: "projection", data: [], borderColor: "#a5b4fc", borderDash: [3, 3], pointRadius: 0, borderWidth: 2 },
        ] },
        options: {
          animation: false, responsive: true, maintainAspectRatio: false, parsing: false, normalized: true,
          interaction: { mode: "nearest", intersect: false },
          scales: {
            x: { type: "linear", min: 0, title: { display: true, text: "seconds since start", color: "#64748b" }, grid: { color: "#f1f5f9" },
                 ticks: { color: "#64748b", callback: (v) => TM.duration(v) } },
            y: { title: { display: true, text: one.name, color: "#64748b" }, grid: { color: "#f1f5f9" }, ticks: { color: "#64748b" } },
          },
          plugins: { legend: { display: false }, etaBand: band,
                     tooltip: { callbacks: { title: (items) => TM.duration(items[0].parsed.x) } } },
        },
        plugins: [etaBand],
      });
    }
    data.forEach((d, i) => { chart.data.datasets[i].data = d; });
    chart.data.datasets[0].label = one.name;
    chart.options.scales.x.max = xmax;
    chart.options.scales.y.title.text = one.name;
    chart.options.plugins.etaBand = band;
    chart.update("none");
  }

  function timeline() {
    const s = job.status, el = view.querySelector("#timeline");
    const attempts = s.attempts || [];
    if (!attempts.length) { el.innerHTML = `<div class="muted">Not placed yet: ${TM.esc(s.secondary_phase)}.</div>`; return; }
    const nowMs = Date.now();
    const start = Math.min(job.metadata.create_time, ...attempts.map((a) => a.placed_at || nowMs));
    const end = Math.max(s.end_time || nowMs, ...attempts.map((a) => a.end_time || 0)), span = Math.max(1, end - start);
    const pct = (t) => `${(100 * (t - start) / span).toFixed(2)}%`;
    el.innerHTML = attempts.map((a) => {
      const running = !a.end_time && !TM.FINISHED.includes(s.phase);
      const stop = a.end_time || (running ? nowMs : s.end_time || nowMs);
      const cls = running ? "running" : a.outcome === "completed" ? "completed" : /fail|oom|lost|error/.test(a.outcome) ? "failed" : "other";
      const bar = a.start_time ? `<div class="tl-bar ${cls}" style="left:${pct(a.start_time)};width:calc(${pct(stop)} - ${pct(a.start_time)})">${TM.esc(a.node_ids.join(", "))}</div>` : "";
      const wait = `<div class="tl-wait" style="left:${pct(a.placed_at)};width:calc(${pct(a.start_time || stop)} - ${pct(a.placed_at)})"></div>`;
      return `<div class="tl-row"><div><b>#${a.attempt}</b> <span class="muted">${TM.esc(a.reason)}</span></div><div class="tl-track">${wait}${bar}</div>
        <div class="muted">${a.start_time ? TM.duration((stop - a.start_time) / 1000) : "starting"} · ${TM.esc(a.outcome || (running ? "running" : "–"))}</div></div>`;
    }).join("");
  }

  async function logs() {
    if (finalLogs >= 3 || logBusy) return;
    logBusy = true;
    try {
      const text = await TM.api(`${TM.jobsPath(jobId)}/logs`, { raw: true });
      const pre = view && view.querySelector("#logs");
      if (!pre) return;
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 30;
      const lines = text.split("\n");
      const tail = lines.length > 500 ? lines.slice(-500).join("\n") : text;
      if (pre.textContent !== tail) pre.textContent = tail || "(no output yet)";
      if (stick) pre.scrollTop = pre.scrollHeight;
      if (TM.FINISHED.includes(job.status.phase) && ++finalLogs >= 3) {  // the last lines may land after the end
        view.querySelector("#log-note").textContent = "worker-0 · complete";
      }
    } catch (_) { /* next tick */ } finally { logBusy = false; }
  }

  return { title: "Job", mount, refresh, leave: () => { view = null; ["metric", "gpu"].forEach((k) => { if (TM.charts[k]) { TM.charts[k].destroy(); TM.charts[k] = null; } }); } };
})();
