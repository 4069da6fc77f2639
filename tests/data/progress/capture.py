"""Capture what real training libraries print (stdout and stderr raw, with their carriage returns) into this folder.

Not part of the test run, and the project does not depend on these libraries. Run it with a throwaway venv outside
the repository:

    python3.11 -m venv /work/capvenv
    /work/capvenv/bin/pip install tqdm transformers lightning keras torch==2.13.0
    /work/capvenv/bin/python tests/data/progress/capture.py

Each framework runs in its own process on a tiny random model (no download), its output written byte for byte to
<name>.txt and trimmed to MAX_BYTES.
"""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
MAX_BYTES = 48_000

TQDM = """
import time
from tqdm import tqdm, trange
for i in tqdm(range(200), mininterval=0, miniters=1):
    time.sleep(0.001)
for epoch in trange(3, desc="Epoch", mininterval=0):
    for step in tqdm(range(40), desc="Iteration", leave=False, mininterval=0):
        time.sleep(0.001)
"""

HF = """
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
torch.manual_seed(0)
class Random(Dataset):
    def __init__(self, n):
        self.x = torch.randint(0, 50, (n, 8)); self.y = torch.randint(0, 2, (n,))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}
config = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50,
                    max_position_embeddings=16, num_labels=2)
args = TrainingArguments(output_dir="/tmp/hf-capture", num_train_epochs=3, per_device_train_batch_size=4,
                         logging_steps=5, eval_strategy="epoch", save_strategy="no", report_to=[], use_cpu=True,
                         disable_tqdm=False)
Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Random(64),
        eval_dataset=Random(16)).train()
"""

LIGHTNING = """
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset
class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, _):
        x, y = batch; loss = torch.nn.functional.mse_loss(self.layer(x), y); self.log("loss", loss, prog_bar=True)
        return loss
    def validation_step(self, batch, _):
        x, y = batch; self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), prog_bar=True)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = TensorDataset(torch.randn(80, 4), torch.randn(80, 1))
L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False).fit(
    Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
"""

# Lightning's own bar when rich is not installed (rich, when it is and stdout is no terminal, prints the last frame)
LIGHTNING_TQDM = LIGHTNING.replace("logger=False,", "logger=False, callbacks=[L.pytorch.callbacks.TQDMProgressBar()],")

KERAS = """
import numpy as np
import keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.random.rand(640, 4), np.random.rand(640, 1), epochs=3, batch_size=16, validation_split=0.1, verbose=1)
"""

SCRIPTS = {"tqdm": TQDM, "hf-trainer": HF, "lightning": LIGHTNING, "lightning-tqdm": LIGHTNING_TQDM, "keras": KERAS}


def main() -> None:
    env = {
        **os.environ,
        "KERAS_BACKEND": "torch",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for name, script in SCRIPTS.items():
        if len(sys.argv) > 1 and name not in sys.argv[1:]:
            continue
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600
        )
        raw = done.stdout
        if len(raw) > MAX_BYTES:  # the head and the tail: how it starts and how it ends
            head, tail = raw[: MAX_BYTES // 2], raw[-MAX_BYTES // 2 :]
            raw = head[: max(head.rfind(b"\r"), head.rfind(b"\n")) + 1] + tail[tail.find(b"\r") :]
        (HERE / f"{name}.txt").write_bytes(raw)
        print(name, done.returncode, len(raw))


if __name__ == "__main__":
    main()
