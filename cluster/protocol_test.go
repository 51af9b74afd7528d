package cluster

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/autobyte/autobyte/dtype"
	"github.com/autobyte/autobyte/sched"
	"github.com/autobyte/autobyte/transport"
)

// TestReconfigureRoundTrip: a reconfiguration survives encoding, the wire
// header and decoding, for every order and admission rule and extreme sizes.
func TestReconfigureRoundTrip(t *testing.T) {
	for _, r := range []Reconfiguration{
		{Epoch: 1, From: 0, Config: sched.Config{}},
		{Epoch: 2, From: 7, Config: sched.Config{PartitionBytes: 4096, CreditBytes: 16384, Order: sched.OrderPriority, Admission: sched.AdmitStrict}},
		{Epoch: 3, From: math.MaxUint32, Config: sched.Config{PartitionBytes: math.MaxInt64, CreditBytes: 1, Order: sched.OrderFIFO, Admission: sched.AdmitPositive}},
		{Epoch: 4, From: 9, Config: sched.Config{PartitionBytes: 10, Order: sched.OrderPriority, Compression: dtype.BF16}},
		{Epoch: 5, From: 10, Config: sched.Config{Order: sched.OrderPriority, Compression: dtype.F16}},
		{Epoch: 6, From: 11, Config: sched.Config{Order: sched.OrderPriority, ServerWeights: sched.ServerWeights{1000, 250, 1}}},
		{Epoch: 7, From: 12, Config: sched.Config{Order: sched.OrderPriority, ServerWeights: maxWeights()}},
		{Epoch: 8, From: 13, Config: sched.Config{PartitionBytes: 4096, Order: sched.OrderPriority, FusionBytes: 1 << 20}},
		{Epoch: 9, From: 14, Config: sched.Config{Order: sched.OrderPriority, FusionBytes: math.MaxInt64, ServerWeights: maxWeights()}},
	} {
		f := ReconfigureFrame(r)
		if f.Priority != 0 {
			t.Errorf("%+v: priority %d, want 0 (that of piece announcements, to keep their order)", r, f.Priority)
		}
		// Through the header's wire format, as a follower receives it.
		h, err := transport.DecodeHeader(f.Header.Append(nil))
		if err != nil {
			t.Fatalf("%+v: header does not decode: %v", r, err)
		}
		got, err := DecodeReconfigure(transport.Frame{Header: h, Payload: f.Payload})
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if got != r {
			t.Errorf("round trip of %+v gave %+v", r, got)
		}
	}
}

// maxWeights weighs every server a configuration can weigh, with the
// extreme weights.
func maxWeights() sched.ServerWeights {
	var w sched.ServerWeights
	for i := range w {
		w[i] = uint16(1 + i%2*(math.MaxUint16-1))
	}
	return w
}

// TestDecodeReconfigureRejects: every malformed reconfiguration is refused
// with an error naming the bad value, never a panic.
func TestDecodeReconfigureRejects(t *testing.T) {
	good := func() transport.Frame {
		return ReconfigureFrame(Reconfiguration{Epoch: 1, From: 5, Config: sched.Config{PartitionBytes: 4096, CreditBytes: 8192, Order: sched.OrderPriority}})
	}
	with := func(edit func(*transport.Frame)) transport.Frame {
		f := good()
		edit(&f)
		return f
	}
	cases := []struct {
		name string
		f    transport.Frame
		want string
	}{
		{"announcement", AnnounceFrame(sched.Piece{Count: 1, Bytes: 4}), "subtype 3"},
		{"push frame", with(func(f *transport.Frame) { f.Kind = transport.KindPush }), "not a reconfiguration"},
		{"empty payload", with(func(f *transport.Frame) { f.Payload = nil }), "0 payload bytes, want 96"},
		{"short payload", with(func(f *transport.Frame) { f.Payload = f.Payload[:23] }), "23 payload bytes"},
		{"long payload", with(func(f *transport.Frame) { f.Payload = append(f.Payload, 0) }), "97 payload bytes"},
		{"weight hole", with(func(f *transport.Frame) { binary.LittleEndian.PutUint16(f.Payload[24+2*2:], 7) }), "server 0 has weight 0"},
		{"epoch 0", with(func(f *transport.Frame) { f.Epoch = 0 }), "epoch 0"},
		{"negative partition", with(func(f *transport.Frame) {
			binary.LittleEndian.PutUint64(f.Payload[0:], uint64(1)<<63)
		}), "partition size must be >= 0 bytes (0 = no partitioning), got -9223372036854775808"},
		{"negative credit", with(func(f *transport.Frame) {
			binary.LittleEndian.PutUint64(f.Payload[8:], math.MaxUint64)
		}), "got -1"},
		{"unknown order", with(func(f *transport.Frame) { binary.LittleEndian.PutUint32(f.Payload[16:], 9) }), "unknown order 9"},
		{"negative fusion", with(func(f *transport.Frame) { binary.LittleEndian.PutUint64(f.Payload[fusionAt:], math.MaxUint64) }), "fusion size must be >= 0 bytes (0 = no fusion), got -1"},
		{"unknown admission", with(func(f *transport.Frame) { binary.LittleEndian.PutUint32(f.Payload[20:], math.MaxUint32) }), "unknown admission rule 4294967295"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := DecodeReconfigure(c.f)
			if err == nil {
				t.Fatalf("decoded %+v, want an error containing %q", r, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to contain %q", err, c.want)
			}
		})
	}
}

// TestAnnounceIsNotReconfigure: the two frame kinds that share the control
// connection are never taken for each other.
func TestAnnounceIsNotReconfigure(t *testing.T) {
	f := ReconfigureFrame(Reconfiguration{Epoch: 1, From: 2, Config: sched.Config{PartitionBytes: 16}})
	if p, err := DecodeAnnounce(f); err == nil {
		t.Errorf("DecodeAnnounce accepted a reconfiguration as %+v", p)
	}
}
