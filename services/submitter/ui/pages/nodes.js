/* Nodes: the fleet with kind, GPUs, TFLOPS, price, state and the jobs on each node. */
"use strict";
TM.pages.nodes = (() => {
  let view = null;

  function mount(root) {
    view = root;
    root.innerHTML = `<div class="tiles" id="node-tiles"></div>
      <div class="card"><h2><span>Fleet</span><span class="muted" id="node-note"></span></h2>
        <table id="nodes-table"><thead><tr><th>Node</th><th>Kind</th><th>State</th><th>GPUs</th><th class="num">TFLOPS</th>
          <th class="num">CPU</th><th class="num">Memory</th><th class="num">Price / h</th><th>Current job</th><th class="num">Last seen</th></tr></thead>
        <tbody><tr><td colspan="10" class="empty">Loading…</td></tr></tbody></table></div>`;
  }

  function gpus(node) {
    const groups = {};
    (node.gpus || []).forEach((g) => { const k = `${g.model} · ${g.memory_gb} GB`; groups[k] = (groups[k] || 0) + 1; });
    const read = (node.gpus || []).filter((g) => g.util_percent !== null && g.util_percent !== undefined);
    const now = read.map((g) => `<div class="muted">#${Number(g.index)}: ${Math.round(Number(g.util_percent))}% · ${Number(g.memory_used_gb).toFixed(1)} GB</div>`).join("");
    return (Object.entries(groups).map(([k, n]) => `<div><b>${n}×</b> ${TM.esc(k)}</div>`).join("") + now) || `<span class="muted">none</span>`;
  }

  /** Tasks of the signed-in person's projects link to their job; others' only count (the admin sees all). */
  function jobs(node) {
    const own = (node.running || []).map((r) => {
      const link = r.project_id === TM.project() ? `<a class="mono" href="#/job/${encodeURIComponent(r.job_id)}">${TM.esc(r.job_id.slice(0, 8))}</a>`
        : `<span class="mono" title="project ${TM.esc(r.project_id)}">${TM.esc(r.job_id.slice(0, 8))}</span>`;
      return `${link} <span class="muted">#${TM.esc(r.attempt)} · rank ${TM.esc(r.rank)}</span>`;
    });
    if (node.other_tasks) own.push(`<span class="muted">${node.other_tasks} task${node.other_tasks > 1 ? "s" : ""} of other projects</span>`);
    return own.join("<br>") || `<span class="muted">idle</span>`;
  }

  async function refresh() {
    const answer = await TM.api("/v2/nodes");
    if (!view || !view.isConnected) return;
    const items = answer.items.slice().sort((a, b) => ["local", "reserved", "on_demand"].indexOf(a.kind) - ["local", "reserved", "on_demand"].indexOf(b.kind) || a.node_id.localeCompare(b.node_id));
    const count = (state) => items.filter((n) => n.state === state).length;
    const totalGpus = items.reduce((s, n) => s + (n.gpus || []).length, 0);
    const tflops = items.reduce((s, n) => s + (n.gpus || []).reduce((t, g) => t + g.tflops, 0), 0);
    const burn = items.filter((n) => n.state === "busy").reduce((s, n) => s + (n.price_per_hour || 0), 0);
    view.querySelector("#node-tiles").innerHTML = `
      <div class="tile"><div class="k">Nodes</div><div class="v">${items.length}</div><div class="s">${count("ready")} ready · ${count("busy")} busy · ${count("lost")} lost</div></div>
      <div class="tile"><div class="k">GPUs</div><div class="v">${totalGpus}</div><div class="s">on ${items.filter((n) => (n.gpus || []).length).length} nodes</div></div>
      <div class="tile"><div class="k">Fleet compute</div><div class="v">${Math.round(tflops).toLocaleString()}</div><div class="s">TFLOPS in total</div></div>
      <div class="tile"><div class="k">Spending now</div><div class="v">${TM.money(burn)}</div><div class="s">per hour on busy nodes</div></div>`;
    view.querySelector("#node-note").textContent = `${items.length} registered · refreshed ${new Date().toLocaleTimeString()}`;
    view.querySelector("#nodes-table tbody").innerHTML = items.map((n) => `<tr data-node="${TM.esc(n.node_id)}">
      <td class="name-cell"><b>${TM.esc(n.node_id)}</b>${n.virtual ? `<div class="sub">virtual</div>` : ""}</td>
      <td>${TM.kind(n.kind)}</td>
      <td><span class="badge b-${TM.esc(n.state)}">${TM.esc(n.state)}</span></td>
      <td><div class="gpu-list">${gpus(n)}</div></td>
      <td class="num">${(n.gpus || []).reduce((t, g) => t + g.tflops, 0).toLocaleString()}</td>
      <td class="num">${n.cpu_count ?? "–"}</td>
      <td class="num">${n.memory_gb ?? "–"} GB</td>
      <td class="num">${TM.money(n.price_per_hour)}</td>
      <td>${jobs(n)}</td>
      <td class="num muted">${n.last_seen ? TM.ago(Date.parse(n.last_seen)) : "–"}</td></tr>`).join("")
      || `<tr><td colspan="10" class="empty">No node has registered.</td></tr>`;
  }

  return { title: "Nodes", mount, refresh, needsProject: false, leave: () => { view = null; } };
})();
