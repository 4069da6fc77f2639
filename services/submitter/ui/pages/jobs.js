/* Jobs: every job of the project with phase, node, progress and ETA; filter by phase and user. */
"use strict";
TM.pages.jobs = (() => {
  const PHASES = ["Running", "Pending", "Creating", "Abnormal", "Terminating", "Completed", "Failed", "Terminated"];
  const state = { phase: "", user: "" };
  let view = null;

  function mount(root) {
    view = root;
    root.innerHTML = `
      <div class="tiles" id="job-tiles"></div>
      <div class="card">
        <div class="filters">
          <div class="chips" id="phase-chips"></div>
          <span class="spacer"></span>
          <select id="user-filter" aria-label="user"><option value="">All users</option></select>
          <a class="btn primary small" href="#/submit">+ New job</a>
        </div>
        <table id="jobs-table">
          <thead><tr><th>Job</th><th>User</th><th>Phase</th><th>Node</th><th>Progress</th><th>ETA (80% interval)</th><th class="num">Running for</th><th class="num">Created</th></tr></thead>
          <tbody><tr><td colspan="8" class="empty">Loading…</td></tr></tbody>
        </table>
      </div>`;
    root.querySelector("#phase-chips").addEventListener("click", (e) => {
      const chip = e.target.closest(".chip");
      if (!chip) return;
      state.phase = chip.dataset.phase;
      refresh();
    });
    root.querySelector("#user-filter").addEventListener("change", (e) => { state.user = e.target.value; refresh(); });
  }

  async function refresh() {
    const [page, nodes] = await Promise.all([TM.api(TM.jobsPath(), { params: { limit: 500 } }), TM.nodes()]);
    if (!view || !view.isConnected) return;
    const kinds = Object.fromEntries(nodes.map((n) => [n.node_id, n.kind]));
    const counts = {};
    page.items.forEach((j) => { counts[j.status.phase] = (counts[j.status.phase] || 0) + 1; });
    const users = [...new Set(page.items.map((j) => j.metadata.user_name))].sort();
    const shown = page.items.filter((j) => (!state.phase || j.status.phase === state.phase)
                                         && (!state.user || j.metadata.user_name === state.user));
    tiles(page, counts);
    view.querySelector("#phase-chips").innerHTML = [["", "All", page.items.length]]
      .concat(PHASES.filter((p) => counts[p] || p === state.phase).map((p) => [p, p, counts[p] || 0]))
      .map(([p, label, n]) => `<button class="chip ${state.phase === p ? "on" : ""}" data-phase="${p}">${label}<span class="n">${n}</span></button>`).join("");
    const select = view.querySelector("#user-filter");
    const options = `<option value="">All users</option>` + users.map((u) => `<option ${u === state.user ? "selected" : ""}>${TM.esc(u)}</option>`).join("");
    if (select.dataset.options !== options) { select.innerHTML = options; select.dataset.options = options; }
    view.querySelector("#jobs-table tbody").innerHTML = shown.length ? shown.map((j) => row(j, kinds)).join("")
      : `<tr><td colspan="8" class="empty">No jobs${state.phase ? ` in phase ${state.phase}` : ""} in project <b>${TM.esc(TM.project())}</b> yet. <a href="#/submit">Submit one</a>.</td></tr>`;
  }

  function tiles(page, counts) {
    const running = page.items.filter((j) => j.status.phase === "Running");
    const gpus = running.reduce((s, j) => s + j.spec.resource.gpu_count * j.spec.resource.node_count, 0);
    const done = (counts.Completed || 0), failed = (counts.Failed || 0);
    view.querySelector("#job-tiles").innerHTML = `
      <div class="tile"><div class="k">Running</div><div class="v">${counts.Running || 0}</div><div class="s">${gpus} GPU${gpus === 1 ? "" : "s"} in use</div></div>
      <div class="tile"><div class="k">Queued</div><div class="v">${(counts.Pending || 0) + (counts.Creating || 0)}</div><div class="s">waiting for a node</div></div>
      <div class="tile"><div class="k">Completed</div><div class="v">${done}</div><div class="s">${done + failed ? Math.round(100 * done / (done + failed)) + "% success" : "no finished jobs"}</div></div>
      <div class="tile"><div class="k">Jobs in project</div><div class="v">${page.total}</div><div class="s">${TM.esc(TM.project())}</div></div>`;
  }

  function row(job, kinds) {
    const s = job.status, m = job.metadata;
    const node = s.node_ids.length ? s.node_ids.map((n) => `${TM.esc(n)} ${TM.kind(kinds[n])}`).join("<br>") : `<span class="muted">–</span>`;
    return `<tr data-job="${TM.esc(m.id)}">
      <td class="name-cell"><a href="#/job/${encodeURIComponent(m.id)}">${TM.esc(m.name)}</a><div class="sub mono">${TM.esc(m.id.slice(0, 8))}${m.description ? " · " + TM.esc(m.description.slice(0, 60)) : ""}</div></td>
      <td>${TM.esc(m.user_name)}</td>
      <td>${TM.badge(s.phase, s.secondary_phase)}</td>
      <td>${node}</td>
      <td>${TM.progress(job)}</td>
      <td>${TM.eta(job)}</td>
      <td class="num">${s.start_time ? TM.duration(s.duration / 1000) : "–"}</td>
      <td class="num muted">${TM.ago(m.create_time)}</td></tr>`;
  }

  return { title: "Jobs", mount, refresh, leave: () => { view = null; } };
})();
