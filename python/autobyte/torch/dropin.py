"""Runs an unchanged DDP script through autobyte.

    python -m autobyte.torch.dropin SCRIPT [ARGS...]
    python -m autobyte.torch.dropin -m MODULE [ARGS...]

for example::

    autobyte launch --workers 4 --servers 2 -- python -m autobyte.torch.dropin train.py --epochs 3
    PYTHONPATH=python torchrun --nproc_per_node 4 -m autobyte.torch.dropin train.py --epochs 3

Before the script runs, install() makes ``torch.nn.parallel.DistributedDataParallel``
autobyte's (autobyte.torch.DistributedDataParallel, see ddp.py): the
script's wrapper line, ``from torch.nn.parallel import
DistributedDataParallel as DDP`` included, and the libraries the script
imports that wrap models themselves get autobyte's engine, and
``isinstance(model, torch.nn.parallel.DistributedDataParallel)`` holds for
the wrapped model. Everything else stays torch's: the script's
``init_process_group``, its collectives (a metric's ``all_reduce``, a
barrier), ``DistributedSampler``. autobyte takes the rank, the world size
and the job's secret from the process group the script initialised, so
torchrun and torch.multiprocessing.spawn need nothing of autobyte's set.

The script runs as ``__main__``, with ``sys.argv`` and ``sys.path[0]`` as
``python SCRIPT ARGS`` gives them; its exit status is the process's.

Python processes the script starts with the spawn start method
(torch.multiprocessing.spawn, as in PyTorch's DDP tutorial, or
multiprocessing's "spawn" context) install it before they import the
script; forked ones inherit it. Processes started otherwise (subprocess,
the forkserver method) do not: they call install() themselves.

What stays torch's class: ``torch.nn.parallel.distributed.DistributedDataParallel``
(the defining module, which torch's own code refers to) and any reference
taken before install().
"""

import functools
import importlib.util
import multiprocessing.spawn as spawn
import os
import runpy
import sys

import torch

USAGE = "usage: python -m autobyte.torch.dropin SCRIPT [ARGS...]  |  python -m autobyte.torch.dropin -m MODULE [ARGS...]"

_installed = False
# The directory autobyte is imported from, first on a spawned child's path
# until the child takes its parent's.
_PLUGIN_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def install():
    """Makes torch.nn.parallel.DistributedDataParallel autobyte's wrapper,
    here and in the Python processes this one starts with the spawn start
    method (see the module's comment). Calling it again does nothing."""
    global _installed
    if _installed:
        return
    from . import DistributedDataParallel
    torch.nn.parallel.DistributedDataParallel = DistributedDataParallel
    spawn.get_command_line = functools.partial(_installing_command_line, spawn.get_command_line)
    _installed = True


def _installing_command_line(command_line, **kwds):
    """multiprocessing.spawn.get_command_line, whose child installs first:
    before the child imports the parent's __main__ (the script), so that
    the script's own ``from torch.nn.parallel import
    DistributedDataParallel`` finds autobyte's class there too."""
    cmd = command_line(**kwds)
    if "-c" not in cmd:  # a frozen interpreter: no code to put first
        return cmd
    i = cmd.index("-c") + 1
    cmd[i] = "import sys; sys.path.insert(0, %r); import autobyte.torch.dropin; autobyte.torch.dropin.install(); %s" % (
        _PLUGIN_ROOT, cmd[i])
    return cmd


def main(argv=None):
    """Runs the script or module argv names (sys.argv[1:] by default) with
    install() done and returns the exit status: 0 once it has run, 0 for
    --help, 2 for a usage error. The script's own sys.exit() and
    exceptions pass through."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__.split("\n\n", 2)[2], file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print("autobyte.torch.dropin: -m needs a module name\n" + USAGE, file=sys.stderr)
            return 2
        module = argv[1]
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as e:
            found, why = None, e
        else:
            why = "not found on sys.path"
        if found is None:
            print("autobyte.torch.dropin: no module %r to run (%s)" % (module, why), file=sys.stderr)
            return 2
        install()
        sys.argv = [module] + argv[2:]  # run_module puts the module's file in argv[0]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    if argv[0].startswith("-"):
        print("autobyte.torch.dropin: unknown option %r\n%s" % (argv[0], USAGE), file=sys.stderr)
        return 2
    script = argv[0]
    if not os.path.isfile(script):
        print("autobyte.torch.dropin: no script %r (%s)" % (script, "a directory" if os.path.isdir(script)
                                                            else "no such file"), file=sys.stderr)
        return 2
    install()
    sys.argv = [script] + argv[1:]
    # As `python SCRIPT` has it: the script's directory first on the path,
    # where `python -m` put the working directory.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    # Run as `python -m`, this file is __main__, and the script becomes
    # __main__ next: the work is done by the module under its own name, so
    # that a script's own autobyte.torch.dropin.install() finds it done.
    from autobyte.torch import dropin
    sys.exit(dropin.main())
