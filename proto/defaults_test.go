package proto

import (
	"math"
	"testing"
)

func TestDefaultCredit(t *testing.T) {
	for _, c := range []struct {
		arch      Arch
		servers   int
		partition int64
		want      int64
	}{
		{PS, 1, 0, PSCreditBytes},
		{PS, 4, 0, PSCreditBytes},                 // 4 x 4 MB = ByteScheduler's 16 MB
		{PS, 5, 0, 5 * PSPartitionBytes},          // one partition per server
		{PS, 32, 1_000_000, 32_000_000},           // the partition given
		{PS, 8, 256_000, PSCreditBytes},           // never below ByteScheduler's
		{PS, 0, 0, PSCreditBytes},                 // servers unknown
		{PS, 1 << 20, 1 << 50, math.MaxInt64},     // would overflow: no window
		{AllReduce, 64, 1_000_000, ARCreditBytes}, // every rank works on every piece
	} {
		if got := DefaultCredit(c.arch, c.servers, c.partition); got != c.want {
			t.Errorf("DefaultCredit(%v, %d servers, partition %d) = %d, want %d", c.arch, c.servers, c.partition, got, c.want)
		}
	}
	if ByteSchedulerDefaults(PS).CreditBytes != PSCreditBytes || ByteSchedulerDefaults(AllReduce).CreditBytes != ARCreditBytes {
		t.Errorf("ByteScheduler's defaults moved: %+v, %+v", ByteSchedulerDefaults(PS), ByteSchedulerDefaults(AllReduce))
	}
}
