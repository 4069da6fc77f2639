"""Example training scripts, on every task's path next to the `trainmaster_task` helper.

Run one as a job's command: `python3 -m trainmaster_examples.pytorch_train --steps 2000` (PyTorch comes with the
cluster's default engine, `pytorch` in cluster.toml)."""
