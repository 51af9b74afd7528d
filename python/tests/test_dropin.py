"""python -m autobyte.torch.dropin: an unchanged DDP script (ddp_script.py,
nothing of autobyte in it) trained through autobyte, bit for bit what
torch's DDP gives it (2 workers, so every sum is a + b in either order):
under the launcher on a parameter server and on the ring, started by
torch.multiprocessing.spawn with no launcher and nothing of autobyte's in
the environment, and under torchrun; and a Hugging Face Trainer job
(trainer_script.py), which wraps the model itself. Each run also reports which wrapper
the script got, so a runner that replaced nothing fails here (the plain
runs, torch's wrapper, are the control). Then the runner's own behaviour:
argv, sys.path and __main__ as `python SCRIPT` gives them, exit statuses,
and its usage errors; and the wrapper's checks of the process group the
script passes or initialised.
"""

import os
import subprocess
import sys
import textwrap
import unittest

import torch

from helpers import HERE, PY, ROOT, launch, master_port, tmp

SCRIPT = os.path.join(HERE, "ddp_script.py")
TORCH_DDP = "torch.nn.parallel.distributed"
AUTOBYTE_DDP = "autobyte.torch.ddp"


def bare_env(**kw):
    """The environment of a job started without the launcher: the plugin on
    PYTHONPATH, nothing else of autobyte's or of a launcher's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AUTOBYTE_") and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=os.path.join(ROOT, "python"), PYTHONFAULTHANDLER="1", **kw)
    return env


def run(args, timeout=180, **kw):
    return subprocess.run([PY] + args, env=kw.pop("env", bare_env()), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, **kw)


class Training(unittest.TestCase):
    _plain = None

    def plain(self):
        """torch's DDP on the script, started by mp.spawn (2 ranks)."""
        if Training._plain is None:
            out = tmp("dropin-plain.pt")
            r = run([SCRIPT, "--out", out, "--spawn", "2", str(master_port())])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            Training._plain = torch.load(out)
            self.assertEqual(Training._plain["wrapper"], TORCH_DDP)
        return Training._plain

    def assertSameAsDDP(self, got, what):
        want = self.plain()
        self.assertEqual(got["wrapper"], AUTOBYTE_DDP, "%s: the script trained through %s, not autobyte" % (what, got["wrapper"]))
        self.assertTrue(got["is_ddp"], "%s: isinstance(model, torch.nn.parallel.DistributedDataParallel) failed" % what)
        self.assertGreater(len(set(want["losses"])), 1, "the script did not train")
        self.assertEqual(got["losses"], want["losses"], "%s: losses" % what)
        self.assertEqual(got["averaged"], want["averaged"], "%s: the script's all_reduce of the loss" % what)
        self.assertEqual(got["keys"], want["keys"], "%s: the wrapper's state dict keys" % what)
        differ = [k for k, v in want["state"].items() if not torch.equal(got["state"][k], v)]
        self.assertEqual(differ, [], "%s: %d of %d tensors differ from DDP's" % (what, len(differ), len(want["state"])))

    def test_under_the_launcher(self):
        plain = tmp("dropin-launch-plain.pt")
        rc, out, _ = launch(["--workers", "2", "--arch", "allreduce"], ["--out", plain], script=SCRIPT)
        self.assertEqual(rc, 0, out)
        got = torch.load(plain)
        self.assertEqual(got["wrapper"], TORCH_DDP)
        self.assertEqual(got["losses"], self.plain()["losses"], "the launcher changed torch's DDP run")
        for where in (["--servers", "1"], ["--arch", "allreduce"]):
            with self.subTest(where=where):
                path = tmp("dropin-launch-%s.pt" % where[0].strip("-"))
                rc, out, _ = launch(["--workers", "2"] + where, ["autobyte.torch.dropin", SCRIPT, "--out", path],
                                    script="-m")
                self.assertEqual(rc, 0, out)
                self.assertSameAsDDP(torch.load(path), "launch %s" % " ".join(where))

    def test_parameters_and_buffers_to_ignore(self):
        # DDP's _set_params_and_buffers_to_ignore_for_model: the named
        # parameter and buffer are neither broadcast nor synchronised, so
        # each rank keeps its own, under both wrappers alike.
        runs = {}
        for name, where, command in (("ddp", ["--arch", "allreduce"], [SCRIPT]),
                                     ("ps", ["--servers", "1"], ["-m", "autobyte.torch.dropin", SCRIPT])):
            out = tmp("dropin-ignore-%s.pt" % name)
            rc, text, _ = launch(["--workers", "2"] + where, command[1:] + ["--out", out, "--ignore"], script=command[0])
            self.assertEqual(rc, 0, text)
            runs[name] = [torch.load(out), torch.load(out + ".rank1")]
        (want0, want1), (got0, got1) = runs["ddp"], runs["ps"]
        self.assertEqual(got0["wrapper"], AUTOBYTE_DDP)
        self.assertEqual(got0["losses"], want0["losses"])
        differ = [k for k, v in want0["state"].items() if not torch.equal(got0["state"][k], v)]
        self.assertEqual(differ, [], "rank 0: tensors that differ from DDP's")
        # Rank 1: its parameters and its own running mean are DDP's rank 1's
        # (the other buffers differ by broadcast_buffers, see docs/pytorch.md).
        for k in ["0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias", "1.running_mean"]:
            self.assertTrue(torch.equal(got1["state"][k], want1["state"][k]), "rank 1's %s differs from DDP's" % k)
        # (The ranks' other parameters differ too: clipping scales every
        # gradient by a norm that takes in each rank's own bias gradient.)
        for k in ("4.bias", "1.running_mean"):
            self.assertFalse(torch.equal(got0["state"][k], got1["state"][k]), "%s was not kept apart" % k)

    def test_spawned_without_a_launcher(self):
        # mp.spawn's children install before they import the script, and
        # autobyte takes rank, world size and its secret from the script's
        # process group: nothing of autobyte's is in the environment.
        path = tmp("dropin-spawn.pt")
        r = run(["-m", "autobyte.torch.dropin", SCRIPT, "--out", path, "--spawn", "2", str(master_port())])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertSameAsDDP(torch.load(path), "mp.spawn")

    def test_torchrun(self):
        torchrun = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        hello = tmp("dropin-hello.py")
        with open(hello, "w") as f:
            f.write("print('hello')\n")
        r = run(torchrun + ["--master_port", str(master_port()), hello])
        if r.returncode != 0:
            # torch 1.13's torchrun fails on Python 3.11 before it starts any
            # script; skip only when it cannot run one that prints a line.
            last = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            print("\nSKIPPED test_torchrun: torch %s's torchrun cannot run a trivial script here: %s"
                  % (torch.__version__, last[0]), file=sys.stderr, flush=True)
            self.skipTest("torch %s's torchrun cannot run a trivial script here" % torch.__version__)
        path = tmp("dropin-torchrun.pt")
        r = run(torchrun + ["--master_port", str(master_port()), "-m", "autobyte.torch.dropin", SCRIPT, "--out", path])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertSameAsDDP(torch.load(path), "torchrun")


def trainer_missing():
    """Why the Hugging Face Trainer cannot run here, or None."""
    if int(torch.__version__.split(".")[0]) < 2:
        # transformers' Trainer imports torch.optim.lr_scheduler.LRScheduler.
        return "transformers' Trainer needs torch 2, this is torch %s" % torch.__version__
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return "transformers and accelerate are needed for %s (%s); .ci/run's torch 2 venv has them" % (sys.executable, e)
    return None


class HuggingFace(unittest.TestCase):
    def test_trainer(self):
        # The Trainer wraps the model itself (accelerate's prepare), with
        # no_sync() for the accumulated micro-batch and clipping before the
        # step: the job as it is, under the launcher.
        why = trainer_missing()
        if why:
            print("\nSKIPPED test_trainer: %s" % why, file=sys.stderr, flush=True)
            self.skipTest(why)
        script = os.path.join(HERE, "trainer_script.py")
        runs = {}
        dropin = ["-m", "autobyte.torch.dropin", script]
        for name, where, command in (("ddp", ["--arch", "allreduce"], [script]),
                                     ("ps", ["--servers", "1"], dropin), ("ring", ["--arch", "allreduce"], dropin)):
            out = tmp("trainer-" + name)
            rc, text, _ = launch(["--workers", "2"] + where, command[1:] + [out], script=command[0], timeout=300)
            self.assertEqual(rc, 0, text)
            runs[name] = torch.load(os.path.join(out, "result.pt"))
        want = runs.pop("ddp")
        self.assertEqual(want["wrapper"], TORCH_DDP)
        self.assertEqual(len(want["losses"]), 6)
        for name, got in runs.items():
            with self.subTest(run=name):
                self.assertEqual(got["wrapper"], AUTOBYTE_DDP, "%s: the Trainer's model went through %s" % (name, got["wrapper"]))
                self.assertEqual(got["losses"], want["losses"], name)
                differ = [k for k, v in want["state"].items() if not torch.equal(got["state"][k], v)]
                self.assertEqual(differ, [], "%s: %d of %d tensors differ from DDP's" % (name, len(differ), len(want["state"])))


class Runner(unittest.TestCase):
    def write(self, name, text):
        path = tmp(name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def test_runs_the_script_as_python_does(self):
        probe = self.write("dropin-probe.py", """
            import os, sys
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            assert __name__ == "__main__", __name__
            print("argv", sys.argv[1:])
            print("argv0", os.path.basename(sys.argv[0]))
            print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
            print("class", DDP.__module__, torch.nn.parallel.DistributedDataParallel is DDP)
            m = DDP(torch.nn.Linear(2, 1))
            m(torch.ones(1, 2)).sum().backward()
            print("grad", m.module.weight.grad.tolist())
            sys.exit(int(sys.argv[-1]))
        """)
        r = run(["-m", "autobyte.torch.dropin", probe, "--flag", "x y", "3"], cwd=HERE)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("argv ['--flag', 'x y', '3']", r.stdout)
        self.assertIn("argv0 dropin-probe.py", r.stdout)
        self.assertIn("path0 True", r.stdout)
        self.assertIn("class %s True" % AUTOBYTE_DDP, r.stdout)
        self.assertIn("grad [[1.0, 1.0]]", r.stdout)
        # The same script without the runner: torch's class (the control).
        r = run([probe, "0"], cwd=HERE)
        self.assertIn("class %s True" % TORCH_DDP, r.stdout, r.stderr)

    def test_ddp_attributes(self):
        # What scripts and libraries read back from the wrapper, as torch's
        # DDP has it.
        probe = self.write("dropin-attributes.py", """
            import torch, torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            dist.init_process_group("gloo")
            m = DDP(torch.nn.Linear(2, 2), find_unused_parameters=True, gradient_as_bucket_view=True)
            print(type(m).__module__)
            print([m.device_ids, m.output_device, m.dim, m.broadcast_buffers, m.find_unused_parameters,
                   m.gradient_as_bucket_view, m.static_graph, m.process_group is dist.group.WORLD,
                   m.require_backward_grad_sync, m.require_forward_param_sync, sorted(m.state_dict())])
            dist.destroy_process_group()
        """)
        env = bare_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port()))
        plain = run([probe], env=env)
        ours = run(["-m", "autobyte.torch.dropin", probe], env=env)
        for r in (plain, ours):
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(plain.stdout.splitlines()[0], TORCH_DDP)
        self.assertEqual(ours.stdout.splitlines()[0], AUTOBYTE_DDP)
        self.assertEqual(ours.stdout.splitlines()[1], plain.stdout.splitlines()[1])

    def test_module_and_failures(self):
        pkg = tmp("dropin-pkg")
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, "dropin_mod.py"), "w") as f:
            f.write("import sys, torch\nprint('module', __name__, sys.argv[1:], torch.nn.parallel.DistributedDataParallel.__module__)\n")
        r = run(["-m", "autobyte.torch.dropin", "-m", "dropin_mod", "a"], cwd=pkg)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("module __main__ ['a'] %s" % AUTOBYTE_DDP, r.stdout)
        boom = self.write("dropin-boom.py", "raise ValueError('the script failed: 42')\n")
        r = run(["-m", "autobyte.torch.dropin", boom])
        self.assertEqual(r.returncode, 1)
        self.assertIn("ValueError: the script failed: 42", r.stderr)
        for args, rc, words in (([], 2, "usage: python -m autobyte.torch.dropin"),
                                (["--help"], 0, "usage: python -m autobyte.torch.dropin"),
                                ([tmp("no-such-script.py")], 2, "no script %r (no such file)" % tmp("no-such-script.py")),
                                ([pkg], 2, "(a directory)"),
                                (["-m"], 2, "-m needs a module name"),
                                (["-m", "no_such_module_xyz"], 2, "no module 'no_such_module_xyz' to run"),
                                (["--bogus", boom], 2, "unknown option '--bogus'")):
            with self.subTest(args=args):
                r = run(["-m", "autobyte.torch.dropin"] + args)
                self.assertEqual(r.returncode, rc, r.stdout + r.stderr)
                self.assertIn(words, r.stdout + r.stderr)


class ProcessGroup(unittest.TestCase):
    """The wrapper against the process group a script initialised or passes."""

    def test_one_process(self):
        script = os.path.join(tmp("dropin-pg1.py"))
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import sys, torch, torch.distributed as dist
                import autobyte.torch as ab
                m = torch.nn.Linear(2, 1)
                try:
                    ab.DistributedDataParallel(m, process_group=object())
                except ab.AutobyteError as e:
                    print("uninitialised:", e)
                dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%s" % sys.argv[1])
                try:
                    w = ab.DistributedDataParallel(m, process_group=dist.group.WORLD)
                    print("world group:", ab.rank(), ab.size())
                except ab.AutobyteError as e:
                    print("disagree:", e)
                dist.destroy_process_group()
            """))
        r = run([script, str(master_port())])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("uninitialised: autobyte: DistributedDataParallel(process_group=<object", r.stdout)
        self.assertIn("torch.distributed is not initialised", r.stdout)
        self.assertIn("world group: 0 1", r.stdout)
        # Told another world size than the group's: refused, naming both.
        r = run([script, str(master_port())], env=bare_env(RANK="0", WORLD_SIZE="2"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("disagree: autobyte: this process is rank 0 of 1 in torch.distributed's process group, but rank 0 "
                      "of 2 to autobyte (RANK and WORLD_SIZE", r.stdout)

    def test_a_subgroup_is_refused(self):
        script = os.path.join(tmp("dropin-pg2.py"))
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
                import autobyte.torch as ab

                def work(rank, port, autobyte_port):
                    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:%d" % port)
                    alone, both = dist.new_group([0]), dist.new_group([0, 1])
                    try:
                        ab.DistributedDataParallel(torch.nn.Linear(2, 1), process_group=alone)
                    except ab.AutobyteError as e:
                        print("rank %d: %s" % (rank, e), flush=True)
                    else:
                        raise SystemExit("rank %d: a subgroup was accepted" % rank)
                    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(autobyte_port))
                    m = ab.DistributedDataParallel(torch.nn.Linear(2, 1), process_group=both)
                    print("rank %d: all ranks' group: rank %d of %d" % (rank, ab.rank(), ab.size()), flush=True)
                    del m
                    dist.barrier()
                    dist.destroy_process_group()

                if __name__ == "__main__":
                    mp.spawn(work, args=(int(sys.argv[1]), int(sys.argv[2])), nprocs=2)
            """))
        r = run([script, str(master_port()), str(master_port())])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for rank in (0, 1):
            self.assertIn("rank %d: all ranks' group: rank %d of 2" % (rank, rank), r.stdout)
        self.assertIn("rank 0: autobyte: DistributedDataParallel(process_group=...): a group of 1 of the job's 2 ranks",
                      r.stdout)
        self.assertIn("rank 1: autobyte: DistributedDataParallel(process_group=...): a group that this rank (1) is not in",
                      r.stdout)


if __name__ == "__main__":
    unittest.main()
