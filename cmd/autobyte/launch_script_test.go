package main

import (
	"strings"
	"testing"
)

// TestLaunchScriptEnv: a training command runs once per worker with the
// rendezvous and autobyte settings in its environment; rank 0's stdout is
// launch's stdout.
func TestLaunchScriptEnv(t *testing.T) {
	out, err := run(t, "launch", "--workers", "2", "--arch", "allreduce", "--partition", "1MB", "--credit", "2MB", "--",
		"sh", "-c", `echo "rank=$RANK world=$WORLD_SIZE arch=$AUTOBYTE_ARCH part=$AUTOBYTE_PARTITION credit=$AUTOBYTE_CREDIT sched=$AUTOBYTE_SCHEDULER gloo=$GLOO_SOCKET_IFNAME master=$MASTER_ADDR token=${AUTOBYTE_TOKEN:+set}"`)
	if err != nil {
		t.Fatal(err)
	}
	want := "rank=0 world=2 arch=allreduce part=1000000 credit=2000000 sched=bytescheduler gloo=lo master=127.0.0.1 token=set"
	if strings.TrimSpace(out) != want {
		t.Fatalf("stdout %q, want rank 0's line only: %q", out, want)
	}
}

func TestLaunchScriptErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"launch", "--workers", "2", "--arch", "allreduce", "--", "sh", "-c", `[ "$RANK" = 1 ] && exit 3; exit 0`},
			"worker 1 failed (exit status 3)"},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "--", "/no/such/program"}, `"/no/such/program"`},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "stray"}, "a training command goes after --"},
		{[]string{"launch", "--workers", "1", "--json", "--", "true"}, "--json does not apply to a training command"},
		{[]string{"launch", "--workers", "1", "--model", "vgg16", "--", "true"}, "--model does not apply"},
		{[]string{"launch", "--workers", "1", "--tuner", "grid", "--", "true"}, `--tuner "grid"`},
		{[]string{"launch", "--workers", "1", "--arch", "allreduce", "--servers", "1", "--", "true"}, "all-reduce has no parameter servers"},
	}
	for _, c := range cases {
		_, err := run(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}
