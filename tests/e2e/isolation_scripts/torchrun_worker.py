"""One rank of a `torchrun --nproc_per_node 2` job (the launcher researchers use): its process group from the
variables torchrun sets, an all-reduce over gloo, a DataLoader with a worker process, and rank 0's summary."""

import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
loader = DataLoader(TensorDataset(torch.ones(64, 2) * (rank + 1)), batch_size=16, num_workers=1)
seen = sum(float(x.sum()) for (x,) in loader)
gathered = [None] * world
dist.all_gather_object(gathered, {"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "seen": seen})
if rank == 0:
    print("RANKS " + json.dumps({"world": world, "all_reduce": total.item(), "ranks": gathered}), flush=True)
dist.destroy_process_group()
