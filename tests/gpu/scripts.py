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


# What a researcher's everyday PyTorch job does on a GPU, each step a path only a GPU walks inside the task's own
# user, namespaces and cgroup: the process group from the variables the agent sets (NCCL, env://), a DataLoader
# with worker processes and pinned memory (tensors pass through the task's /dev/shm), a model under DDP and
# torch.compile (Inductor and Triton compile kernels into the task's caches), bf16 autocast, and a checkpoint per
# epoch in TRAINMASTER_CHECKPOINT_DIR. It prints its loss each epoch and, last, a FACTS line the test reads; every
# minute, every thread's stack (a hang shows where).
STANDARD = r"""
import faulthandler, json, os, sys, time
faulthandler.dump_traceback_later(60, repeat=True)  # where it stands, each minute: a hang shows where
import torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
epochs = int(sys.argv[1])
assert torch.cuda.is_available(), "no CUDA in the task"
dist.init_process_group("nccl", init_method="env://")
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
torch.cuda.set_device(device)
total = torch.ones(1, device=device)
dist.all_reduce(total)
torch.manual_seed(0)
images = torch.randn(8192, 3, 32, 32)
labels = (images.mean(dim=(1, 2, 3)) > 0).long()
loader = DataLoader(TensorDataset(images, labels), batch_size=256, shuffle=True, num_workers=2, pin_memory=True,
                    persistent_workers=True)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 2)).to(device)
model = torch.compile(nn.parallel.DistributedDataParallel(model, device_ids=[device.index]))
optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
checkpoints = os.environ["TRAINMASTER_CHECKPOINT_DIR"]
os.makedirs(checkpoints, exist_ok=True)
print(f"training on {torch.cuda.get_device_name(device)}, world {dist.get_world_size()}", flush=True)
started = time.monotonic()
for epoch in range(1, epochs + 1):
    seen, summed = 0, 0.0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        seen, summed = seen + len(y), summed + loss.item() * len(y)
    print(f"epoch {epoch} loss {summed / seen:.6f}", flush=True)
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimiser": optimiser.state_dict()},
               os.path.join(checkpoints, "last.pt"))
saved = torch.load(os.path.join(checkpoints, "last.pt"), map_location=device, weights_only=True)
facts = {"all_reduce": total.item(), "world": dist.get_world_size(), "epoch_saved": saved["epoch"],
         "device": torch.cuda.get_device_name(device), "seconds": round(time.monotonic() - started, 1),
         "peak_gpu_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}
dist.destroy_process_group()
print("FACTS " + json.dumps(facts), flush=True)
"""


# What a task sees of the node's GPUs (`task_hide_other_gpus`): each GPU's device file opened or refused, and
# whether CUDA finds a device; its own GPUs must work, the others must be refused.
DEVICES = r"""
import glob, json, os
opened = {}
for path in sorted(glob.glob("/dev/nvidia[0-9]*")):
    try:
        os.close(os.open(path, os.O_RDWR))
        opened[path] = "opened"
    except OSError as exc:
        opened[path] = type(exc).__name__
import torch
cuda = torch.cuda.is_available() and torch.cuda.device_count()
if cuda:
    cuda = float((torch.ones(64, device="cuda") * 2).sum())
visible = os.environ.get("CUDA_VISIBLE_DEVICES")
print("DEVICES " + json.dumps({"files": opened, "cuda": cuda, "visible": visible}), flush=True)
"""
