"""A standard PyTorch job: its user (getpass, pwd, ~), an Adam step, and torch.compile of a small function (CPU)."""

import getpass
import json
import os
import pwd

import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # imports torch._dynamo, which asks getpass.getuser()
model(torch.ones(3, 4)).sum().backward()
optimizer.step()
compiled = torch.compile(lambda x: torch.sin(x) * 2 + 1)  # inductor: a C compiler, caches in the task's directory
print(
    "WHO "
    + json.dumps(
        {
            "getuser": getpass.getuser(),
            "pwd": pwd.getpwuid(os.getuid()).pw_name,
            "home": os.path.expanduser("~"),
            "compiled": compiled(torch.zeros(3)).tolist(),
            **{k: os.environ.get(k) for k in ("USER", "HOME", "CUDA_DEVICE_ORDER")},
        }
    ),
    flush=True,
)
print("DONE", flush=True)
