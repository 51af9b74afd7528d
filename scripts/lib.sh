# Shell functions the measurement scripts share: source it from the
# repository root (the scripts cd there first).

# verified_time JSON WHAT: the iteration_time_s of one `autobyte launch
# --json` run; fails, naming WHAT, when the run's sums were not verified.
verified_time() {
  local t v
  read -r t v < <(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["iteration_time_s"], d["verified"])' "$1")
  if [ "$v" != True ]; then
    echo "$2: sums not verified" >&2
    return 1
  fi
  echo "$t"
}

# launch_rounds RUNS ROUNDS FLAG VARIANTS CMD...: runs the `autobyte launch`
# command line CMD with `FLAG VARIANT --json` ROUNDS times for each variant
# (VARIANTS is a list of words), the variants alternating so that drift on
# the testbed hits them alike, and appends each run's verified iteration
# time to the caller's associative array named RUNS, under the variant.
launch_rounds() {
  local -n times=$1
  local rounds=$2 flag=$3 variants=$4 r v out t
  shift 4
  for r in $(seq "$rounds"); do
    for v in $variants; do
      out=$("$@" "$flag" "$v" --json 2>/dev/null)
      t=$(verified_time "$out" "round $r $v")
      times[$v]="${times[$v]:-} $t"
      echo "round $r $v: $t s" >&2
    done
  done
}

# json_time: the iteration_time_s of the JSON object on stdin (e.g. of
# `autobyte sim --json`).
json_time() {
  python3 -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])'
}

# median X...: the median of the numbers given.
median() {
  python3 -c 'import sys,statistics; print(statistics.median(map(float, sys.argv[1:])))' "$@"
}
