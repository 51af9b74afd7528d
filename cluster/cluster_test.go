package cluster

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

func TestAnnounceRoundTrip(t *testing.T) {
	p := sched.Piece{PieceID: sched.PieceID{Iteration: 7, Tensor: 12, Index: 3}, Layer: 4, Count: 5, Offset: 400, Bytes: 96, Epoch: 2, Compression: dtype.F16}
	h, err := transport.DecodeHeader(AnnounceFrame(p).Header.Append(nil)) // through the wire format
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeAnnounce(transport.Frame{Header: h, Payload: AnnounceFrame(p).Payload})
	if err != nil {
		t.Fatal(err)
	}
	if got.PieceID != p.PieceID || got.Layer != p.Layer || got.Count != p.Count || got.Offset != p.Offset || got.Bytes != p.Bytes || got.Epoch != p.Epoch || got.Compression != p.Compression {
		t.Errorf("round trip: got %+v, want %+v", got, p)
	}
	bad := AnnounceFrame(p)
	bad.Elem = 9
	if _, err := DecodeAnnounce(bad); err == nil || !strings.Contains(err.Error(), "compression dtype(9)") {
		t.Errorf("unknown compression: %v", err)
	}
	bad = AnnounceFrame(p)
	bad.Payload = bad.Payload[:8]
	if _, err := DecodeAnnounce(bad); err == nil || !strings.Contains(err.Error(), "8 payload bytes") {
		t.Errorf("short announcement: %v", err)
	}
	p.Index = 9 // index >= count
	if _, err := DecodeAnnounce(AnnounceFrame(p)); err == nil || !strings.Contains(err.Error(), "piece 9 of 5") {
		t.Errorf("index beyond count: %v", err)
	}
	if !IsBye(ByeFrame(3)) || IsBye(AnnounceFrame(p)) {
		t.Error("IsBye misclassifies frames")
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv("MASTER_ADDR", "10.0.0.1")
	t.Setenv("MASTER_PORT", "29500")
	t.Setenv("RANK", "3")
	t.Setenv("WORLD_SIZE", "8")
	e, err := FromEnv(Env{})
	if err != nil || e != (Env{MasterAddr: "10.0.0.1", MasterPort: 29500, Port: 29501, Rank: 3, WorldSize: 8}) {
		t.Fatalf("FromEnv = %+v, %v", e, err)
	}
	t.Setenv("AUTOBYTE_MASTER_PORT", "7777")
	if e, err := FromEnv(Env{}); err != nil || e.Port != 7777 || e.MasterPort != 29500 {
		t.Errorf("AUTOBYTE_MASTER_PORT=7777: %+v, %v; want port 7777 beside MASTER_PORT 29500", e, err)
	}
	for _, bad := range []string{"0", "65536", "x"} {
		t.Setenv("AUTOBYTE_MASTER_PORT", bad)
		if _, err := FromEnv(Env{}); err == nil || !strings.Contains(err.Error(), `AUTOBYTE_MASTER_PORT="`+bad+`"`) {
			t.Errorf("AUTOBYTE_MASTER_PORT=%s: %v, want an error naming it", bad, err)
		}
	}
	t.Setenv("AUTOBYTE_MASTER_PORT", "")
	t.Setenv("MASTER_PORT", "65535")
	if _, err := FromEnv(Env{}); err == nil || !strings.Contains(err.Error(), `MASTER_PORT="65535"`) || !strings.Contains(err.Error(), "AUTOBYTE_MASTER_PORT") {
		t.Errorf("MASTER_PORT=65535: %v, want an error naming it and AUTOBYTE_MASTER_PORT", err)
	}
	t.Setenv("MASTER_PORT", "29500")
	t.Setenv("RANK", "three")
	if _, err := FromEnv(Env{}); err == nil || !strings.Contains(err.Error(), `RANK="three"`) {
		t.Errorf("bad RANK: %v", err)
	}
}

// TestRendezvous: members register, the table reaches everyone with the
// coordinator's view of their hosts, and bad registrations are refused.
func TestRendezvous(t *testing.T) {
	cfg := testConfig
	run := func(t *testing.T, members []Member, workers, servers int) (*Table, []error) {
		t.Helper()
		l := rank0Listener(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		errs := make(chan error, len(members))
		for _, m := range members {
			go func() {
				_, c, err := Join(ctx, l.Addr().String(), m, cfg(m.Role, m.Rank), Patience{})
				if c != nil {
					defer c.Close()
				}
				errs <- err
			}()
		}
		self := Member{Role: "worker", Rank: 0, Digest: "d", Config: map[string]string{"model": "m (1 tensor)", "iterations": "3"}}
		table, _, _, cerr := Coordinate(ctx, l, self, workers, servers, Patience{})
		var out []error
		out = append(out, cerr)
		for range members {
			out = append(out, <-errs)
		}
		return table, out
	}
	table, errs := run(t, []Member{{Role: "worker", Rank: 1, Addr: ":7001", Digest: "d", Config: map[string]string{"model": "m (1 tensor)"}},
		{Role: "server", Rank: 0, Addr: ":7000", Digest: "d"}}, 2, 1)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if table.Servers[0].Addr != "127.0.0.1:7000" || table.Workers[1].Addr != "127.0.0.1:7001" {
		b, _ := json.Marshal(table)
		t.Errorf("table %s: addresses should carry the host the coordinator saw", b)
	}
	if table.Workers[0].Config != nil || table.Workers[1].Config != nil {
		t.Errorf("table %+v: the configurations are for the coordinator's checks, not for every member", table.Workers)
	}
	_, errs = run(t, []Member{{Role: "worker", Rank: 1, Digest: "other"}}, 2, 0)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "different job configuration (digest other, rank 0 expects d): start") {
		t.Errorf("digest mismatch without configurations: %v", errs[0])
	}
	// With configurations, the parts that differ are named with both
	// values; equal parts, and parts rank 0 does not describe, are not.
	_, errs = run(t, []Member{{Role: "worker", Rank: 1, Digest: "other", Config: map[string]string{"model": "m (2 tensors)", "iterations": "3", "extra": "x"}}}, 2, 0)
	if err := errs[0]; err == nil || !strings.Contains(err.Error(), "model: worker 1 has m (2 tensors), rank 0 has m (1 tensor)") ||
		strings.Contains(err.Error(), "iterations") || strings.Contains(err.Error(), "extra") {
		t.Errorf("digest mismatch in the model: %v, want the model's part named with both values and nothing else", err)
	}
	_, errs = run(t, []Member{{Role: "worker", Rank: 5, Digest: "d"}}, 2, 0)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "worker 5") {
		t.Errorf("rank outside the job: %v", errs[0])
	}
}
