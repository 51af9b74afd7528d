"""A small Transformer language model on synthetic tokens (the output layer
shares the embedding's weights), data-parallel with autobyte or torch DDP.

    autobyte launch --workers 3 --servers 3 --bandwidth 200Mbps -- \\
        /usr/bin/python3 examples/torch_lm.py --backend autobyte --iterations 30

Prints one JSON line (rank 0): backend, iteration_time_s (steady-state
mean), final_loss, ...
"""

import math

import torch
import torch.nn as nn

import torch_common


class LM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)  # small: the output layer shares it
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter used twice
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, tokens):
        h = self.embed(tokens) * math.sqrt(self.embed.embedding_dim) + self.pos[: tokens.shape[1]]
        for b in self.blocks:
            h = b(h, src_mask=self.mask)
        return self.head(self.norm(h))


def profile_model(vocab=4000, dim=256, layers=2, heads=4, seq=32, batch=8):
    """For python -m autobyte.profile examples/torch_lm.py:profile_model."""
    model = LM(vocab, dim, layers, heads, seq)
    tokens = torch.randint(0, vocab, (batch, seq + 1))
    return model, tokens[:, :-1], lambda out: nn.functional.cross_entropy(out.reshape(-1, vocab), tokens[:, 1:].reshape(-1))


def main():
    p = torch_common.parser(__doc__.splitlines()[0])
    torch_common.transformer_flags(p, vocab=4000, dim=256, layers=2, heads=4, seq=32, batch=8)
    args = p.parse_args()
    torch_common.check_transformer(p, args)
    torch.manual_seed(args.seed)
    model = LM(args.vocab, args.dim, args.layers, args.heads, args.seq)

    def batch(gen):
        seq = torch_common.noisy_counting(gen, args.batch, args.seq + 1, args.vocab)
        return seq[:, :-1], seq[:, 1:]

    def loss(logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    torch_common.train(args, model, batch, loss)


if __name__ == "__main__":
    main()
