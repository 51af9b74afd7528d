package sumorder

import "testing"

// TestInOrder: the order of addition shows in the bits, as Pool's comment
// says, and FirstDiff finds the element.
func TestInOrder(t *testing.T) {
	vals := [][]float32{{2, 1e8}, {3, 1}, {4, -1e8}}
	a, b := InOrder(vals, []int{0, 1, 2}), InOrder(vals, []int{0, 2, 1})
	if a[0] != 9 || a[1] != 0 || b[0] != 9 || b[1] != 1 {
		t.Fatalf("InOrder: %v in rank order, %v with ranks 1 and 2 swapped; want [9 0], [9 1]", a, b)
	}
	if i, j := FirstDiff(a, b), FirstDiff(a, a); i != 1 || j != -1 {
		t.Fatalf("FirstDiff = %d between the orders, %d of a sum with itself; want 1, -1", i, j)
	}
	if vals[0][1] != 1e8 {
		t.Fatalf("InOrder changed its input: %v", vals)
	}
}

// TestValues: every value comes from Pool, and the same generator gives
// the same values.
func TestValues(t *testing.T) {
	v := Values(1, 2, 3, 50)
	w := Values(1, 2, 3, 50)
	if len(v) != 3 || len(v[2]) != 50 {
		t.Fatalf("Values(3 ranks, 50): %d ranks, %d values", len(v), len(v[2]))
	}
	for r := range v {
		for i, x := range v[r] {
			found := false
			for _, p := range Pool {
				found = found || p == x
			}
			if !found || FirstDiff(v[r], w[r]) >= 0 {
				t.Fatalf("rank %d value %d = %v: not from Pool, or not the same for the same seed (%v)", r, i, x, w[r][i])
			}
		}
	}
}
