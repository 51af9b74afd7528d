"""Models of unusual structure train through the plugin exactly as in plain torch.

With one worker the plugin's update is torch's own, so every model here
must end bit for bit where plain torch ends: every loss and every entry of
the state dict. The models are the structures the plugin's hooks must get
right, not sizes: tied weights, frozen weights, a module called twice, a
branch taken every other step, a parameter on the root module, a child's
weight used through torch.nn.functional, recurrent layers,
nn.TransformerEncoder, activation checkpointing (reentrant and not), and
small configurations of torchvision's and Hugging Face's model families
(squeezenet, densenet, mobilenet v3, efficientnet, shufflenet, googlenet,
regnet, a vision transformer, convnext, swin; GPT-2, T5, Llama). Each
trains 4 steps with SGD (momentum, weight decay) and with AdamW, under a
StepLR schedule. Dropout and stochastic depth draw the same numbers in
both runs (the global seed is set before each forward).

A failure names the model, the optimizer and the first entries that
differ. NegativeControl shows that the comparison catches a one-step
difference in the learning rate.
"""

import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import helpers  # noqa: F401  (puts python/ on the path)

import autobyte.torch as ab  # noqa: E402

STEPS = 4


class Tied(nn.Module):
    """The output layer's weight is the embedding's."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        return self.out(torch.tanh(self.mid(self.emb(x))))


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 3)
        self.a.weight.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Twice(nn.Module):
    """One module called twice in a forward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(torch.tanh(self.a(x))))


class Branch(nn.Module):
    """A layer used every other step only."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.odd = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.a(x)
        if self.calls % 2 == 0:
            h = self.odd(h)
        return self.b(h)


class RootParam(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.a = nn.Linear(4, 2)

    def forward(self, x):
        return self.a(x * self.scale)


class Functional(nn.Module):
    """A child's parameters used by the parent, the child never called."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.randn(2, 4))

    def forward(self, x):
        return F.linear(torch.tanh(F.linear(x, self.inner.weight, self.inner.bias)), self.w)


class Recurrent(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.rnn = getattr(nn, kind)(6, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.l2 = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.l2(torch.tanh(self.l1(x)))


class Checkpointed(nn.Module):
    """Activation checkpointing: each block's forward runs again, with its
    pre-hooks, inside the backward pass."""

    def __init__(self, reentrant):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Residual() for _ in range(3)])
        self.out = nn.Linear(8, 2)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=self.reentrant)
        return self.out(h)


def torchvision_model(name, **kw):
    import torchvision
    return getattr(torchvision.models, name)(num_classes=10, **kw)


def vision_transformer():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                             num_classes=10)


def hugging_face(kind):
    import transformers as t
    if kind == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(
            decoder_start_token_id=0, pad_token_id=0, vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=2,
            num_heads=2, dropout_rate=0.0))
    if kind == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(
            vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, bos_token_id=1, eos_token_id=2))
    return t.GPT2LMHeadModel(t.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
        bos_token_id=1, eos_token_id=2))


# Inputs (a function of a generator) and the loss of the model's output.
def vectors(g):
    return torch.randn(3, 4, generator=g)


def tokens(g):
    return torch.randint(0, 10, (2, 5), generator=g)


def images(size):
    return lambda g: torch.randn(2, 3, size, size, generator=g)


def lm_batch(kind):
    def make(g):
        ids = torch.randint(0, 50, (2, 6), generator=g)
        return {"input_ids": ids, "labels": ids[:, :4].contiguous() if kind == "t5" else ids}
    return make


def mean_square(out):
    if isinstance(out, tuple):  # googlenet and inception return named tuples in train mode
        out = out[0]
    return out.float().pow(2).mean()


def hf_loss(out):
    return out.loss


# name -> (model factory, input factory, loss)
CASES = {
    "tied": (Tied, lambda g: torch.randint(0, 20, (3, 5), generator=g), mean_square),
    "frozen": (Frozen, vectors, mean_square),
    "twice": (Twice, vectors, mean_square),
    "branch": (Branch, vectors, mean_square),
    "root_parameter": (RootParam, vectors, mean_square),
    "functional": (Functional, vectors, mean_square),
    "lstm": (lambda: Recurrent("LSTM"), tokens, mean_square),
    "gru": (lambda: Recurrent("GRU"), tokens, mean_square),
    "transformer_encoder": (Encoder, tokens, mean_square),
    "checkpoint_reentrant": (lambda: Checkpointed(True), vectors, mean_square),
    "checkpoint_non_reentrant": (lambda: Checkpointed(False), vectors, mean_square),
    "squeezenet": (lambda: torchvision_model("squeezenet1_1"), images(64), mean_square),
    "densenet121": (lambda: torchvision_model("densenet121"), images(32), mean_square),
    "mobilenet_v3": (lambda: torchvision_model("mobilenet_v3_small"), images(32), mean_square),
    "efficientnet_b0": (lambda: torchvision_model("efficientnet_b0"), images(32), mean_square),
    "shufflenet": (lambda: torchvision_model("shufflenet_v2_x0_5"), images(32), mean_square),
    "googlenet": (lambda: torchvision_model("googlenet", aux_logits=False, init_weights=True), images(64),
                  mean_square),
    "regnet": (lambda: torchvision_model("regnet_y_400mf"), images(32), mean_square),
    "vision_transformer": (vision_transformer, images(32), mean_square),
    "convnext": (lambda: torchvision_model("convnext_tiny"), images(32), mean_square),
    "swin": (lambda: torchvision_model("swin_t"), images(64), mean_square),
    "hf_gpt2": (lambda: hugging_face("gpt2"), lm_batch("gpt2"), hf_loss),
    "hf_t5": (lambda: hugging_face("t5"), lm_batch("t5"), hf_loss),
    "hf_llama": (lambda: hugging_face("llama"), lm_batch("llama"), hf_loss),
}

OPTIMIZERS = {
    "sgd": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, weight_decay=1e-4),
    "adamw": lambda ps, lr: torch.optim.AdamW(ps, lr=lr / 10),
}


def train_both(make, inputs, loss_of, opt_name, plain_lr=0.01):
    """Trains one copy of the model through the plugin (lr 0.01) and one in
    plain torch (plain_lr), from the same initial weights and batches.
    Returns (plugin losses, plain losses, plugin state, plain state, initial state)."""
    torch.manual_seed(0)
    m1 = make()
    torch.manual_seed(0)
    m2 = make()
    initial = {k: v.clone() for k, v in m2.state_dict().items()}
    o1 = ab.DistributedOptimizer(OPTIMIZERS[opt_name]([p for p in m1.parameters() if p.requires_grad], 0.01), m1)
    o2 = OPTIMIZERS[opt_name]([p for p in m2.parameters() if p.requires_grad], plain_lr)
    s1 = torch.optim.lr_scheduler.StepLR(o1, 2, 0.5)
    s2 = torch.optim.lr_scheduler.StepLR(o2, 2, 0.5)
    g = torch.Generator().manual_seed(1)
    losses = ([], [])
    for step in range(STEPS):
        x = inputs(g)
        for m, o, s, out in ((m1, o1, s1, losses[0]), (m2, o2, s2, losses[1])):
            torch.manual_seed(100 + step)  # dropout and stochastic depth draw alike
            o.zero_grad()
            y = m(**x) if isinstance(x, dict) else m(x)
            loss = loss_of(y)
            loss.backward()
            o.step()
            s.step()
            out.append(loss.item())
    o1.synchronize()
    return losses[0], losses[1], m1.state_dict(), m2.state_dict(), initial


def differences(a, b):
    """Names of the state-dict entries that differ, with the largest difference."""
    bad = []
    for (name, x), y in zip(a.items(), b.values()):
        if not torch.equal(x, y):
            bad.append("%s (max difference %.3g)" % (name, (x.float() - y.float()).abs().max().item()))
    return bad


class Structures(unittest.TestCase):
    def tearDown(self):
        ab.shutdown()

    def check(self, name):
        make, inputs, loss_of = CASES[name]
        for opt in OPTIMIZERS:
            with self.subTest(optimizer=opt):
                got_losses, want_losses, got, want, initial = train_both(make, inputs, loss_of, opt)
                ab.shutdown()
                self.assertEqual(list(got), list(want), "%s: the state dicts hold other entries" % name)
                self.assertEqual(got_losses, want_losses, "%s with %s: losses" % (name, opt))
                bad = differences(got, want)
                self.assertEqual(bad, [], "%s with %s: %d entries differ from plain torch, first: %s"
                                 % (name, opt, len(bad), bad[:3]))
                # Training moved the parameters: the comparison is not of two idle models.
                self.assertTrue(differences(want, initial), "%s with %s: training changed nothing" % (name, opt))


def _add_test(name):
    setattr(Structures, "test_" + name, lambda self: self.check(name))


for _name in CASES:
    _add_test(_name)


class NegativeControl(unittest.TestCase):
    def tearDown(self):
        ab.shutdown()

    def test_comparison_catches_another_learning_rate(self):
        make, inputs, loss_of = CASES["tied"]
        got_losses, want_losses, got, want, _ = train_both(make, inputs, loss_of, "sgd", plain_lr=0.0100001)
        self.assertEqual(got_losses[0], want_losses[0], "the first forward precedes any update")
        self.assertNotEqual(got_losses, want_losses)
        self.assertTrue(differences(got, want), "a learning rate 1e-5 relative larger must change some parameter")


if __name__ == "__main__":
    unittest.main()
