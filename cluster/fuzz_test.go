package cluster

import (
	"reflect"
	"testing"

	"github.com/autobyte/autobyte/transport"
)

// FuzzDecodeControl: control frames come from authenticated peers but are
// still network input. An announcement or a reconfiguration decodes into
// something that encodes back to the same frame, or into an error; never a
// panic.
func FuzzDecodeControl(f *testing.F) {
	f.Add(uint8(transport.KindControl), uint32(CtlAnnounce), uint32(1), uint32(2), uint32(3), uint32(4), uint64(5), uint8(0), make([]byte, 16))
	f.Add(uint8(transport.KindControl), uint32(CtlReconfigure), uint32(1), uint32(9), uint32(0), uint32(0), uint64(0), uint8(1), make([]byte, reconfigureLen))
	f.Add(uint8(transport.KindControl), uint32(CtlReconfigure), uint32(0), uint32(0), uint32(0), uint32(0), uint64(0), uint8(9), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, kind uint8, aux, epoch, iteration, key, piece uint32, offset uint64, elem uint8, payload []byte) {
		fr := transport.Frame{Header: transport.Header{Kind: transport.Kind(kind), Aux: aux, Epoch: epoch, Iteration: iteration,
			Key: key, Piece: piece, Offset: offset, Length: uint32(len(payload)), Elem: elem}, Payload: payload}
		if p, err := DecodeAnnounce(fr); err == nil {
			if back := AnnounceFrame(p); !reflect.DeepEqual(back.Payload, fr.Payload) || back.Epoch != epoch || back.Iteration != iteration ||
				back.Key != key || back.Piece != piece || back.Offset != offset {
				t.Errorf("announcement %+v decoded as %+v, which encodes as %+v", fr.Header, p, back.Header)
			}
		}
		if r, err := DecodeReconfigure(fr); err == nil {
			if err := r.Config.Validate(); err != nil {
				t.Errorf("reconfiguration %+v decoded into a configuration Validate refuses: %v", fr.Header, err)
			}
			if r.Epoch == 0 {
				t.Errorf("reconfiguration %+v decoded with epoch 0", fr.Header)
			}
			if back := ReconfigureFrame(r); back.Epoch != epoch || back.Iteration != iteration {
				t.Errorf("reconfiguration %+v decoded as %+v, which encodes as %+v", fr.Header, r, back.Header)
			}
		}
	})
}
