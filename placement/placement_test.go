package placement

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/sched"
)

// TestPlanCoversEveryByte: pieces agree with the scheduling core, shards of a
// piece sit on distinct servers, cover the piece contiguously, and the load
// adds up.
func TestPlanCoversEveryByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		in := Inputs{ElemBytes: 4, Servers: 1 + rng.IntN(9)}
		for range 1 + rng.IntN(12) {
			in.TensorBytes = append(in.TensorBytes, 4*(1+rng.Int64N(5_000_000)))
		}
		if rng.IntN(4) > 0 {
			in.PartitionBytes = 1 + rng.Int64N(8_000_000)
		}
		if rng.IntN(2) > 0 {
			in.ShardBytes = 1 + rng.Int64N(4_000_000)
		}
		plan, err := Place(in)
		if err != nil {
			t.Fatal(err)
		}
		load := make([]int64, in.Servers)
		for ti, size := range in.TensorBytes {
			count := sched.PieceCount(size, 4, in.PartitionBytes)
			if int64(len(plan.Pieces[ti])) != count {
				t.Fatalf("%+v: tensor %d has %d pieces, core cuts %d", in, ti, len(plan.Pieces[ti]), count)
			}
			var off int64
			for i, shards := range plan.Pieces[ti] {
				pieceStart := off
				seen := map[int]bool{}
				for _, sh := range shards {
					if sh.Offset != off || sh.Bytes <= 0 || sh.Bytes%4 != 0 {
						t.Fatalf("%+v: tensor %d piece %d shard %+v: want offset %d and whole elements", in, ti, i, sh, off)
					}
					if seen[sh.Server] {
						t.Fatalf("%+v: tensor %d piece %d has two shards on server %d", in, ti, i, sh.Server)
					}
					seen[sh.Server] = true
					load[sh.Server] += sh.Bytes
					off += sh.Bytes
				}
				if got, want := off-pieceStart, sched.PieceBytes(size, 4, count, int64(i)); got != want {
					t.Fatalf("%+v: tensor %d piece %d shards sum to %d, core's piece is %d", in, ti, i, got, want)
				}
				if in.ShardBytes == 0 && len(shards) != 1 {
					t.Fatalf("sharding off but piece split in %d", len(shards))
				}
			}
			if off != size {
				t.Fatalf("tensor %d: placed %d of %d bytes", ti, off, size)
			}
		}
		for m := range load {
			if load[m] != plan.Load[m] {
				t.Fatalf("server %d load %d, plan says %d", m, load[m], plan.Load[m])
			}
		}
	}
}

// TestBalance: equal pieces spread evenly, and a big piece is sharded over
// the emptiest servers.
func TestBalance(t *testing.T) {
	plan, err := Place(Inputs{TensorBytes: []int64{400, 400, 400, 400, 400, 400}, ElemBytes: 4, Servers: 3})
	if err != nil {
		t.Fatal(err)
	}
	for m, l := range plan.Load {
		if l != 800 {
			t.Errorf("server %d holds %d bytes, want 800 (loads %v)", m, l, plan.Load)
		}
	}
	plan, err = Place(Inputs{TensorBytes: []int64{40, 1000}, ElemBytes: 4, Servers: 4, ShardBytes: 300})
	if err != nil {
		t.Fatal(err)
	}
	big := plan.Pieces[1][0]
	if len(big) != 4 || big[0].Server == 0 {
		t.Errorf("1000-byte piece with 300-byte shards on 4 servers: shards %+v, want 4 shards starting on an empty server", big)
	}
}

func TestPlaceErrors(t *testing.T) {
	cases := []struct {
		in   Inputs
		want string
	}{
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 4, Servers: 0}, "got 0"},
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 0, Servers: 1}, "got 0"},
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 4, Servers: 1, PartitionBytes: -1}, "got -1"},
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 4, Servers: 1, ShardBytes: -2}, "got -2"},
		{Inputs{TensorBytes: []int64{6}, ElemBytes: 4, Servers: 1}, "size 6"},
		{Inputs{TensorBytes: []int64{0}, ElemBytes: 4, Servers: 1}, "size 0"},
	}
	for _, c := range cases {
		if _, err := Place(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Place(%+v) = %v, want an error naming %q", c.in, err, c.want)
		}
	}
}
