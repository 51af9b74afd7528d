"""Hugging Face transformers' GPT-2 (GPT2LMHeadModel built from a
GPT2Config, random weights, nothing downloaded) on synthetic tokens,
data-parallel with autobyte or torch DDP. The defaults are GPT-2 small
(12 layers, 768 wide, 12 heads, 50,257 tokens: 124M parameters); the output
layer shares the token embedding's weights.

    autobyte launch --workers 3 --servers 3 --bandwidth 10Gbps -- \\
        python3 examples/torch_gpt2.py --backend autobyte --iterations 10 --batch 2 --seq 128
    autobyte launch --workers 3 --arch allreduce -- \\
        python3 examples/torch_gpt2.py --backend ddp --layers 2 --dim 128 --heads 4 --vocab 1000

Needs transformers: current releases need torch >= 2.6, and 4.49 is the
last that runs on torch 1.13 (.ci/run installs it in a venv over Debian's
torch). Prints one JSON line (rank 0): backend, iteration_time_s
(steady-state mean), final_loss, ...
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, not a checkpoint: never reach the network

import torch
import torch.nn as nn
import transformers

import torch_common


def gpt2(vocab, dim, layers, heads, seq, dropout):
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=dim, n_layer=layers, n_head=heads,
                                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return transformers.GPT2LMHeadModel(config)


def lm_loss(out, target):
    logits = out.logits
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def profile_model(vocab=50257, dim=768, layers=12, heads=12, seq=128, batch=2):
    """For python -m autobyte.profile examples/torch_gpt2.py:profile_model."""
    model = gpt2(vocab, dim, layers, heads, seq, 0.0)
    tokens = torch.randint(0, vocab, (batch, seq + 1))
    return model, tokens[:, :-1], lambda out: lm_loss(out, tokens[:, 1:])


def main():
    p = torch_common.parser(__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (GPT-2: at most 1024)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="GPT-2's dropouts (its own default is 0.1; 0 keeps runs of different backends comparable)")
    p.set_defaults(batch=2)
    args = p.parse_args()
    torch_common.check(args)
    for name in ("vocab", "dim", "layers", "heads", "seq"):
        if getattr(args, name) < 1:
            p.error("--%s must be >= 1, got %d" % (name, getattr(args, name)))
    if args.dim % args.heads:
        p.error("--dim %d must be a multiple of --heads %d" % (args.dim, args.heads))
    if not 0 <= args.dropout < 1:
        p.error("--dropout must be in [0, 1), got %g" % args.dropout)
    torch.manual_seed(args.seed)
    model = gpt2(args.vocab, args.dim, args.layers, args.heads, args.seq, args.dropout)

    def batch(gen):
        # Tokens follow a noisy "next = previous + 1" rule, so there is
        # something to learn.
        start = torch.randint(0, args.vocab, (args.batch, 1), generator=gen)
        steps = torch.arange(args.seq + 1).unsqueeze(0)
        noise = (torch.rand(args.batch, args.seq + 1, generator=gen) < 0.1).long() * torch.randint(
            0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        seq = (start + steps + noise) % args.vocab
        return seq[:, :-1], seq[:, 1:]

    torch_common.train(args, model, batch, lm_loss)


if __name__ == "__main__":
    main()
