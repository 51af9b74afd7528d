package tlsca

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// handshake runs a TLS handshake between a server with srv and a client
// with cli over loopback TCP (bounded by a deadline) and returns the
// client's and server's errors.
func handshake(t *testing.T, srv, cli *tls.Config) (error, error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		s := tls.Server(nc, srv)
		err = s.Handshake()
		if err == nil {
			_, err = io.ReadFull(s, make([]byte, 1)) // the client's certificate is checked by now
		}
		done <- err
	}()
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	c := tls.Client(nc, cli)
	cerr := c.Handshake()
	if cerr == nil {
		_, cerr = c.Write([]byte{1})
	}
	if cerr != nil {
		nc.Close()
	}
	return cerr, <-done
}

// TestEphemeralMutualTLS: two processes with the run's certificate talk;
// a process with another run's certificate is refused both ways.
func TestEphemeralMutualTLS(t *testing.T) {
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	f, err := Ephemeral(t.TempDir(), ips)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f.Cert, f.Key, f.CA} {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want a 0600 file", p, err, st.Mode())
		}
	}
	cfg, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	cli := cfg.Clone()
	cli.ServerName = "127.0.0.1"
	if cerr, serr := handshake(t, cfg, cli); cerr != nil || serr != nil {
		t.Fatalf("same run: client %v, server %v; want a handshake", cerr, serr)
	}
	other, err := Ephemeral(t.TempDir(), ips)
	if err != nil {
		t.Fatal(err)
	}
	ocfg, err := other.Config()
	if err != nil {
		t.Fatal(err)
	}
	ocli := ocfg.Clone()
	ocli.ServerName = "127.0.0.1"
	if cerr, _ := handshake(t, cfg, ocli); cerr == nil {
		t.Error("a client of another run's CA accepted our server's certificate")
	}
	// Another run's client that trusts our CA still has a certificate our
	// server does not accept.
	mixed := ocli.Clone()
	mixed.RootCAs = cfg.RootCAs
	if _, serr := handshake(t, cfg, mixed); serr == nil {
		t.Error("our server accepted a client certificate signed by another CA")
	}
	// The certificate is for the given IPs only.
	wrong := cli.Clone()
	wrong.ServerName = "10.9.9.9"
	if cerr, _ := handshake(t, cfg, wrong); cerr == nil || !strings.Contains(cerr.Error(), "10.9.9.9") {
		t.Errorf("client expecting 10.9.9.9: %v, want a name mismatch", cerr)
	}
}

func TestConfigErrors(t *testing.T) {
	if cfg, err := (Files{}).Config(); cfg != nil || err != nil {
		t.Fatalf("no files: %v, %v; want no TLS", cfg, err)
	}
	if _, err := (Files{Cert: "c.pem"}).Config(); !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), `certificate "c.pem"`) {
		t.Errorf("certificate only: %v, want ErrIncomplete naming it", err)
	}
	dir := t.TempDir()
	f, err := Ephemeral(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "junk.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	if _, err := (Files{Cert: f.Cert, Key: f.Key, CA: notPEM}).Config(); err == nil || !strings.Contains(err.Error(), "no PEM certificate in it") {
		t.Errorf("CA without PEM: %v", err)
	}
	if _, err := (Files{Cert: f.Cert, Key: f.CA, CA: f.CA}).Config(); err == nil || !strings.Contains(err.Error(), f.Cert) {
		t.Errorf("key file holding a certificate: %v, want an error naming the files", err)
	}
	if _, err := (Files{Cert: f.Cert, Key: f.Key, CA: filepath.Join(dir, "missing.pem")}).Config(); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("missing CA: %v", err)
	}
}
