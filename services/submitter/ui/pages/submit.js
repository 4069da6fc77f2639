/* Submit: the v2 create body from a form; errors show the API's error_code and error_msg. */
"use strict";
TM.pages.submit = (() => {
  const EXAMPLE = `python3 -c "import math, time
for step in range(1, 401):
    print(f'step {step} loss {2.0 - 0.0045 * step + 0.03 * math.sin(step):.4f}', flush=True)
    time.sleep(0.25)"`;

  function mount(root) {
    root.innerHTML = `
      <form class="card" id="submit-form" autocomplete="off">
        <h2><span>New training job</span><span class="muted">in project <b>${TM.esc(TM.project())}</b></span></h2>
        <div id="submit-error" class="alert error hidden"></div>
        <div class="form">
          <label class="c2">Name <span class="hint">letters, digits, _ and -</span><input name="name" required maxlength="64" pattern="[A-Za-z0-9_\\-]+" placeholder="resnet50-lr0.1"></label>
          <label class="c4" style="grid-column: span 4">Description<input name="description" maxlength="256" placeholder="What this run tries"></label>
          <label class="c6">Command <span class="hint">run with /bin/sh -c on the node, in a directory of its own</span><textarea name="command" rows="5" class="mono" required>${TM.esc(EXAMPLE)}</textarea></label>
          <h3>Resources</h3>
          <label class="c1">Nodes<input name="node_count" type="number" min="1" max="64" value="1"></label>
          <label class="c1">GPUs / node<input name="gpu_count" type="number" min="0" max="16" value="1"></label>
          <label class="c1">Min GPU memory (GB)<input name="min_gpu_memory_gb" type="number" min="0" step="any" value="0"></label>
          <label class="c1">CPUs<input name="cpu_count" type="number" min="0.1" step="any" value="2"></label>
          <label class="c1">Memory (GB)<input name="memory_gb" type="number" min="0.1" step="any" value="8"></label>
          <label class="c1">Max duration (s)<input name="max_duration_s" type="number" min="1" placeholder="none"></label>
          <h3>Placement</h3>
          <label class="c2">Allowed nodes<select name="allowed"><option value="any">Any: owned or cloud</option><option value="local">Local: our workstations</option><option value="cloud">Cloud: reserved or on-demand</option></select></label>
          <label class="c2">Priority<span class="seg"><label><input type="radio" name="priority" value="time" checked><span>Finish soonest</span></label><label><input type="radio" name="priority" value="cost"><span>Spend least</span></label></span></label>
          <label class="c2">Expected duration (s)<input name="expected_duration_s" type="number" min="1" placeholder="e.g. 3600"></label>
          <h3>Metric and parameters</h3>
          <label class="c1">Metric<input name="metric_name" value="loss" placeholder="loss"></label>
          <label class="c3">Regex <span class="hint">group <code>value</code> is the metric</span><input name="metric_regex" class="mono" value="loss (?P&lt;value&gt;[0-9.eE+-]+)"></label>
          <label class="c1">Goal<select name="metric_mode"><option value="min">minimise</option><option value="max">maximise</option></select></label>
          <label class="c1">Target<input name="metric_target" type="number" step="any" value="0.3"></label>
          <label class="c3">Parameters <span class="hint">NAME=VALUE per line; exported to the environment</span><textarea name="parameters" rows="3" class="mono" placeholder="lr=0.1"></textarea></label>
          <label class="c3">Environment <span class="hint">NAME=VALUE per line</span><textarea name="environments" rows="3" class="mono" placeholder="DATASET=imagenet-mini"></textarea></label>
          <label class="c3">Secrets <span class="hint">NAME=VALUE per line; never shown again, masked in the output</span><textarea name="secrets" rows="2" class="mono secret" autocomplete="off" spellcheck="false" placeholder="WANDB_API_KEY=..."></textarea></label>
        </div>
        <div class="form-foot"><a class="btn ghost" href="#/jobs">Cancel</a><button class="btn primary" type="submit" id="submit-button">Submit job</button></div>
      </form>`;
    root.querySelector("#submit-form").addEventListener("submit", submit);
  }

  function pairs(text) {
    return text.split("\n").map((l) => l.trim()).filter(Boolean).map((l) => {
      const i = l.indexOf("=");
      return i < 1 ? [l, ""] : [l.slice(0, i).trim(), l.slice(i + 1)];
    });
  }

  function body(form) {
    const f = Object.fromEntries(new FormData(form));
    const num = (v) => (v === "" || v === undefined ? undefined : Number(v));
    const metrics = f.metric_name && f.metric_regex ? [{ name: f.metric_name.trim(), regex: f.metric_regex, mode: f.metric_mode,
                                                        target: num(f.metric_target) ?? null }] : [];
    return {
      kind: "job",
      metadata: { name: f.name.trim(), description: f.description },
      algorithm: { command: f.command, metrics, parameters: pairs(f.parameters).map(([name, value]) => ({ name, value })),
                   environments: Object.fromEntries(pairs(f.environments)),
                   ...(f.secrets && f.secrets.trim() ? { secrets: Object.fromEntries(pairs(f.secrets)) } : {}) },
      spec: {
        resource: { node_count: num(f.node_count), gpu_count: num(f.gpu_count), min_gpu_memory_gb: num(f.min_gpu_memory_gb),
                    cpu_count: num(f.cpu_count), memory_gb: num(f.memory_gb) },
        placement: { allowed: f.allowed, priority: f.priority, expected_duration_s: num(f.expected_duration_s) ?? null },
        max_duration_s: num(f.max_duration_s) ?? null,
      },
    };
  }

  async function submit(e) {
    e.preventDefault();
    const form = e.target, error = form.querySelector("#submit-error"), button = form.querySelector("#submit-button");
    button.disabled = true;
    try {
      const job = await TM.api(TM.jobsPath(), { method: "POST", body: body(form) });
      TM.flash(`Submitted ${job.metadata.name}.`, "ok");
      location.hash = `#/job/${encodeURIComponent(job.metadata.id)}`;
    } catch (err) {
      error.textContent = String(err);
      error.classList.remove("hidden");
      button.disabled = false;
    }
  }

  return { title: "Submit a job", mount };
})();
