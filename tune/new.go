package tune

import (
	"fmt"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
)

// AutoFusionBytes is the fusion size autobyte may switch to when the user
// leaves the fusion to it (--fusion auto, AUTOBYTE_FUSION=auto): the size
// of DDP's first bucket (1 MiB).
const AutoFusionBytes = 1 << 20

// Names are the tuners New builds.
var Names = []string{"static", "grid", "bo", "autobyte"}

// NewOptions describe a job to New: the same options give the same tuner in
// the simulator, in a replaying worker and in the PyTorch plugin.
type NewOptions struct {
	// Arch is "ps" or "allreduce" (bo's box).
	Arch string
	// Base is the job's initial configuration.
	Base sched.Config
	// GridPartitions and GridCredits span grid's candidates (with Base's
	// admission, priority order); GridTrial is its iterations per
	// candidate.
	GridPartitions, GridCredits []int64
	GridTrial                   int
	// BOTrial is bo's iterations per trial (0: its default).
	BOTrial int
	Seed    uint64
	// Compress is the 16-bit type autobyte may switch compression to
	// (AutoByteOptions.Compress; dtype.F32: it keeps Base's).
	Compress dtype.DType
	// Fuse is the fusion size autobyte may switch to and back
	// (AutoByteOptions.Fuse; 0: it keeps Base's).
	Fuse int64
}

// New builds the tuner called name (one of Names).
func New(name string, o NewOptions) (Tuner, error) {
	var t Tuner
	var err error
	switch name {
	case "static":
		return NewStatic(o.Base), nil
	case "grid":
		base := o.Base
		base.Order = sched.OrderPriority
		t, err = NewGrid(Cross(base, o.GridPartitions, o.GridCredits), o.GridTrial)
	case "bo":
		t, err = NewBO(BOOptions{Arch: o.Arch, Base: o.Base, TrialIterations: o.BOTrial, Seed: o.Seed})
	case "autobyte":
		t, err = NewAutoByte(AutoByteOptions{Base: sched.Config{Order: sched.OrderPriority, Admission: o.Base.Admission}, Seed: o.Seed, Compress: o.Compress, Fuse: o.Fuse})
	default:
		return nil, fmt.Errorf("unknown tuner %q (want one of %v)", name, Names)
	}
	if err != nil {
		return nil, fmt.Errorf("tuner %s: %w", name, err)
	}
	return t, nil
}
