package bridge

import (
	"testing"
)

// FuzzSettings: the request the Python side sends (tensors and settings
// as JSON) and the environment's values either give settings the engine
// can open with, or an error; never a panic.
func FuzzSettings(f *testing.F) {
	f.Add([]byte(`{"tensors":[{"name":"a","layer":0,"elems":10},{"name":"b","layer":1,"elems":3}],"settings":{"AUTOBYTE_CREDIT":"8MB"}}`), "2", "3", "1MB")
	f.Add([]byte(`{"tensors":[]}`), "", "", "")
	f.Add([]byte(`{"tensors":[{"name":"a","layer":-1,"elems":-10}]}`), "-1", "0", "0")
	f.Add([]byte(`{"tensors":[{"name":"a","layer":0,"elems":9223372036854775807}],"settings":{"AUTOBYTE_ARCH":"ps"}}`), "1", "99999999999", "1e400MB")
	f.Add([]byte(`{"tensors":[{"name":"a","layer":0,"elems":4}],"settings":{"AUTOBYTE_TIMEOUT":"1e18"}}`), "2", "1", "4MB")
	f.Fuzz(func(t *testing.T, req []byte, servers, world, partition string) {
		r, err := DecodeRequest(req)
		if err != nil {
			return
		}
		env := map[string]string{"AUTOBYTE_SERVERS": servers, "WORLD_SIZE": world, "RANK": "0", "MASTER_ADDR": "127.0.0.1",
			"MASTER_PORT": "29500", "AUTOBYTE_TOKEN": "t", "AUTOBYTE_PARTITION": partition}
		st, err := ParseSettings(r, envOf(env))
		if err != nil {
			return
		}
		if err := st.Spec.Sched.Validate(); err != nil {
			t.Fatalf("request %q, servers %q, world %q, partition %q: settings with a configuration Validate refuses: %v", req, servers, world, partition, err)
		}
		if st.Spec.Workers < 1 || st.Rank < 0 || st.Rank >= st.Spec.Workers || st.Spec.Profile == nil || st.Spec.Profile.TotalParams() <= 0 {
			t.Fatalf("request %q, servers %q, world %q: settings %+v rank %d", req, servers, world, st.Spec, st.Rank)
		}
	})
}
