/* Costs: the project's usage and cost by user and by node kind over a period. */
"use strict";
TM.pages.costs = (() => {
  const KIND_COLORS = { local: "#10b981", reserved: "#8b5cf6", on_demand: "#f97316" };
  const PALETTE = ["#4f46e5", "#0ea5e9", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#14b8a6", "#64748b"];
  let view = null, range = "30";

  function mount(root) {
    view = root;
    root.innerHTML = `
      <div class="filters"><div class="chips" id="range-chips">
        ${[["1", "Last 24 h"], ["7", "7 days"], ["30", "30 days"], ["", "All time"]].map(([d, l]) => `<button class="chip ${d === range ? "on" : ""}" data-days="${d}">${l}</button>`).join("")}
      </div><span class="spacer"></span><span class="muted" id="cost-note"></span></div>
      <div class="tiles" id="cost-tiles"></div>
      <div class="grid halves">
        <div class="card"><h2><span>Cost by user</span><span class="muted">$ · GPU hours</span></h2><div class="chart-box short"><canvas id="by-user-chart"></canvas></div></div>
        <div class="card"><h2><span>Cost by node kind</span><span class="muted">local · reserved · on-demand</span></h2><div class="chart-box short"><canvas id="by-kind-chart"></canvas></div></div>
      </div>
      <div class="card hidden" id="owned-card"><h2><span>Owned capacity</span><span class="muted">local and reserved nodes over the period</span></h2>
        <table id="owned-table"><thead><tr><th>Kind</th><th>Utilisation</th><th class="num">Available GPU h</th><th class="num">Busy GPU h</th><th class="num">Idle GPU h</th><th class="num">Amortised cost</th></tr></thead><tbody></tbody></table></div>
      <div class="card"><h2>Breakdown</h2><table id="cost-table"><thead><tr><th>By</th><th>Key</th><th class="num">Attempts</th><th class="num">Hours</th><th class="num">GPU hours</th><th class="num">Cost</th></tr></thead><tbody></tbody></table></div>`;
    root.querySelector("#range-chips").addEventListener("click", (e) => {
      const chip = e.target.closest(".chip");
      if (!chip) return;
      range = chip.dataset.days;
      root.querySelectorAll("#range-chips .chip").forEach((c) => c.classList.toggle("on", c === chip));
      refresh();
    });
  }

  function chart(key, canvas, config) {
    let c = TM.charts[key];
    if (!c || c.canvas !== canvas) { if (c) c.destroy(); c = TM.charts[key] = new Chart(canvas, config); return c; }
    c.data = config.data;
    c.update("none");
    return c;
  }

  async function refresh() {
    const params = range ? { from: new Date(Date.now() - Number(range) * 86400e3).toISOString() } : {};
    const report = await TM.api(`/v2/${encodeURIComponent(TM.project())}/usage`, { params });
    if (!view || !view.isConnected) return;
    const t = report.total;
    view.querySelector("#cost-tiles").innerHTML = `
      <div class="tile"><div class="k">Cost</div><div class="v">${TM.money(t.cost)}</div><div class="s">${report.open_attempts ? `${report.open_attempts} attempt(s) still running` : "all attempts closed"}</div></div>
      <div class="tile"><div class="k">GPU hours</div><div class="v">${t.gpu_hours.toFixed(t.gpu_hours < 1 ? 3 : 2)}</div><div class="s">${(t.seconds / 3600).toFixed(t.seconds < 3600 ? 3 : 2)} node hours</div></div>
      <div class="tile"><div class="k">Attempts</div><div class="v">${t.attempts}</div><div class="s">task attempts charged</div></div>
      <div class="tile"><div class="k">Per GPU hour</div><div class="v">${t.gpu_hours ? TM.money(t.cost / t.gpu_hours) : "–"}</div><div class="s">blended price</div></div>`;
    view.querySelector("#cost-note").textContent = `project ${TM.project()} · ${range ? "since " + new Date(params.from).toLocaleDateString() : "all time"}`;
    const users = report.by_user, kinds = report.by_node_kind;
    const axis = { grid: { color: "#f1f5f9" }, ticks: { color: "#64748b" } };
    chart("byUser", view.querySelector("#by-user-chart"), {
      type: "bar",
      data: { labels: users.map((u) => u.key), datasets: [
        { label: "cost ($)", data: users.map((u) => u.cost), backgroundColor: "#4f46e5", borderRadius: 6, yAxisID: "y" },
        { label: "GPU hours", data: users.map((u) => u.gpu_hours), backgroundColor: "#a5b4fc", borderRadius: 6, yAxisID: "y1" }] },
      options: { animation: false, responsive: true, maintainAspectRatio: false,
                 plugins: { legend: { position: "bottom", labels: { boxWidth: 12, color: "#334155" } } },
                 scales: { x: axis, y: { ...axis, beginAtZero: true, title: { display: true, text: "$", color: "#64748b" } },
                           y1: { ...axis, beginAtZero: true, position: "right", grid: { display: false }, title: { display: true, text: "GPU h", color: "#64748b" } } } },
    });
    chart("byKind", view.querySelector("#by-kind-chart"), {
      type: "doughnut",
      data: { labels: kinds.map((k) => k.key.replace("_", "-")), datasets: [{ data: kinds.map((k) => k.cost),
              backgroundColor: kinds.map((k, i) => KIND_COLORS[k.key] || PALETTE[i % PALETTE.length]), borderWidth: 2, borderColor: "#fff" }] },
      options: { animation: false, responsive: true, maintainAspectRatio: false, cutout: "62%",
                 plugins: { legend: { position: "right", labels: { boxWidth: 12, color: "#334155" } },
                            tooltip: { callbacks: { label: (c) => `${c.label}: ${TM.money(c.parsed)}` } } } },
    });
    owned(report.owned || {});
    const rows = [...users.map((u) => ["user", u]), ...kinds.map((k) => ["node kind", k])];
    view.querySelector("#cost-table tbody").innerHTML = rows.map(([by, r]) => `<tr><td class="muted">${by}</td><td><b>${TM.esc(r.key)}</b></td>
      <td class="num">${r.attempts}</td><td class="num">${(r.seconds / 3600).toFixed(3)}</td><td class="num">${r.gpu_hours.toFixed(3)}</td><td class="num">${TM.money(r.cost)}</td></tr>`).join("")
      || `<tr><td colspan="6" class="empty">No usage in this period.</td></tr>`;
  }

  function owned(kinds) {
    const entries = Object.entries(kinds);
    view.querySelector("#owned-card").classList.toggle("hidden", !entries.length);
    view.querySelector("#owned-table tbody").innerHTML = entries.map(([kind, o]) => {
      const u = o.utilisation === null || o.utilisation === undefined ? null : o.utilisation;
      const bar = u === null ? `<span class="muted">–</span>` : TM.progress({ status: { eta: { progress: u }, phase: "" } });
      return `<tr><td>${TM.kind(kind)}</td><td>${bar}</td><td class="num">${(o.available_gpu_hours || 0).toFixed(2)}</td>
        <td class="num">${(o.busy_gpu_hours || 0).toFixed(3)}</td><td class="num">${(o.idle_gpu_hours || 0).toFixed(2)}</td><td class="num">${TM.money(o.amortised_cost)}</td></tr>`;
    }).join("");
  }

  return { title: "Costs", mount, refresh,
           leave: () => { view = null; ["byUser", "byKind"].forEach((k) => { if (TM.charts[k]) { TM.charts[k].destroy(); TM.charts[k] = null; } }); } };
})();
