// Package supervise runs the processes of a job on one machine: it starts
// them, follows their progress through structured status messages, finds
// the first root cause when the job fails (the process that failed on its
// own, not the ones that failed because they lost it), and stops the rest
// with a bounded grace.
//
// A child that speaks the status protocol gets a pipe as file descriptor 3
// and StatusFDEnv=3 in its environment, and writes one JSON Message per
// line to it (Reporter). Other children (a user's training script) are
// judged by their exit status and their last lines of stderr.
package supervise

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/autobyte/autobyte/transport"
)

// StatusFDEnv names the environment variable that gives a child the file
// descriptor to write its status messages to.
const StatusFDEnv = "AUTOBYTE_STATUS_FD"

// Message kinds.
const (
	KindIteration = "iteration" // rank 0 ended forward pass Iteration of Of
	KindTuner     = "tuner"     // a tuner's event or configuration change (Text)
	KindExit      = "exit"      // the process is about to exit (Error: why, "" for success)
)

// Message is one status line of a child.
type Message struct {
	Kind      string  `json:"kind"`
	Iteration int     `json:"iteration,omitempty"`
	Of        int     `json:"of,omitempty"`
	Seconds   float64 `json:"seconds,omitempty"`
	Text      string  `json:"text,omitempty"`
	Error     string  `json:"error,omitempty"`
	// Lost is the peer whose loss made the process fail, if that is why.
	Lost *Lost `json:"lost,omitempty"`
}

// Lost is a peer a process lost: Role and Rank as the peer announced them
// ("server" 1 is child "server 1"), Silent when it sent nothing for the
// peer timeout (hung or cut off), Closed when it closed the connection
// with its own failure as the reason.
type Lost struct {
	Role   string `json:"role"`
	Rank   int    `json:"rank"`
	Silent bool   `json:"silent,omitempty"`
	Closed bool   `json:"closed,omitempty"`
}

// Name is the child name of the peer ("worker 2").
func (l Lost) Name() string { return fmt.Sprintf("%s %d", l.Role, l.Rank) }

// Reporter writes a child's status messages; a nil Reporter (no
// supervisor) drops them. Methods are safe for concurrent use.
type Reporter struct {
	mu  sync.Mutex
	f   *os.File
	enc *json.Encoder
}

// FromEnv opens the status descriptor StatusFDEnv names; nil when the
// variable is unset or invalid (the process runs unsupervised).
func FromEnv() *Reporter {
	fd, err := strconv.Atoi(os.Getenv(StatusFDEnv))
	if err != nil {
		return nil
	}
	return FromFD(fd)
}

// FromFD writes status messages to file descriptor fd (a process that took
// StatusFDEnv out of its environment, so that its own children do not
// inherit it, passes the number on); nil for a descriptor below 3.
func FromFD(fd int) *Reporter {
	if fd < 3 {
		return nil
	}
	f := os.NewFile(uintptr(fd), "status")
	if f == nil {
		return nil
	}
	return &Reporter{f: f, enc: json.NewEncoder(f)}
}

func (r *Reporter) send(m Message) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.enc.Encode(m) // a supervisor that went away must not fail the job
}

// Iteration reports that forward pass k of n ended, after d.
func (r *Reporter) Iteration(k, n int, d time.Duration) {
	r.send(Message{Kind: KindIteration, Iteration: k, Of: n, Seconds: d.Seconds()})
}

// Tuner reports a tuner's event.
func (r *Reporter) Tuner(text string) { r.send(Message{Kind: KindTuner, Text: text}) }

// Exit reports how the process ends: err nil for success; a lost peer
// (transport.LostPeer) is named in the message.
func (r *Reporter) Exit(err error) {
	if r == nil {
		return
	}
	m := Message{Kind: KindExit}
	if err != nil {
		m.Error = err.Error()
		if p, ok := transport.LostPeer(err); ok {
			m.Lost = &Lost{Role: p.Role, Rank: p.Rank, Silent: p.Silent, Closed: p.Closed}
		}
	}
	r.send(m)
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.f.Close()
}
