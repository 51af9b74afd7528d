package sim

import (
	"errors"
	"sync/atomic"
	"testing"
)

func TestParallel(t *testing.T) {
	var calls [50]atomic.Int32
	err := Parallel(50, 4, func(i int) error {
		calls[i].Add(1)
		if i == 7 || i == 30 {
			return errors.New("fail " + string(rune('0'+i%10)))
		}
		return nil
	})
	for i := range calls {
		if calls[i].Load() != 1 {
			t.Fatalf("f(%d) called %d times, want once", i, calls[i].Load())
		}
	}
	if err == nil || err.Error() != "fail 7" {
		t.Errorf("Parallel = %v, want the lowest failing index's error (fail 7)", err)
	}
	if err := Parallel(0, 0, func(int) error { t.Fatal("called"); return nil }); err != nil {
		t.Errorf("Parallel of nothing = %v", err)
	}
}
