"""Loading the Go engine (libautobyte.so) with ctypes.

The library is found at $AUTOBYTE_LIB, else next to this file. In a source
checkout (a go.mod above this package) it is built there with
``go build -buildmode=c-shared`` when missing or older than the Go sources,
under a file lock so that several workers starting together build it once.
"""

import ctypes
import fcntl
import json
import os
import shutil
import subprocess

from . import AutobyteError

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_NAME = "libautobyte.so"


def _repo_root():
    d = _HERE
    for _ in range(4):
        d = os.path.dirname(d)
        if os.path.exists(os.path.join(d, "go.mod")) and os.path.isdir(os.path.join(d, "cmd", "libautobyte")):
            return d
    return None


def _newest_go_source(root):
    newest = 0.0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("python", "docs", "out", "testdata")]
        for f in filenames:
            if f.endswith((".go", ".c", ".h")) or f in ("go.mod", "go.sum"):
                newest = max(newest, os.path.getmtime(os.path.join(dirpath, f)))
    return newest


def _build(root, path):
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        raise AutobyteError(
            "autobyte: %s is missing and Go is not installed to build it; build it with "
            "'go build -buildmode=c-shared -o %s ./cmd/libautobyte' in %s, or set AUTOBYTE_LIB" % (path, path, root))
    tmp = os.path.join(os.path.dirname(path), "libautobyte-%d.tmp.so" % os.getpid())
    cmd = [go, "build", "-buildmode=c-shared", "-o", tmp, "./cmd/libautobyte"]
    r = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    header = tmp[:-len(".so")] + ".h"  # go build writes a C header beside the library
    if os.path.exists(header):
        os.remove(header)
    if r.returncode != 0:
        raise AutobyteError("autobyte: building the engine failed (%s in %s):\n%s" % (" ".join(cmd), root, r.stdout))
    os.replace(tmp, path)


def library_path():
    """The path of libautobyte.so, building it first in a source checkout."""
    env = os.environ.get("AUTOBYTE_LIB")
    if env:
        if not os.path.exists(env):
            raise AutobyteError("autobyte: AUTOBYTE_LIB=%s does not exist" % env)
        return env
    path = os.path.join(_HERE, _LIB_NAME)
    root = _repo_root()
    if root is None:
        if not os.path.exists(path):
            raise AutobyteError("autobyte: %s is missing (build it with 'go build -buildmode=c-shared -o %s ./cmd/libautobyte' or set AUTOBYTE_LIB)" % (path, path))
        return path
    with open(os.path.join(_HERE, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path) or os.path.getmtime(path) < _newest_go_source(root):
            _build(root, path)
    return path


# The supervisor's status pipe ('autobyte launch' gives each script one as
# AUTOBYTE_STATUS_FD), through which an engine that lost a peer names it.
# Taken out of the environment and closed on exec, so that processes the
# script starts (which may be other jobs' workers) do not write to it.
_STATUS_FD = os.environ.pop("AUTOBYTE_STATUS_FD", None)
if _STATUS_FD is not None:
    try:
        os.set_inheritable(int(_STATUS_FD), False)
    except (ValueError, OSError):
        _STATUS_FD = None  # not an open descriptor: run unsupervised


_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Engine:
    """One session of the Go engine in this process."""

    def __init__(self, tensors, settings=None):
        self._lib = ctypes.CDLL(library_path())
        lib = self._lib
        lib.ab_open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.ab_post.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64]
        lib.ab_wait_layer.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.ab_wait_run.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.ab_close.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.ab_last_error.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.ab_tuning.argtypes = []
        lib.ab_mark.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.ab_report.argtypes = [ctypes.c_char_p, ctypes.c_int]
        for f in (lib.ab_open, lib.ab_post, lib.ab_wait_layer, lib.ab_wait_run, lib.ab_close, lib.ab_last_error,
                  lib.ab_tuning, lib.ab_mark, lib.ab_report):
            f.restype = ctypes.c_int
        # The engine, a Go library, sees only the environment the process
        # started with: what the script set in os.environ since (the DDP
        # tutorial's MASTER_ADDR and MASTER_PORT, set in each spawned worker
        # before init_process_group) goes along, under the settings.
        current = {k: v for k, v in os.environ.items() if k.startswith("AUTOBYTE_") or k in _RENDEZVOUS}
        settings = dict(current, **(settings or {}))
        if _STATUS_FD is not None:
            settings.setdefault("AUTOBYTE_STATUS_FD", _STATUS_FD)
        req = json.dumps({"tensors": tensors, "settings": settings}).encode()
        self._pid = os.getpid()
        self._check(lib.ab_open(req, len(req)))
        self.open = True
        self.tuning = lib.ab_tuning() == 1

    def _check(self, rc):
        if rc != 0:
            n = self._lib.ab_last_error(None, 0)
            buf = ctypes.create_string_buffer(n + 1)
            self._lib.ab_last_error(buf, n + 1)
            raise AutobyteError("autobyte: " + buf.value.decode(errors="replace"))

    def owned_here(self):
        """Whether this process opened the engine. A forked child inherits
        this object but not the engine's threads: a call from it would wait
        for ever."""
        return os.getpid() == self._pid

    def _owner(self):
        if not self.owned_here():
            raise AutobyteError(
                "autobyte: this process (pid %d) was forked from worker process %d after its engine started; the engine "
                "runs in that process only. Call optimizer.synchronize() before forking, or start child processes "
                "with the spawn method" % (os.getpid(), self._pid))

    def post(self, tensor, iteration, ptr, elems):
        self._owner()
        self._check(self._lib.ab_post(tensor, iteration, ptr, elems))

    def wait_layer(self, layer, iteration):
        self._owner()
        self._check(self._lib.ab_wait_layer(layer, iteration))

    def wait_run(self, layer, iteration):
        """wait_layer, returning how many layers from layer on (at least 1)
        have their sums of iteration in place."""
        self._owner()
        n = self._lib.ab_wait_run(layer, iteration)
        if n < 0:
            self._check(n)
        return n

    # Events of ab_mark.
    FORWARD_BEGIN, FORWARD_END, BACKWARD_END = 0, 1, 2

    def mark(self, event, iteration):
        self._check(self._lib.ab_mark(event, iteration))

    def report(self):
        n = self._lib.ab_report(None, 0)
        if n < 0:
            self._check(n)
        buf = ctypes.create_string_buffer(n + 1)
        self._lib.ab_report(buf, n + 1)
        return json.loads(buf.value.decode())

    def close(self, ok=True, reason=None):
        if not self.open:
            return
        self._owner()
        self.open = False
        self._check(self._lib.ab_close(1 if ok else 0, reason.encode() if reason else None))
