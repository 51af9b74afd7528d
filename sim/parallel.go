package sim

import "sync"

// Parallel calls f(0), ..., f(n-1) on par goroutines (at least one) and
// returns the error of the lowest index that failed. Simulations are
// independent and deterministic, so callers that store results by index get
// the same output whatever the interleaving.
func Parallel(n, par int, f func(i int) error) error {
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(max(par, 1), max(n, 1)) {
		wg.Go(func() {
			for i := range next {
				errs[i] = f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
