"""Hugging Face transformers' BERT (BertForMaskedLM built from a
BertConfig, random weights, nothing downloaded) on synthetic masked tokens,
data-parallel with autobyte or torch DDP. The defaults are BERT-base
(12 layers, 768 wide, 12 heads, 3072 in the feed-forward, 30,522 tokens:
110M parameters); the masked-LM head's output layer shares the token
embedding's weights.

    autobyte launch --workers 3 --servers 3 --bandwidth 10Gbps -- \\
        python3 examples/torch_bert.py --backend autobyte --iterations 10 --batch 2 --seq 128
    autobyte launch --workers 3 --arch allreduce -- \\
        python3 examples/torch_bert.py --backend ddp --layers 2 --dim 128 --heads 4 --vocab 1000

Needs transformers (torch_common.import_transformers says which release
runs on which torch). Prints one JSON line (rank 0): backend,
iteration_time_s (steady-state mean), final_loss, ...
"""

import torch
import torch.nn as nn

import torch_common

transformers = torch_common.import_transformers()

PAD, MASK = 0, 1  # BertConfig's padding id (unused: no sequence is padded) and the id that masks a position


def bert(vocab, dim, layers, heads, ffn, seq, dropout):
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=ffn, max_position_embeddings=seq, hidden_dropout_prob=dropout,
                                     attention_probs_dropout_prob=dropout, pad_token_id=PAD, tie_word_embeddings=True)
    model = transformers.BertForMaskedLM(config)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight, "the output layer is not tied"
    return model


def mlm_loss(out, labels):
    """Cross-entropy over the masked positions (labels -100 elsewhere)."""
    logits = out.logits
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def masked(tokens, gen, rate=0.15):
    """(input ids, labels): a share rate of the positions, and at least one
    per sequence, replaced by MASK; labels hold the original token there."""
    mask = torch.rand(tokens.shape, generator=gen) < rate
    mask[torch.arange(tokens.shape[0]), torch.randint(0, tokens.shape[1], (tokens.shape[0],), generator=gen)] = True
    return tokens.masked_fill(mask, MASK), tokens.masked_fill(~mask, -100)


def profile_model(vocab=30522, dim=768, layers=12, heads=12, seq=128, batch=2):
    """For python -m autobyte.profile examples/torch_bert.py:profile_model."""
    model = bert(vocab, dim, layers, heads, 4 * dim, seq, 0.0)
    x, labels = masked(torch.randint(2, vocab, (batch, seq)), torch.Generator().manual_seed(0))
    return model, x, lambda out: mlm_loss(out, labels)


def main():
    p = torch_common.parser(__doc__.splitlines()[0])
    torch_common.transformer_flags(p, vocab=30522, dim=768, layers=12, heads=12, seq=128, batch=2, dropout_of="BERT",
                                   seq_help="tokens per sequence (BERT: at most 512)")
    p.add_argument("--ffn", type=int, default=0, help="feed-forward width (default: 4 x --dim)")
    args = p.parse_args()
    args.ffn = args.ffn or 4 * args.dim
    torch_common.check_transformer(p, args, extra=("ffn",))
    if args.vocab < 3:
        p.error("--vocab must be >= 3 (tokens %d and %d pad and mask), got %d" % (PAD, MASK, args.vocab))
    torch.manual_seed(args.seed)
    model = bert(args.vocab, args.dim, args.layers, args.heads, args.ffn, args.seq, args.dropout)

    def batch(gen):
        # Tokens 2..vocab-1 (0 and 1 pad and mask), so a masked token can be
        # inferred from its neighbours.
        return masked(2 + torch_common.noisy_counting(gen, args.batch, args.seq, args.vocab - 2), gen)

    torch_common.train(args, model, batch, mlm_loss)


if __name__ == "__main__":
    main()
