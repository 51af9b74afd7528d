"""Hugging Face transformers' GPT-2 (GPT2LMHeadModel built from a
GPT2Config, random weights, nothing downloaded) on synthetic tokens,
data-parallel with autobyte or torch DDP. The defaults are GPT-2 small
(12 layers, 768 wide, 12 heads, 50,257 tokens: 124M parameters); the output
layer shares the token embedding's weights.

    autobyte launch --workers 3 --servers 3 --bandwidth 10Gbps -- \\
        python3 examples/torch_gpt2.py --backend autobyte --iterations 10 --batch 2 --seq 128
    autobyte launch --workers 3 --arch allreduce -- \\
        python3 examples/torch_gpt2.py --backend ddp --layers 2 --dim 128 --heads 4 --vocab 1000

Needs transformers (torch_common.import_transformers says which release
runs on which torch). Prints one JSON line (rank 0): backend,
iteration_time_s (steady-state mean), final_loss, ...
"""

import torch
import torch.nn as nn

import torch_common

transformers = torch_common.import_transformers()


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
    torch_common.transformer_flags(p, vocab=50257, dim=768, layers=12, heads=12, seq=128, batch=2, dropout_of="GPT-2",
                                   seq_help="tokens per sequence (GPT-2: at most 1024)")
    args = p.parse_args()
    torch_common.check_transformer(p, args)
    torch.manual_seed(args.seed)
    model = gpt2(args.vocab, args.dim, args.layers, args.heads, args.seq, args.dropout)

    def batch(gen):
        seq = torch_common.noisy_counting(gen, args.batch, args.seq + 1, args.vocab)
        return seq[:, :-1], seq[:, 1:]

    torch_common.train(args, model, batch, lm_loss)


if __name__ == "__main__":
    main()
