package proto

import (
	"math"

	"github.com/autobyte/autobyte/sched"
)

// ByteScheduler's released defaults, in elements, converted to float32
// bytes: partition 1M and credit 4M elements for parameter servers, 8M and
// 16M elements for all-reduce; and MXNet's big-array bound (1M elements),
// above which a parameter-server piece is split over every server.
const (
	PSPartitionBytes  = 4_000_000
	PSCreditBytes     = 16_000_000
	ARPartitionBytes  = 32_000_000
	ARCreditBytes     = 64_000_000
	DefaultShardBytes = 4_000_000
)

// ByteSchedulerDefaults is ByteScheduler's released configuration for arch,
// priority order. Baselines that stand for ByteScheduler use it as it is;
// a job given no credit runs DefaultCredit's.
func ByteSchedulerDefaults(arch Arch) sched.Config {
	if arch == AllReduce {
		return sched.Config{PartitionBytes: ARPartitionBytes, CreditBytes: ARCreditBytes, Order: sched.OrderPriority}
	}
	return sched.Config{PartitionBytes: PSPartitionBytes, CreditBytes: PSCreditBytes, Order: sched.OrderPriority}
}

// DefaultCredit is the credit of a job whose credit is not given:
// ByteScheduler's, except that on parameter servers it is at least one
// partition for each server that can be kept busy, min(workers, servers).
//
// A piece in flight occupies one server until every worker has pushed it,
// and every worker pushes the same pieces in the same order, so a window of
// credit/partition pieces keeps at most that many servers receiving at a
// time. A server takes a piece from all W workers at once, 1/W of its link
// each, so W servers receiving keep every worker's link busy; more pieces
// in flight only queue on the workers' links, ahead of the next urgent one.
// ByteScheduler's 16 MB of 4 MB pieces leaves 28 of 32 servers idle: in
// the simulator ResNet-50, VGG16, BERT-base and GPT-2 on 128 workers and 32
// servers take 2.5-4.7 times as long per iteration as with one partition per
// server (docs/results.md, "Default credit"). With 4 servers or workers or
// fewer nothing changes. partition is the job's partition size (<= 0: the
// default); workers and servers are ignored for all-reduce, where every
// rank works on every piece.
func DefaultCredit(arch Arch, workers, servers int, partition int64) int64 {
	if arch == AllReduce {
		return ARCreditBytes
	}
	if partition <= 0 {
		partition = PSPartitionBytes
	}
	busy := int64(min(workers, servers))
	if busy <= 0 {
		return PSCreditBytes
	}
	if partition > math.MaxInt64/busy {
		return math.MaxInt64 // no window: more than any job has in flight
	}
	return max(PSCreditBytes, busy*partition)
}
