// Package placement decides which parameter server holds each piece of each
// tensor under a partition size. Every worker, every server and the
// simulator compute the same placement from the same inputs, so it needs no
// coordination. It is pure: it knows tensor sizes and server counts, nothing
// of networks, time or scheduling order.
package placement

import (
	"cmp"
	"fmt"
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
}

// Place places every piece, in model order, on the server with the fewest
// bytes so far, and the shards of a big piece on the least loaded distinct
// servers (ties to the lower server index).
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
			slices.SortStableFunc(byLoad, func(a, b int) int { return cmp.Compare(plan.Load[a], plan.Load[b]) })
			var piece []Shard
			for k := range shards {
				s := Shard{Server: byLoad[k], Offset: off, Bytes: sched.PieceBytes(pieceBytes, elem, shards, k)}
				plan.Load[s.Server] += s.Bytes
				off += s.Bytes
				piece = append(piece, s)
			}
			plan.Pieces[t] = append(plan.Pieces[t], piece)
		}
	}
	return plan, nil
}
