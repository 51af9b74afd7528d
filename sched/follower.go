package sched

// Follower admits pieces in exactly the order a leader's Scheduler started
// them, under its own credit window. Parameter-server workers use it so that
// every worker starts pieces in one global sequence: if each worker ordered
// its own ready pieces, two workers could each hold all their credit on a
// piece the other has not pushed yet, and since a server answers a piece
// only once every worker pushed it, neither would ever finish. With one
// sequence the earliest unfinished piece is always startable on every
// worker, so the job cannot deadlock.
//
// Like Scheduler it is a pure state machine and not safe for concurrent use.
type Follower struct {
	postLog
	cfg Config
	// announced holds the leader's started pieces this worker has not
	// started yet, in the leader's order.
	announced []Piece
	head      int
	ready     map[taskID]bool // tasks whose gradient is ready here

	credit
}

// NewFollower returns a follower whose credit window and admission rule are
// those of cfg (its partition size and order are the leader's business).
func NewFollower(cfg Config) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Follower{cfg: cfg, credit: newCredit(cfg), ready: map[taskID]bool{}}, nil
}

// Reconfigure changes the credit window for tasks of iteration from and
// later, with the same rules as Scheduler.Reconfigure.
func (f *Follower) Reconfigure(cfg Config, from int) error {
	return f.schedule(cfg, from)
}

// Follow is Reconfigure for a change the leader decided from iteration
// from, which this follower may learn late: if it already posted from (it
// runs ahead of the leader) or has a later change pending, the new credit
// window applies from the earliest iteration it still can. Credit is each
// worker's own business, and the partitioning follows the leader's pieces
// anyway. It returns the iteration the change applies from here.
func (f *Follower) Follow(cfg Config, from int) (int, error) {
	from = max(from, f.earliestFrom())
	return from, f.schedule(cfg, from)
}

// Announce tells the follower that the leader started piece p.
func (f *Follower) Announce(p Piece) {
	f.announced = append(f.announced, p)
}

// Post records that task t's gradient is ready on this worker.
func (f *Follower) Post(t Task) error {
	due, err := f.record(t)
	if err != nil {
		return err
	}
	for _, cfg := range due {
		f.cfg = cfg
		f.resize(cfg)
	}
	id := taskID{iteration: t.Iteration, tensor: t.Tensor}
	f.ready[id] = true
	return nil
}

// Next returns the leader's next piece if its gradient is ready here and
// the credit window admits it.
func (f *Follower) Next() (Piece, bool) {
	if f.head == len(f.announced) {
		f.announced, f.head = f.announced[:0], 0
		return Piece{}, false
	}
	p := f.announced[f.head]
	id := taskID{iteration: p.Iteration, tensor: p.Tensor}
	if !f.ready[id] {
		return Piece{}, false
	}
	if c := f.cfg.CreditBytes; c > 0 {
		switch f.cfg.Admission {
		case AdmitPositive:
			if f.available <= 0 {
				return Piece{}, false
			}
		case AdmitStrict:
			if p.Bytes > f.available && f.inflightBytes > 0 {
				return Piece{}, false
			}
		}
	}
	f.head++
	if _, ok := f.left[id]; !ok {
		f.left[id] = p.Count
	}
	f.take(p)
	return p, true
}

// Done reports that an in-flight piece finished and returns its credit;
// taskDone is true when it was the last piece of its task.
func (f *Follower) Done(id PieceID) (taskDone bool, err error) {
	_, taskDone, err = f.Finish(id)
	return taskDone, err
}

// Finish is Done that also returns the finished piece.
func (f *Follower) Finish(id PieceID) (p Piece, taskDone bool, err error) {
	p, taskDone, err = f.finish(id)
	if taskDone {
		delete(f.ready, taskID{iteration: id.Iteration, tensor: id.Tensor})
	}
	return p, taskDone, err
}

// InFlightBytes is the sum of the sizes of pieces started and not yet done.
func (f *Follower) InFlightBytes() int64 { return f.inflightBytes }
