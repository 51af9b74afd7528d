#!/usr/bin/env bash
# Where a testbed job's link time goes: runs a parameter-server replay on
# the testbed (as scripts/testbed-fidelity.sh does) and, once it is past
# its first iterations, samples every host's tc byte counters (egress on
# the host's side of its veth, ingress on the switch's side) every 0.15 s,
# printing each host's rate out/in in MB/s per interval and, per host, the
# mean rate over the intervals its link carried anything. Hosts are h0..
# in the testbed's order: servers first, then workers.
#
#   sudo scripts/testbed-link-usage.sh [MODEL] [SCALE] [SCHEDULER] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-resnet50} scale=${2:-8} sched=${3:-fifo} secs=${4:-8}
ab=${AUTOBYTE_BIN:-/tmp/autobyte-link-usage}
if [ -z "${AUTOBYTE_BIN:-}" ]; then go build -o "$ab" ./cmd/autobyte; fi
"$ab" launch --testbed abuse --congestion "${CONGESTION:-cubic}" --model "$model" --workers 4 --servers 2 --bandwidth 1Gbps \
  --iterations 40 --compute-scale "$scale" --scheduler "$sched" --json >/dev/null 2>&1 &
job=$!
trap 'kill $job 2>/dev/null || true; wait $job 2>/dev/null || true' EXIT
for _ in $(seq 60); do ip netns list | grep -q '^abuse-h5' && break; sleep 0.5; done
sleep 10 # past the first iterations
python3 - "$secs" <<'PY'
import re, subprocess, sys, time
def sent(ns, dev):
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
    m = re.search(r"Sent (\d+) bytes", out)
    return int(m.group(1)) if m else 0
hosts = 6
rows, t0 = [], time.time()
while time.time() - t0 < float(sys.argv[1]):
    rows.append([time.time() - t0] + [sent(f"abuse-h{h}", "eth0") for h in range(hosts)] + [sent("abuse-sw", f"h{h}") for h in range(hosts)])
    time.sleep(0.15)
print("t_s   " + " ".join(f"h{h}:out/in" for h in range(hosts)))
busy = [[[], []] for _ in range(hosts)]
for a, b in zip(rows, rows[1:]):
    dt = b[0] - a[0]
    rates = [[(b[1 + h] - a[1 + h]) / dt / 1e6, (b[1 + hosts + h] - a[1 + hosts + h]) / dt / 1e6] for h in range(hosts)]
    print(f"{a[0]:4.1f}  " + " ".join(f"{o:4.0f}/{i:4.0f}" for o, i in rates))
    for h, (o, i) in enumerate(rates):
        if o > 1: busy[h][0].append(o)
        if i > 1: busy[h][1].append(i)
mean = lambda xs: sum(xs) / len(xs) if xs else 0
print("mean MB/s while busy (out/in): " + " ".join(f"h{h} {mean(o):.0f}/{mean(i):.0f}" for h, (o, i) in enumerate(busy)))
PY
