// Package cluster is how the processes of one job find each other and talk
// about the job (not about data): rendezvous at a coordinator, the member
// table, and the control messages that travel on transport.KindControl
// frames. It follows the usual launcher conventions (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE) so jobs run under torchrun-style
// launchers, Slurm or Kubernetes.
//
// It knows nothing of summation, rings or scheduling decisions.
package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

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
		Offset: uint64(p.Offset), Length: 16}, Payload: payload}
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
	}
	if p.Count < 1 || p.Index >= p.Count || p.Bytes <= 0 {
		return sched.Piece{}, fmt.Errorf("cluster: bad piece announcement: piece %d of %d, %d bytes", p.Index, p.Count, p.Bytes)
	}
	return p, nil
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
