"""Checkpoint and resume through the plugin.

A 2-worker job (Adam, three parameter groups, StepLR) saves model,
optimizer and scheduler state on every worker after step 4 of 10 and goes
on; a second job builds a fresh model (other initial weights), wraps the
optimizer, loads each worker's checkpoint and trains steps 5-10. With 2
workers every sum is a + b in any order and the batches are seeded by rank
and step, so the resumed job must end with exactly the continuous job's
parameters and losses (asserted bit for bit). A checkpoint that missed the
update still pending at step 4, or an optimizer whose per-layer updates
kept the state from before load_state_dict, would not.
"""

import unittest

import torch

from helpers import Compare, run_ok, tmp

ARGS = ["--model", "smooth", "--optimizer", "adam", "--groups", "--scheduler", "--iterations", "10", "--batch", "8"]


def flatten(sd, prefix=""):
    """(key, tensor or value) pairs of a nested state dict."""
    if isinstance(sd, dict):
        for k in sorted(sd, key=str):
            yield from flatten(sd[k], "%s%s/" % (prefix, k))
    elif isinstance(sd, (list, tuple)):
        for i, v in enumerate(sd):
            yield from flatten(v, "%s%d/" % (prefix, i))
    else:
        yield prefix, sd


class Checkpoint(unittest.TestCase, Compare):
    def assertSameState(self, a, b, what):
        fa, fb = list(flatten(a)), list(flatten(b))
        self.assertEqual([k for k, _ in fa], [k for k, _ in fb], what)
        for (k, x), (_, y) in zip(fa, fb):
            same = torch.equal(x, y) if torch.is_tensor(x) else x == y
            self.assertTrue(same, "%s: %s differs: %s vs %s" % (what, k, x, y))

    def test_resume_gives_the_continuous_run(self):
        ck, full, resumed = tmp("ck.pt"), tmp("ck-full.pt"), tmp("ck-resumed.pt")
        launch = ["--workers", "2", "--servers", "1", "--partition", "4KB", "--credit", "16KB"]
        run_ok(self, launch, ["--backend", "autobyte", "--out", full, "--checkpoint-at", "4", "--checkpoint", ck] + ARGS)
        c0, c1 = torch.load(ck + ".rank0"), torch.load(ck + ".rank1")
        self.assertEqual(c0["step"], 4)
        self.assertEqual(len(c0["optimizer"]["param_groups"]), 3)
        self.assertEqual(len(c0["optimizer"]["state"]), 6, "Adam's state of every parameter is in the checkpoint")
        del c0["losses"], c1["losses"]  # each rank's own
        self.assertSameState(c0, c1, "rank 1's checkpoint vs rank 0's")
        run_ok(self, launch, ["--backend", "autobyte", "--out", resumed, "--resume", ck, "--init-seed", "8"] + ARGS)
        a, b = torch.load(full), torch.load(resumed)
        self.assertMoved(a, "continuous run")
        self.assertEqual(a["losses"], b["losses"])
        self.assertSameState(b["state"], a["state"], "resumed vs continuous")
        self.assertRanksEqual(resumed, 2)


if __name__ == "__main__":
    unittest.main()
