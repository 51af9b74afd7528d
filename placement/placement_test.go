package placement

import (
	"math"
	"math/rand/v2"
	"reflect"
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
		if rng.IntN(2) > 0 {
			for range in.Servers {
				in.Weights = append(in.Weights, 0.05+rng.Float64())
			}
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

// TestWeightedBalance: with weights, each server's load follows its weight
// to within one piece, and equal weights place exactly as no weights.
func TestWeightedBalance(t *testing.T) {
	var sizes []int64
	for range 400 {
		sizes = append(sizes, 4000)
	}
	weights := []float64{4, 4, 1, 2}
	plan, err := Place(Inputs{TensorBytes: sizes, ElemBytes: 4, Servers: 4, Weights: weights})
	if err != nil {
		t.Fatal(err)
	}
	total := int64(400 * 4000)
	for m, l := range plan.Load {
		want := float64(total) * weights[m] / 11
		if math.Abs(float64(l)-want) > 4000 {
			t.Errorf("server %d (weight %v) holds %d bytes, want %.0f within one piece (loads %v)", m, weights[m], l, want, plan.Load)
		}
	}
	// Negative control: the same pieces without weights are even, so the
	// check above can tell weights from none.
	even, err := Place(Inputs{TensorBytes: sizes, ElemBytes: 4, Servers: 4})
	if err != nil {
		t.Fatal(err)
	}
	if even.Load[2] == plan.Load[2] {
		t.Fatalf("weight 1 of 11 left server 2's load at the even %d", even.Load[2])
	}
	// A sharded piece is split by the weights too.
	big, err := Place(Inputs{TensorBytes: []int64{1_100_000}, ElemBytes: 4, Servers: 4, ShardBytes: 1000, Weights: weights})
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range big.Pieces[0][0] {
		if want := 1_100_000 * weights[sh.Server] / 11; math.Abs(float64(sh.Bytes)-want) > 4 {
			t.Errorf("shard on server %d (weight %v): %d bytes, want %.0f within an element (shards %+v)", sh.Server, weights[sh.Server], sh.Bytes, want, big.Pieces[0][0])
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 100; trial++ {
		in := Inputs{ElemBytes: 4, Servers: 1 + rng.IntN(6), PartitionBytes: rng.Int64N(3) * 1_000_000, ShardBytes: rng.Int64N(2) * 700_000}
		for range 1 + rng.IntN(20) {
			in.TensorBytes = append(in.TensorBytes, 4*(1+rng.Int64N(1_000_000)))
		}
		plain, err := Place(in)
		if err != nil {
			t.Fatal(err)
		}
		for range in.Servers {
			in.Weights = append(in.Weights, 2.5)
		}
		weighed, err := Place(in)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(plain, weighed) {
			t.Fatalf("%+v: equal weights placed otherwise than none", in)
		}
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
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 4, Servers: 2, Weights: []float64{1}}, "1 server weights for 2 servers"},
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 4, Servers: 2, Weights: []float64{1, 0}}, "server 1's weight is 0"},
		{Inputs{TensorBytes: []int64{4}, ElemBytes: 4, Servers: 1, Weights: []float64{math.NaN()}}, "server 0's weight is NaN"},
	}
	for _, c := range cases {
		if _, err := Place(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Place(%+v) = %v, want an error naming %q", c.in, err, c.want)
		}
	}
}
