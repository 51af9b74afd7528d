#!/usr/bin/env bash
# Samples the shaped queues of a running testbed (root): every 50 ms, the
# backlog of each host's egress leaf (NAME-hI eth0) and of its switch port
# (NAME-sw hI, the host's ingress), then prints median, 90th percentile and
# largest backlog per queue. Run it while a job runs on the testbed:
#
#   sudo scripts/testbed-backlog.sh NAME HOSTS SECONDS
#   sudo scripts/testbed-backlog.sh abq 6 12
#
# Bytes in these FIFO queues are sent in arrival order whatever their
# priority; at rate R a backlog of B bytes delays a piece by B/R.
set -euo pipefail
name=${1:?testbed name} hosts=${2:?number of hosts} secs=${3:-10}
backlog() { # namespace device -> bytes in the leaf (pfifo or netem) queue
  ip netns exec "$1" tc -s qdisc show dev "$2" | awk '/qdisc (pfifo|netem)/{f=1} f&&/backlog/{print $2; exit}'
}
end=$((SECONDS + secs))
samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
while [ $SECONDS -lt $end ]; do
  line=""
  for ((i = 0; i < hosts; i++)); do
    line+=" egress$i=$(backlog "$name-h$i" eth0) ingress$i=$(backlog "$name-sw" "h$i")"
  done
  echo "$line" >>"$samples"
  sleep 0.05
done
/usr/bin/python3 - "$samples" <<'PY'
import re, statistics, sys
def parse(v):
    m = re.fullmatch(r"(\d+)([KM]?)b", v)
    if not m:
        sys.exit("testbed-backlog: cannot read backlog %r" % v)
    return int(m.group(1)) * {"": 1, "K": 1000, "M": 1000000}[m.group(2)]
rows = [dict((k, parse(v)) for k, v in re.findall(r"(\w+)=(\S+)", l)) for l in open(sys.argv[1])]
if not rows:
    sys.exit("testbed-backlog: no samples")
print("%d samples" % len(rows))
for k in rows[0]:
    xs = sorted(r[k] for r in rows)
    print("%-10s median %6.0f KB   p90 %6.0f KB   max %6.0f KB" % (k, statistics.median(xs) / 1e3, xs[int(0.9 * (len(xs) - 1))] / 1e3, xs[-1] / 1e3))
PY
