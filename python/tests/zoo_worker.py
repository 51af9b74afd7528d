"""Models nobody wrote for autobyte, trained a few steps under DDP's
interface, for test_zoo.py: torch's DistributedDataParallel on gloo
(--backend ddp) or autobyte.torch.DistributedDataParallel (autobyte-ddp),
the rest of the script the same.

    zoo_worker.py --model NAME --backend ddp|autobyte-ddp --out FILE

The models, small configurations of what people train:
  efficientnet  torchvision's EfficientNet-B0 (SiLU, squeeze-excitation,
                stochastic depth and dropout, so random draws every step)
  vit           torchvision's VisionTransformer (class token, position
                embedding as bare parameters, MultiheadAttention)
  densenet      torchvision's DenseNet, memory_efficient=True (its dense
                layers run under activation checkpointing)
  t5            transformers' T5ForConditionalGeneration (encoder-decoder,
                relative position buckets, input and output embeddings tied)
  llama         transformers' LlamaForCausalLM (rotary positions, grouped
                key-value heads, RMSNorm)
Each rank draws its own initial weights (the wrapper must broadcast rank
0's) and its own batches; Adam, 3 steps. Rank 0 saves its losses and
final state dict to FILE.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

STEPS = 3


class Causal(nn.Module):
    """A Hugging Face model called with input ids and labels; its output's
    loss is the loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).loss


def images(size=32):
    def batch(g):
        return torch.randn(4, 3, size, size, generator=g), torch.randint(0, 10, (4,), generator=g)
    return batch


def tokens(g):
    ids = torch.randint(0, 100, (2, 16), generator=g)
    return ids, ids.flip(1)


def build(name):
    """(model, batch(generator) -> (input, target), loss(output, target))."""
    import torchvision
    ce = nn.functional.cross_entropy
    if name == "efficientnet":
        return torchvision.models.efficientnet_b0(num_classes=10), images(), ce
    if name == "vit":
        from torchvision.models.vision_transformer import VisionTransformer
        return VisionTransformer(32, 8, 2, 2, 32, 64, num_classes=10), images(), ce
    if name == "densenet":
        net = torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=10,
                                          memory_efficient=True)
        return net, images(), ce
    import transformers as T
    if name == "t5":
        cfg = T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         decoder_start_token_id=0, dropout_rate=0.0)
        return Causal(T.T5ForConditionalGeneration(cfg)), tokens, None
    if name == "llama":
        cfg = T.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return Causal(T.LlamaForCausalLM(cfg)), tokens, None
    raise SystemExit("zoo_worker: unknown model %r" % name)


MODELS = ("efficientnet", "vit", "densenet", "t5", "llama")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=MODELS, required=True)
    p.add_argument("--backend", choices=["ddp", "autobyte-ddp"], required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(3 + rank)
    model, batch, loss_fn = build(a.model)
    if a.backend == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        net = nn.parallel.DistributedDataParallel(model)
    else:
        import autobyte.torch as ab
        ab.init()
        net = ab.DistributedDataParallel(model)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        x, y = batch(g)
        out = net(x, y) if loss_fn is None else loss_fn(net(x), y)
        out.backward()
        opt.step()
        losses.append(out.item())
    if rank == 0:
        torch.save({"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}, a.out)
    if a.backend == "ddp":
        # Left to interpreter exit, torch 2's gloo threads can abort the
        # process after the run succeeded.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
