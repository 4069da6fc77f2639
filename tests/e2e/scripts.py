"""Training scripts the recovery tests submit: they use only the checkpoint contract (standard library)."""

from shlex import quote

COUNTER = r"""
import json, os, signal, sys, time
total, every, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if os.environ["TRAINMASTER_ATTEMPT"] != "1" and len(sys.argv) > 4:
    pause = float(sys.argv[4])
ckpt = os.path.join(os.environ["TRAINMASTER_CHECKPOINT_DIR"], "state.json")
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
def save(step):
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(ckpt + ".tmp", ckpt)
start = json.load(open(ckpt))["step"] + 1 if os.path.exists(ckpt) else 0
print(f"attempt {os.environ['TRAINMASTER_ATTEMPT']} on {os.environ['TRAINMASTER_NODE_ID']} resumed from {start}",
      flush=True)
for step in range(start, total):
    print(f"step {step}", flush=True)
    time.sleep(pause)
    if step % every == 0 or stop:
        save(step)
    if stop:
        print(f"saved {step} on SIGTERM", flush=True)
        sys.exit(0)
"""


def counter(*, total: int, every: int, pause: float, resumed_pause: float | None = None) -> str:
    """A job that counts steps, checkpoints every `every` steps and resumes where its checkpoint says; an attempt
    after the first pauses `resumed_pause` a step when given (the test looks at where it resumed, not its pace)."""
    later = "" if resumed_pause is None else f" {resumed_pause}"
    return f"python3 -c {quote(COUNTER)} {total} {every} {pause}{later}"


GPU_HUNGRY = r"""
import os, sys
have, need = float(os.environ["TRAINMASTER_GPU_MEMORY_GB"]), float(sys.argv[1])
print(f"GPU has {have} GB, model needs {need} GB", flush=True)
if have < need:
    print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need - have:.2f} GiB", file=sys.stderr)
    sys.exit(1)
print("trained", flush=True)
"""


def gpu_hungry(need_gb: float) -> str:
    """A job that runs out of GPU memory, as PyTorch reports it, on any GPU smaller than `need_gb`."""
    return f"python3 -c {quote(GPU_HUNGRY)} {need_gb}"


DDP = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {value.item()}", flush=True)
dist.destroy_process_group()
"""


def ddp(python: str) -> str:
    """Two ranks summing their rank + 1 over gloo (CPU): each prints 3.0. `python` must have torch."""
    return f"{python} -c {quote(DDP)}"


HANGS_ONCE = r"""
import sys, time
import trainmaster_task as tm
start = tm.load_step()
print(f"attempt {tm.attempt()} resumed from {start}", flush=True)
for step in range(start, start + 5):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
if tm.attempt() > 1:
    sys.exit(0)
tm.save_step(step)
print(f"saved {step}; now stuck", flush=True)
time.sleep(600)  # no output, no progress mark, no new checkpoint: hung
"""


def hangs_once() -> str:
    """A job that checkpoints and then hangs on its first attempt, and finishes from its checkpoint after."""
    return f"python3 -c {quote(HANGS_ONCE)}"


QUIET = r"""
import sys, time
import trainmaster_task as tm
for _ in range(int(sys.argv[1])):
    tm.progress()  # no output at all, but a progress mark
    time.sleep(0.25)
"""


def quiet_but_progressing(marks: int) -> str:
    """A job that prints nothing and marks progress four times a second."""
    return f"python3 -c {quote(QUIET)} {marks}"
