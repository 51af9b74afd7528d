// Package placement decides which parameter server holds each piece of each
// tensor under a partition size. Every worker, every server and the
// simulator compute the same placement from the same inputs, so it needs no
// coordination. It is pure: it knows tensor sizes and server counts, nothing
// of networks, time or scheduling order.
package placement

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/autobyte/autobyte/sched"
)

// Shard is the part of a piece held by one server.
type Shard struct {
	Server int
	// Offset and Bytes locate the shard within its tensor.
	Offset, Bytes int64
}

// Plan is the placement of one partitioning: Pieces[t][i] are the shards of
// piece i of tensor t, in offset order.
type Plan struct {
	Pieces [][][]Shard
	// Load is the bytes each server holds.
	Load []int64
}

// Inputs describe what is placed.
type Inputs struct {
	// TensorBytes are the tensors' sizes in model order.
	TensorBytes []int64
	// ElemBytes is the element size; pieces and shards hold whole elements.
	ElemBytes int64
	// TensorElemBytes, if set, is each tensor's own element size (its
	// dtype's width), in place of ElemBytes.
	TensorElemBytes []int64
	// PartitionBytes cuts a tensor into pieces exactly as the scheduling
	// core does (sched.PieceCount; 0 = no partitioning).
	PartitionBytes int64
	// ShardBytes splits a piece larger than it into ceil(size/ShardBytes)
	// near-equal shards on distinct servers, at most one per server
	// (0 = never).
	ShardBytes int64
	Servers    int
	// Weights, if set, are the servers' shares of the bytes (one per
	// server, any positive scale): a server of twice the weight is given
	// about twice the bytes. Nil: equal shares.
	Weights []float64
}

// Place places every piece, in model order, on the server that would hold
// the fewest bytes per unit of weight with it (the fewest bytes, under
// equal weights), and the shards of a big piece on the distinct servers
// that would, each counted with one shard's bytes (ties to the lower
// server index). With weights proportional to the servers' rates, this
// evens the time each server needs for its bytes.
func Place(in Inputs) (*Plan, error) {
	switch {
	case in.Servers < 1:
		return nil, fmt.Errorf("placement: servers must be >= 1, got %d", in.Servers)
	case in.TensorElemBytes == nil && in.ElemBytes < 1:
		return nil, fmt.Errorf("placement: element size must be >= 1 byte, got %d", in.ElemBytes)
	case in.TensorElemBytes != nil && len(in.TensorElemBytes) != len(in.TensorBytes):
		return nil, fmt.Errorf("placement: %d element sizes for %d tensors", len(in.TensorElemBytes), len(in.TensorBytes))
	case in.PartitionBytes < 0:
		return nil, fmt.Errorf("placement: partition size must be >= 0, got %d", in.PartitionBytes)
	case in.ShardBytes < 0:
		return nil, fmt.Errorf("placement: shard size must be >= 0, got %d", in.ShardBytes)
	case in.Weights != nil && len(in.Weights) != in.Servers:
		return nil, fmt.Errorf("placement: %d server weights for %d servers", len(in.Weights), in.Servers)
	}
	weight := make([]float64, in.Servers)
	for i := range weight {
		weight[i] = 1
		if in.Weights != nil {
			weight[i] = in.Weights[i]
		}
		if !(weight[i] > 0) || math.IsInf(weight[i], 0) {
			return nil, fmt.Errorf("placement: server %d's weight is %v: want a finite number > 0", i, weight[i])
		}
	}
	plan := &Plan{Pieces: make([][][]Shard, len(in.TensorBytes)), Load: make([]int64, in.Servers)}
	byLoad := make([]int, in.Servers)
	for t, size := range in.TensorBytes {
		elem := in.ElemBytes
		if in.TensorElemBytes != nil {
			elem = in.TensorElemBytes[t]
		}
		if elem < 1 || size <= 0 || size%elem != 0 {
			return nil, fmt.Errorf("placement: tensor %d: size %d bytes is not a positive multiple of %d-byte elements", t, size, elem)
		}
		var off int64
		count := sched.PieceCount(size, elem, in.PartitionBytes)
		for i := range count {
			pieceBytes := sched.PieceBytes(size, elem, count, i)
			n := pieceBytes / elem
			shards := int64(1)
			if sb := in.ShardBytes; sb > 0 && pieceBytes > sb {
				shards = min(int64(in.Servers), n, (pieceBytes-1)/sb+1)
			}
			for k := range byLoad {
				byLoad[k] = k
			}
			// What each server would hold per unit of weight with one
			// shard more (under equal weights: by load alone, exactly).
			with := float64(pieceBytes / shards)
			slices.SortStableFunc(byLoad, func(a, b int) int {
				return cmp.Compare((float64(plan.Load[a])+with)/weight[a], (float64(plan.Load[b])+with)/weight[b])
			})
			var piece []Shard
			sizes := shardSizes(pieceBytes, elem, shards, byLoad[:shards], weight)
			for k := range shards {
				s := Shard{Server: byLoad[k], Offset: off, Bytes: sizes[k]}
				plan.Load[s.Server] += s.Bytes
				off += s.Bytes
				piece = append(piece, s)
			}
			plan.Pieces[t] = append(plan.Pieces[t], piece)
		}
	}
	return plan, nil
}

// shardSizes splits a piece of pieceBytes into shards for the given
// servers, in whole elements: near-equal (exactly as the scheduling core
// cuts pieces) under equal weights, else in proportion to the servers'
// weights, each at least one element, so that a slow server's shards are
// as much smaller as its share of the bytes.
func shardSizes(pieceBytes, elem, shards int64, servers []int, weight []float64) []int64 {
	sizes := make([]int64, shards)
	equal := true
	var sum float64
	for _, s := range servers {
		equal = equal && weight[s] == weight[servers[0]]
		sum += weight[s]
	}
	if equal {
		for k := range sizes {
			sizes[k] = sched.PieceBytes(pieceBytes, elem, shards, int64(k))
		}
		return sizes
	}
	// Cut at the rounded cumulative shares, leaving every shard an element.
	n := pieceBytes / elem
	var acc float64
	prev := int64(0)
	for k, s := range servers {
		acc += weight[s]
		cut := int64(math.Round(float64(n) * acc / sum))
		if k == len(servers)-1 {
			cut = n
		}
		cut = max(cut, prev+1)                    // at least one element here
		cut = min(cut, n-int64(len(servers)-1-k)) // and one for each shard after
		sizes[k] = (cut - prev) * elem
		prev = cut
	}
	return sizes
}
