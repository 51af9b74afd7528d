package proto

import "fmt"

// Unit is what travels as one task: one tensor, or a run of neighbouring
// small tensors fused into one (Config.FusionBytes), their gradients end to
// end in tensor order, as DDP's buckets and ByteScheduler's merged small
// layers do. Pieces name their unit in PieceID.Tensor; with fusion off,
// unit i is tensor i.
type Unit struct {
	// Tensors are the unit's tensors in order; Offsets[i] is the byte
	// offset of Tensors[i] within the unit.
	Tensors []int
	Offsets []int64
	// Tensor describes the unit as the scheduler sees it: its members'
	// kind (element type, compressibility, posting schedule), their bytes
	// together, and the most urgent (smallest) of their layers.
	Tensor
}

// fusible reports whether b may join a unit of tensors like a: the same
// kind of elements, posted in the same iterations, in the same or the
// next layer.
func fusible(a, b Tensor) bool {
	return a.elemBytes() == b.elemBytes() && a.Wire == b.Wire && a.Compressible == b.Compressible &&
		a.Posted == b.Posted && (b.Layer == a.Layer || b.Layer == a.Layer+1)
}

// fuse groups tensors into units: walking them in order, a tensor smaller
// than limit joins the unit before it if that unit is fused too, its last
// tensor is fusible with it (fusible) and their bytes together stay within
// limit; any other tensor starts a unit of its own. limit 0: one unit per
// tensor. unitOf[t] is tensor t's unit.
func fuse(tensors []Tensor, limit int64) (units []Unit, unitOf []int) {
	unitOf = make([]int, len(tensors))
	for i, t := range tensors {
		if n := len(units); limit > 0 && n > 0 && t.Bytes < limit {
			u := &units[n-1]
			last := tensors[u.Tensors[len(u.Tensors)-1]]
			if last.Bytes < limit && fusible(last, t) && u.Bytes+t.Bytes <= limit {
				u.Tensors = append(u.Tensors, i)
				u.Offsets = append(u.Offsets, u.Bytes)
				u.Bytes += t.Bytes
				unitOf[i] = n - 1
				continue
			}
		}
		unitOf[i] = len(units)
		units = append(units, Unit{Tensors: []int{i}, Offsets: []int64{0}, Tensor: t})
	}
	return units, unitOf
}

// layout is how the tensors travel under one fusion size: units[u] is
// unit u, unitOf[t] tensor t's unit and memberIndex[t] its place in it.
type layout struct {
	units       []Unit
	unitOf      []int
	memberIndex []int
}

// layoutFor is the layout of fusion size limit, computed once per size.
func (w *Worker) layoutFor(limit int64) *layout {
	if l, ok := w.layouts[limit]; ok {
		return l
	}
	l := &layout{memberIndex: make([]int, len(w.cfg.Tensors))}
	l.units, l.unitOf = fuse(w.cfg.Tensors, limit)
	for _, u := range l.units {
		for i, t := range u.Tensors {
			l.memberIndex[t] = i
		}
	}
	w.layouts[limit] = l
	return l
}

// layoutAt is the layout of configuration epoch.
func (w *Worker) layoutAt(epoch int) *layout {
	return w.layoutFor(w.epochs[epoch].Config.FusionBytes)
}

// Units are the units of communication of configuration epoch, by unit
// number (the PieceID.Tensor of its pieces; Piece.Epoch names the epoch).
// An epoch the machine does not know has none. The caller must not modify
// them.
func (w *Worker) Units(epoch int) []Unit {
	if epoch < 0 || epoch >= len(w.epochs) {
		return nil
	}
	return w.layoutAt(epoch).units
}

// postFused records that tensor of a fused unit of l was posted for
// iteration and reports whether it completes the unit (every member
// posted).
func (w *Worker) postFused(l *layout, tensor, iteration int) (complete bool, err error) {
	u := l.unitOf[tensor]
	k := fusedKey{iteration: iteration, unit: u}
	posted := w.fusedPosted[k]
	if posted == nil {
		posted = make([]bool, len(l.units[u].Tensors))
		w.fusedPosted[k] = posted
	}
	i := l.memberIndex[tensor]
	if posted[i] {
		return false, fmt.Errorf("proto: worker %d: tensor %d posted twice for iteration %d", w.cfg.Rank, tensor, iteration)
	}
	posted[i] = true
	for _, p := range posted {
		if !p {
			return false, nil
		}
	}
	delete(w.fusedPosted, k)
	return true, nil
}

type fusedKey struct{ iteration, unit int }
