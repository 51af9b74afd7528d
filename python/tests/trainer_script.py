"""A Hugging Face Trainer job, as people run one, with nothing of autobyte
in it, for test_dropin.py: a small GPT-2 from its config on a fixed token
dataset, 2 micro-batches accumulated per step (the Trainer's no_sync) and
gradients clipped to 0.5, 6 steps, logged every step. Under torchrun or
`autobyte launch` the Trainer wraps the model in
torch.nn.parallel.DistributedDataParallel itself (through accelerate);
under `python -m autobyte.torch.dropin` that is autobyte's.

    trainer_script.py OUTDIR   (rank 0 writes OUTDIR/result.pt: losses, final state, the wrapper's module)
"""

import os
import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n=64):
        self.ids = torch.randint(0, 100, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             max_grad_norm=0.5, learning_rate=1e-3, max_steps=6, logging_steps=1, seed=0,
                             use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save({"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "wrapper": type(trainer.model_wrapped).__module__}, os.path.join(out, "result.pt"))


if __name__ == "__main__":
    main()
