"""Models nobody wrote for autobyte (zoo_worker.py: EfficientNet-B0, a
VisionTransformer, a memory-efficient DenseNet, T5 and Llama), each a DDP
script with autobyte's wrapper in place of torch's: 2 workers, 3 steps of
Adam, every rank starting from its own weights. With 2 workers every sum is
a + b in either order, so the wrapper must give DDP's losses and final
state bit for bit, on a parameter server and on the ring alike (the models
alternate between the two).
"""

import os
import sys
import unittest

import torch

from helpers import launch, tmp

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo_worker.py")
sys.path.insert(0, os.path.dirname(ZOO))
import zoo_worker  # noqa: E402

try:
    import torchvision  # noqa: F401
    import transformers  # noqa: F401
    MISSING = None
except ImportError as e:
    MISSING = "torchvision and transformers are needed for %s (%s); .ci/run's venvs have them" % (sys.executable, e)

WHERE = {"efficientnet": ["--servers", "1"], "vit": ["--arch", "allreduce"], "densenet": ["--servers", "1"],
         "t5": ["--arch", "allreduce"], "llama": ["--servers", "1"]}


@unittest.skipIf(MISSING, MISSING)
class Zoo(unittest.TestCase):
    def run_job(self, name, backend, launch_args):
        out = tmp("zoo-%s-%s.pt" % (name, backend))
        rc, output, _ = launch(["--workers", "2"] + launch_args, ["--model", name, "--backend", backend, "--out", out],
                               script=ZOO, timeout=300)
        self.assertEqual(rc, 0, output)
        return torch.load(out)

    def test_models_against_ddp(self):
        self.assertEqual(sorted(WHERE), sorted(zoo_worker.MODELS))
        for name in zoo_worker.MODELS:
            with self.subTest(model=name):
                want = self.run_job(name, "ddp", ["--arch", "allreduce"])
                got = self.run_job(name, "autobyte-ddp", WHERE[name])
                self.assertNotEqual(want["losses"][0], want["losses"][-1], "%s did not train" % name)
                self.assertEqual(got["losses"], want["losses"], "%s (%s): losses" % (name, WHERE[name]))
                self.assertEqual(sorted(got["state"]), sorted(want["state"]))
                differ = [k for k, v in want["state"].items() if not torch.equal(got["state"][k], v)]
                self.assertEqual(differ, [], "%s (%s): %d of %d tensors differ from DDP's"
                                 % (name, WHERE[name], len(differ), len(want["state"])))
                print("\n  %s (%s): %d tensors bit for bit DDP's" % (name, " ".join(WHERE[name]), len(want["state"])),
                      file=sys.stderr, end="")


if __name__ == "__main__":
    unittest.main()
