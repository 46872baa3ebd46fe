"""Hugging Face `transformers.Trainer` on a tiny BERT built from a config (random weights, no
download), unmodified (no perfdoctor code in it).

    python examples/hf_trainer.py [--steps 30] [--load-ms 2] [--accumulate 1]

Each sample costs --load-ms of loading time (dataloader_num_workers=0: the trainer waits for
it). --accumulate N: gradient_accumulation_steps=N (one optimizer step per N batches).
"""

import argparse
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Slow(Dataset):
    def __init__(self, n: int, load_ms: float):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, 16), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.load_s = load_ms / 1e3

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        if self.load_s:
            time.sleep(self.load_s)
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": self.labels[i]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--load-ms", type=float, default=2.0)
    ap.add_argument("--accumulate", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(cfg)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=os.path.join(out, "hf"), max_steps=args.steps, per_device_train_batch_size=8,
                                  gradient_accumulation_steps=args.accumulate, learning_rate=1e-3, report_to=[],
                                  save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True,
                                  dataloader_num_workers=0, seed=0)
        trainer = Trainer(model=model, args=targs, train_dataset=Slow(8 * args.steps * args.accumulate + 64, args.load_ms))
        result = trainer.train()
    print(f"hf_trainer: {result.global_step} optimizer steps", flush=True)


if __name__ == "__main__":
    main()
