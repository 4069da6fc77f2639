"""A PyTorch DataLoader with worker processes, as nearly every training job has: its batches come back from the
workers through shared memory and file descriptors passed over a Unix socket under TMPDIR (multiprocessing's
resource sharer). A TMPDIR too long for a socket's path left it waiting for its first batch for ever."""

import json
import os
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.arange(512.0).reshape(256, 2)), batch_size=32, num_workers=2)
total = sum(float(x.sum()) for (x,) in loader)
print(
    "LOADED "
    + json.dumps({"sum": total, "tmpdir": tempfile.gettempdir(), "real": os.path.realpath(tempfile.gettempdir())}),
    flush=True,
)
print("DONE", flush=True)
