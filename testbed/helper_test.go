package testbed

// The test binary doubles as the traffic generator: a test re-executes itself
// inside a host namespace (`ip netns exec NS /path/to/testbed.test`) with
// helperEnv set, and TestMain then runs a small TCP role instead of the tests.
// This needs no ping, iperf or netcat on the machine.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	helperEnv = "AUTOBYTE_TESTBED_HELPER" // role: sink, send, echo, rtt
	addrEnv   = "AUTOBYTE_TESTBED_ADDR"
	bytesEnv  = "AUTOBYTE_TESTBED_BYTES"   // send: bytes to send (if > 0)
	secsEnv   = "AUTOBYTE_TESTBED_SECONDS" // send: seconds to send (if bytes is 0)
	countEnv  = "AUTOBYTE_TESTBED_COUNT"   // rtt: round trips
)

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		if err := runHelper(role); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sinkReport is what the sink prints (one JSON line) when the sender closes.
type sinkReport struct {
	Bytes   int64      `json:"bytes"`
	FirstNs int64      `json:"first_ns"` // wall clock of the first byte
	LastNs  int64      `json:"last_ns"`  // wall clock of the last byte
	Samples [][2]int64 `json:"samples"`  // (ns since first byte, cumulative bytes)
}

// rttReport is what the rtt client prints.
type rttReport struct {
	ConnectNs int64   `json:"connect_ns"`
	RTTsNs    []int64 `json:"rtts_ns"`
}

func runHelper(role string) error {
	addr := os.Getenv(addrEnv)
	switch role {
	case "sink":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		var r sinkReport
		var first time.Time
		nextSample := time.Duration(0)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				now := time.Now()
				if r.Bytes == 0 {
					first = now
					r.FirstNs = now.UnixNano()
				}
				r.Bytes += int64(n)
				r.LastNs = now.UnixNano()
				if d := now.Sub(first); d >= nextSample {
					r.Samples = append(r.Samples, [2]int64{int64(d), r.Bytes})
					nextSample = d + 20*time.Millisecond
				}
			}
			if err == io.EOF {
				break
			} else if err != nil {
				return err
			}
		}
		r.Samples = append(r.Samples, [2]int64{r.LastNs - r.FirstNs, r.Bytes})
		return json.NewEncoder(os.Stdout).Encode(r)
	case "send":
		c, err := dialRetry(addr)
		if err != nil {
			return err
		}
		total, _ := strconv.ParseInt(os.Getenv(bytesEnv), 10, 64)
		secs, _ := strconv.ParseFloat(os.Getenv(secsEnv), 64)
		deadline := time.Now().Add(time.Duration(secs * float64(time.Second)))
		buf := make([]byte, 256<<10)
		for sent := int64(0); ; {
			n := int64(len(buf))
			if total > 0 {
				if sent >= total {
					break
				}
				n = min(n, total-sent)
			} else if time.Now().After(deadline) {
				break
			}
			m, err := c.Write(buf[:n])
			sent += int64(m)
			if err != nil {
				return err
			}
		}
		return c.Close()
	case "echo":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		fmt.Println("ready")
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	case "rtt":
		count, _ := strconv.Atoi(os.Getenv(countEnv))
		start := time.Now()
		c, err := dialRetry(addr)
		if err != nil {
			return err
		}
		r := rttReport{ConnectNs: int64(time.Since(start))}
		b := []byte{'x'}
		for range count {
			t0 := time.Now()
			if _, err := c.Write(b); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, b); err != nil {
				return err
			}
			r.RTTsNs = append(r.RTTsNs, int64(time.Since(t0)))
		}
		c.Close()
		return json.NewEncoder(os.Stdout).Encode(r)
	}
	return fmt.Errorf("unknown role %q", role)
}

// dialRetry connects to addr, retrying for a few seconds while the peer is
// not yet listening.
func dialRetry(addr string) (net.Conn, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// helperCmd returns the test binary re-executed in host's namespace as role.
func helperCmd(t *testing.T, ctx context.Context, tb *Testbed, host int, role string, env ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := tb.Command(ctx, host, self)
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role), env...)
	cmd.Stderr = &testWriter{t: t, prefix: fmt.Sprintf("[%s h%d] ", role, host)}
	return cmd
}

// startServer starts a listening role (sink, echo) on host at port and
// waits until it reports it is listening. It returns the command and a
// reader of the rest of its stdout.
func startServer(t *testing.T, ctx context.Context, tb *Testbed, host, port int, role string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := helperCmd(t, ctx, tb, host, role, fmt.Sprintf("%s=%s:%d", addrEnv, tb.Hosts[host].IP, port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s in host %d: %v", role, host, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	br := bufio.NewReader(out)
	line, err := br.ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("%s in host %d did not start: %q, %v", role, host, line, err)
	}
	return cmd, br
}

type testWriter struct {
	t      *testing.T
	prefix string
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
