"""The CUDA jobs the GPU tier submits: each a `python3 -c` program run in the agent's own environment (torch)."""

from shlex import quote

# Adam on an ill-conditioned least-squares problem (a rotated power-law spectrum, so Adam's per-coordinate steps do
# not undo it) on the task's one GPU, until the loss reaches its target (the job's declared metric target): a curve
# that falls as a power law, as training losses do, and that the estimator must predict the end of. Calibrated on
# a CPU (same seed): the loss is 0.051 at step 100, 0.014 at 500 and reaches 0.01 near step 700, so with a pause
# of 1 s every 10 steps a run takes about 70 s.
ADAM = r"""
import sys, time, torch
target, pause = float(sys.argv[1]), float(sys.argv[2])
assert torch.cuda.is_available(), "no CUDA in the task"
torch.manual_seed(0)
d = 256
q, _ = torch.linalg.qr(torch.randn(d, d))
x = ((torch.randn(4096, d) * torch.arange(1, d + 1) ** -1.0) @ q).cuda()
y = x @ torch.randn(d, 1).cuda()
model = torch.nn.Linear(d, 1, bias=False).cuda()
optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
print(f"training on {torch.cuda.get_device_name(0)}", flush=True)
for step in range(1, 100_000):
    optimiser.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimiser.step()
    if step % 10 == 0:
        value = loss.item()
        print(f"step {step} loss {value:.6f}", flush=True)
        if value <= target:
            print(f"target {target} reached at step {step}", flush=True)
            break
        time.sleep(pause)
"""

# Asks the GPU for more memory than it has, as a model too large for it would: PyTorch's own out-of-memory error.
OOM = r"""
import torch
total = torch.cuda.get_device_properties(0).total_memory
print(f"allocating {2 * total / 2**30:.0f} GiB", flush=True)
torch.empty(2 * total, dtype=torch.uint8, device="cuda")
"""

# Holds GPU memory and does nothing, saying nothing: hung, as a deadlocked collective leaves a job.
IDLE = r"""
import time, torch
held = torch.ones(256, 1024, 1024, device="cuda")
print("holding the GPU, idle", flush=True)
time.sleep(3600)
"""

# Busy on the GPU for `seconds` without a line of output: a long step, alive (NVML shows the GPU at work).
BUSY = r"""
import sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(4096, 4096, device="cuda")
print("computing silently", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(50):
        b = a @ a
    torch.cuda.synchronize()
print("done", float(b[0, 0]), flush=True)
"""


def python(script: str, *args: object) -> str:
    """A job command running `script` with its arguments."""
    return " ".join(["python3", "-c", quote(script), *(quote(str(a)) for a in args)])
