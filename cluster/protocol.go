// Package cluster is how the processes of one job find each other and talk
// about the job (not about data): rendezvous at a coordinator, the member
// table, and the control messages that travel on transport.KindControl
// frames. It follows the usual launcher conventions (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE) so jobs run under torchrun-style
// launchers, Slurm or Kubernetes. Rank 0 listens at MASTER_PORT+1 (or
// AUTOBYTE_MASTER_PORT), since torch.distributed owns MASTER_PORT: under
// torchrun its agent listens there, and a script may call
// init_process_group beside autobyte.
//
// It knows nothing of summation, rings or scheduling decisions.
package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

// Control message subtypes, carried in Header.Aux of KindControl frames.
const (
	// CtlHello: a member's registration at the coordinator; payload JSON Member.
	CtlHello uint32 = 1
	// CtlTable: the coordinator's member table; payload JSON Table.
	CtlTable uint32 = 2
	// CtlAnnounce: the leader started a piece; see AnnounceFrame.
	CtlAnnounce uint32 = 3
	// CtlBye: the sender finished its job in order and will close.
	CtlBye uint32 = 4
	// CtlReady: a member connected to all its peers (barrier before work).
	CtlReady uint32 = 5
	// CtlGo: the coordinator saw every member ready.
	CtlGo uint32 = 6
	// CtlReconfigure: the leader changed the scheduling configuration from
	// an iteration on, opening a new configuration epoch; see
	// ReconfigureFrame. It travels on the same control connections as
	// CtlAnnounce, at the same priority, so a follower always learns an
	// epoch before any piece of it.
	CtlReconfigure uint32 = 7
)

// ByeFrame is the orderly goodbye. It has the lowest priority, so it goes
// out after every frame still queued on the connection.
func ByeFrame(rank int) transport.Frame {
	return transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: CtlBye, Rank: uint32(rank), Priority: math.MaxUint64}}
}

// IsBye reports whether f is an orderly goodbye.
func IsBye(f transport.Frame) bool { return f.Kind == transport.KindControl && f.Aux == CtlBye }

// AnnounceFrame encodes a piece the leader started, so followers can start
// the same piece (sched.Follower).
func AnnounceFrame(p sched.Piece) transport.Frame {
	payload := make([]byte, 16)
	binary.LittleEndian.PutUint32(payload[0:], uint32(p.Count))
	binary.LittleEndian.PutUint32(payload[4:], uint32(p.Layer))
	binary.LittleEndian.PutUint64(payload[8:], uint64(p.Bytes))
	return transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: CtlAnnounce,
		Epoch: uint32(p.Epoch), Iteration: uint32(p.Iteration), Key: uint32(p.Tensor), Piece: uint32(p.Index),
		Offset: uint64(p.Offset), Length: 16, Elem: uint8(p.Compression)}, Payload: payload}
}

// DecodeAnnounce is the inverse of AnnounceFrame.
func DecodeAnnounce(f transport.Frame) (sched.Piece, error) {
	if f.Kind != transport.KindControl || f.Aux != CtlAnnounce || len(f.Payload) != 16 {
		return sched.Piece{}, fmt.Errorf("cluster: not a piece announcement: %v frame, subtype %d, %d payload bytes", f.Kind, f.Aux, len(f.Payload))
	}
	p := sched.Piece{
		PieceID: sched.PieceID{Iteration: int(f.Iteration), Tensor: int(f.Key), Index: int(f.Piece)},
		Count:   int(binary.LittleEndian.Uint32(f.Payload[0:])),
		Layer:   int(binary.LittleEndian.Uint32(f.Payload[4:])),
		Bytes:   int64(binary.LittleEndian.Uint64(f.Payload[8:])),
		Offset:  int64(f.Offset),
		Epoch:   int(f.Epoch),

		Compression: dtype.DType(f.Elem),
	}
	if p.Count < 1 || p.Index >= p.Count || p.Bytes <= 0 || !p.Compression.Valid() {
		return sched.Piece{}, fmt.Errorf("cluster: bad piece announcement: piece %d of %d, %d bytes, compression %v", p.Index, p.Count, p.Bytes, p.Compression)
	}
	return p, nil
}

// Reconfiguration is a change of scheduling configuration decided by the
// leader: Config applies to every task of iteration From and later, and
// pieces cut under it carry configuration epoch Epoch (the Epoch-th change
// of the job; epoch 0 is the initial configuration).
type Reconfiguration struct {
	Epoch, From int
	Config      sched.Config
}

// reconfigureLen is the payload size of a CtlReconfigure frame: partition
// and credit (int64 each), order and admission (uint32 each), the server
// weights (sched.MaxWeightedServers uint16s), then the fusion size
// (int64).
const (
	weightsAt      = 24
	fusionAt       = weightsAt + 2*sched.MaxWeightedServers
	reconfigureLen = fusionAt + 8
)

// ReconfigureFrame encodes r for the followers: Header.Epoch is r.Epoch,
// Header.Iteration is r.From, and the little-endian payload (reconfigureLen,
// 96 bytes) holds PartitionBytes (int64), CreditBytes (int64), Order
// (uint32), Admission (uint32), the ServerWeights (uint16 each, all
// MaxWeightedServers) and FusionBytes (int64); Header.Elem is the
// Compression. Its priority is 0, that of piece announcements, so on
// one connection the two keep the order they were sent in.
func ReconfigureFrame(r Reconfiguration) transport.Frame {
	payload := make([]byte, reconfigureLen)
	binary.LittleEndian.PutUint64(payload[0:], uint64(r.Config.PartitionBytes))
	binary.LittleEndian.PutUint64(payload[8:], uint64(r.Config.CreditBytes))
	binary.LittleEndian.PutUint32(payload[16:], uint32(r.Config.Order))
	binary.LittleEndian.PutUint32(payload[20:], uint32(r.Config.Admission))
	for i, w := range r.Config.ServerWeights {
		binary.LittleEndian.PutUint16(payload[weightsAt+2*i:], w)
	}
	binary.LittleEndian.PutUint64(payload[fusionAt:], uint64(r.Config.FusionBytes))
	return transport.Frame{Header: transport.Header{Kind: transport.KindControl, Aux: CtlReconfigure,
		Epoch: uint32(r.Epoch), Iteration: uint32(r.From), Length: reconfigureLen, Elem: uint8(r.Config.Compression)}, Payload: payload}
}

// DecodeReconfigure is the inverse of ReconfigureFrame. It refuses any
// other frame, a payload of the wrong size, epoch 0 (which is never a
// change) and a configuration that sched.Config.Validate refuses.
func DecodeReconfigure(f transport.Frame) (Reconfiguration, error) {
	if f.Kind != transport.KindControl || f.Aux != CtlReconfigure {
		return Reconfiguration{}, fmt.Errorf("cluster: not a reconfiguration: %v frame, subtype %d", f.Kind, f.Aux)
	}
	if len(f.Payload) != reconfigureLen {
		return Reconfiguration{}, fmt.Errorf("cluster: bad reconfiguration: %d payload bytes, want %d", len(f.Payload), reconfigureLen)
	}
	r := Reconfiguration{Epoch: int(f.Epoch), From: int(f.Iteration), Config: sched.Config{
		PartitionBytes: int64(binary.LittleEndian.Uint64(f.Payload[0:])),
		CreditBytes:    int64(binary.LittleEndian.Uint64(f.Payload[8:])),
		Order:          sched.Order(binary.LittleEndian.Uint32(f.Payload[16:])),
		Admission:      sched.Admission(binary.LittleEndian.Uint32(f.Payload[20:])),
		Compression:    dtype.DType(f.Elem),
		FusionBytes:    int64(binary.LittleEndian.Uint64(f.Payload[fusionAt:])),
	}}
	for i := range r.Config.ServerWeights {
		r.Config.ServerWeights[i] = binary.LittleEndian.Uint16(f.Payload[weightsAt+2*i:])
	}
	if r.Epoch < 1 {
		return Reconfiguration{}, fmt.Errorf("cluster: bad reconfiguration from iteration %d: epoch %d (changes start at epoch 1)", r.From, r.Epoch)
	}
	if err := r.Config.Validate(); err != nil {
		return Reconfiguration{}, fmt.Errorf("cluster: bad reconfiguration to epoch %d from iteration %d: %w", r.Epoch, r.From, err)
	}
	return r, nil
}

// SayBye sends the orderly goodbye and waits until it was written (or the
// connection failed, or timeout passed), so a Close right after it cannot
// drop it.
func SayBye(c *transport.Conn, rank int, timeout time.Duration) error {
	done := make(chan error, 1)
	if err := c.SendNotify(ByeFrame(rank), func(err error) { done <- err }); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("cluster: goodbye to %s not written within %v", c.Peer(), timeout)
	}
}
