package proto

import (
	"math"
	"testing"
)

func TestDefaultCredit(t *testing.T) {
	for _, c := range []struct {
		arch             Arch
		workers, servers int
		partition, want  int64
	}{
		{PS, 8, 1, 0, PSCreditBytes},
		{PS, 8, 4, 0, PSCreditBytes},                   // 4 x 4 MB = ByteScheduler's 16 MB
		{PS, 8, 5, 0, 5 * PSPartitionBytes},            // one partition per server
		{PS, 64, 32, 1_000_000, 32_000_000},            // the partition given
		{PS, 4, 8, 0, PSCreditBytes},                   // 4 workers keep 4 servers busy
		{PS, 6, 32, 0, 6 * PSPartitionBytes},           // 6 workers, 6 servers
		{PS, 64, 8, 256_000, PSCreditBytes},            // never below ByteScheduler's
		{PS, 8, 0, 0, PSCreditBytes},                   // servers unknown
		{PS, 1 << 20, 1 << 20, 1 << 50, math.MaxInt64}, // would overflow: no window
		{AllReduce, 64, 0, 1_000_000, ARCreditBytes},   // every rank works on every piece
	} {
		if got := DefaultCredit(c.arch, c.workers, c.servers, c.partition); got != c.want {
			t.Errorf("DefaultCredit(%v, %d workers, %d servers, partition %d) = %d, want %d", c.arch, c.workers, c.servers, c.partition, got, c.want)
		}
	}
	if ByteSchedulerDefaults(PS).CreditBytes != PSCreditBytes || ByteSchedulerDefaults(AllReduce).CreditBytes != ARCreditBytes {
		t.Errorf("ByteScheduler's defaults moved: %+v, %+v", ByteSchedulerDefaults(PS), ByteSchedulerDefaults(AllReduce))
	}
}
