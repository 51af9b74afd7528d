#!/usr/bin/env python3
"""TCP goodput of one testbed host's link, one way and both ways at once.

A parameter server receives every worker's pushes and sends every worker its
answers at the same time, so its link carries full traffic in both
directions. This measures what TCP gets through a tc-shaped host link in
that case: host 1 (the "server") at RATE, hosts 0, 2, 3 (the "workers") at
1 Gbit/s; first three flows into host 1 alone, then three flows in and three
flows out at once. Run as root (network namespaces):

    sudo scripts/testbed-duplex.py [RATE] [SECONDS]

RATE defaults to 250Mbps, SECONDS to 6; the bytes of the middle two thirds
count. Prints each direction's goodput in MB/s beside the TCP ceiling (1448/1514 of the rate: tc shapes
Ethernet frames). See docs/testbed.md.
"""
import os
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve(port, n, t1, t2, out):
    """Accepts n connections on port and reads them to the end; writes the
    bytes that arrived between times t1 and t2 to out."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    print("ready", flush=True)
    tot = 0
    lock = threading.Lock()

    def read(c):
        nonlocal tot
        while True:
            b = c.recv(1 << 16)
            if not b:
                return
            if t1 <= time.time() <= t2:
                with lock:
                    tot += len(b)

    ts = []
    for _ in range(n):
        c, _ = s.accept()
        t = threading.Thread(target=read, args=(c,))
        t.start()
        ts.append(t)
    for t in ts:
        t.join()
    out.write("%d\n" % tot)


def send(host, port, until):
    """Sends to host:port until time until."""
    c = socket.create_connection((host, port))
    buf = b"x" * (1 << 16)
    while time.time() < until:
        c.sendall(buf)
    c.close()


def rate_bps(rate):
    """'250Mbps' -> 250e6 (bps, Kbps, Mbps or Gbps)."""
    for unit, f in (("Gbps", 1e9), ("Mbps", 1e6), ("Kbps", 1e3), ("bps", 1)):
        if rate.endswith(unit):
            try:
                return float(rate[: -len(unit)]) * f
            except ValueError:
                break
    sys.exit("testbed-duplex: RATE must be a number with bps, Kbps, Mbps or Gbps, got %r" % rate)


def ns(bed, i):
    return "%s-h%d" % (bed, i)


def main():
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.stdout)
        return
    if sys.argv[1:2] == ["--send"]:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
        return
    rate = sys.argv[1] if len(sys.argv) > 1 else "250Mbps"
    rate_bps(rate)
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 6
    bed = "abduplex"
    ab = os.environ.get("AUTOBYTE", "/tmp/autobyte-duplex")
    subprocess.run(["go", "build", "-o", ab, "./cmd/autobyte"], cwd=ROOT, check=True)
    subprocess.run([ab, "testbed", "down", "--name", bed], capture_output=True)
    subprocess.run([ab, "testbed", "up", "--name", bed, "--hosts", "4", "--rate", "1Gbps", "--congestion", os.environ.get("CONGESTION", "cubic")], check=True, capture_output=True)
    try:
        subprocess.run([ab, "testbed", "set", "--name", bed, "--host", "1", "--rate", rate], check=True)
        addr = {}
        for i in range(4):
            out = subprocess.run(["ip", "netns", "exec", ns(bed, i), "ip", "-4", "-o", "addr", "show", "eth0"],
                                 capture_output=True, text=True, check=True).stdout
            addr[i] = out.split()[3].split("/")[0]
        me = os.path.abspath(__file__)

        def run(flows):
            """Runs flows (from host, to host) at once for secs seconds; returns
            the MB/s into and out of host 1 over the middle two thirds."""
            start = time.time() + 1
            t1, t2, until = start + secs / 6, start + secs * 5 / 6, start + secs
            sinks = {}
            for to in sorted({t for _, t in flows}):
                n = sum(1 for _, t in flows if t == to)
                p = subprocess.Popen(["ip", "netns", "exec", ns(bed, to), sys.executable, me, "--serve", str(5100 + to), str(n), str(t1), str(t2)],
                                     stdout=subprocess.PIPE, text=True)
                assert p.stdout.readline().strip() == "ready"
                sinks[to] = p
            srcs = [subprocess.Popen(["ip", "netns", "exec", ns(bed, fr), sys.executable, me, "--send", addr[to], str(5100 + to), str(until)])
                    for fr, to in flows]
            for p in srcs:
                p.wait()
            got = {to: int(p.stdout.read()) for to, p in sinks.items()}
            for p in sinks.values():
                p.wait()
            into = got.get(1, 0) / 1e6 / (t2 - t1)
            out = sum(b for to, b in got.items() if to != 1) / 1e6 / (t2 - t1)
            return into, out

        ceiling = rate_bps(rate) / 8 * 1448 / 1514 / 1e6
        workers = (0, 2, 3)
        g_in, _ = run([(w, 1) for w in workers])
        print("one way:   into host 1 %.2f MB/s (%.0f%% of the TCP ceiling %.2f MB/s)" % (g_in, 100 * g_in / ceiling, ceiling))
        g_in, g_out = run([(w, 1) for w in workers] + [(1, w) for w in workers])
        print("both ways: into host 1 %.2f MB/s, out of host 1 %.2f MB/s: %.0f%% of twice the ceiling" % (g_in, g_out, 100 * (g_in + g_out) / (2 * ceiling)))
    finally:
        subprocess.run([ab, "testbed", "down", "--name", bed], capture_output=True)


if __name__ == "__main__":
    main()
