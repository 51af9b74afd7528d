package supervise

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of Options.
const (
	// DefaultGrace is how long the other processes get to exit on their
	// own after the first failure: a lost peer is noticed within
	// milliseconds when it died and within the peer timeout when it hangs,
	// and the first failure already is that notice.
	DefaultGrace = 3 * time.Second
	// DefaultKillAfter is how long a process gets between SIGTERM and
	// SIGKILL.
	DefaultKillAfter = time.Second
	// DefaultServerGrace is how long servers get to exit after the last
	// worker did (they end after every worker's goodbye).
	DefaultServerGrace = 10 * time.Second
	// DefaultLines is how many lines of each child's stderr are kept.
	DefaultLines = 20
)

// Child is one process of the job. Set Name and Cmd (not started; the
// supervisor takes its stdout and stderr); the rest is optional.
type Child struct {
	Name string
	Cmd  *exec.Cmd
	// Status: the child writes status messages (Reporter) to fd 3.
	Status bool
	// Server: the child ends after the others (a parameter server); when
	// every other child exited 0 it gets ServerGrace to follow.
	Server bool
	// UntilStopped: a server that serves one job after another and ends
	// only when stopped; once every other child exited 0 it is stopped at
	// once, which is its normal end.
	UntilStopped bool
	// OnStdout and OnStderr, if set, see every line of the child's output
	// (for display). Stdout is also kept whole (Stdout).
	OnStdout, OnStderr func(line string)

	mu       sync.Mutex
	stdout   strings.Builder
	lines    []string // the last Options.Lines non-empty lines of stderr
	report   *Message // its exit message, if it sent one
	reportAt time.Time
	err      error // from Wait
	exited   time.Time
	stopped  time.Time // when the supervisor first signalled it
}

// Stdout is everything the child wrote to stdout.
func (c *Child) Stdout() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stdout.String()
}

// Options configure a Supervisor; zero fields take the defaults.
type Options struct {
	Grace, KillAfter, ServerGrace time.Duration
	Lines                         int
	// OnMessage sees every status message of every child (not the exit
	// message, which the supervisor keeps), on the child's reader
	// goroutine.
	OnMessage func(c *Child, m Message)
	// LostPeer, if set, judges a child without status messages (a
	// script) by its last line of stderr: true when it failed because it
	// lost a peer, so that it is not taken for the root cause while
	// another failure is.
	LostPeer func(lastLine string) bool
}

// Supervisor runs children. Start them, then Wait; Start may also be
// called while Wait runs (a child started late), until Wait returns.
type Supervisor struct {
	o     Options
	start time.Time
	exits chan *Child

	mu       sync.Mutex
	children []*Child
	running  int
	stopping bool
}

// New returns a supervisor; its clock (the times in failures) starts now.
func New(o Options) *Supervisor {
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.KillAfter <= 0 {
		o.KillAfter = DefaultKillAfter
	}
	if o.ServerGrace <= 0 {
		o.ServerGrace = DefaultServerGrace
	}
	if o.Lines <= 0 {
		o.Lines = DefaultLines
	}
	return &Supervisor{o: o, start: time.Now(), exits: make(chan *Child, 64)}
}

// ErrStopping is returned by Start once the supervisor is stopping the job.
var ErrStopping = errors.New("supervise: the job is stopping")

// Start starts c. Its process dies with the supervisor's (Pdeathsig).
func (s *Supervisor) Start(c *Child) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return ErrStopping
	}
	cmd := c.Cmd
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("supervise: %s: %w", c.Name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("supervise: %s: %w", c.Name, err)
	}
	var status *os.File
	if c.Status {
		r, w, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("supervise: %s: status pipe: %w", c.Name, err)
		}
		defer w.Close() // the child holds its copy
		status = r
		cmd.ExtraFiles = []*os.File{w}
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, StatusFDEnv+"=3")
	}
	if err := cmd.Start(); err != nil {
		if status != nil {
			status.Close()
		}
		return fmt.Errorf("starting %s (%s): %w", c.Name, cmd.Path, err)
	}
	s.children = append(s.children, c)
	s.running++
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() {
		defer pipes.Done()
		s.readLines(stdout, func(line string) {
			c.mu.Lock()
			c.stdout.WriteString(line + "\n")
			c.mu.Unlock()
			if c.OnStdout != nil {
				c.OnStdout(line)
			}
		})
	}()
	go func() {
		defer pipes.Done()
		s.readLines(stderr, func(line string) {
			if strings.TrimSpace(line) != "" {
				c.mu.Lock()
				if len(c.lines) == s.o.Lines {
					c.lines = c.lines[1:]
				}
				c.lines = append(c.lines, line)
				c.mu.Unlock()
			}
			if c.OnStderr != nil {
				c.OnStderr(line)
			}
		})
	}()
	if status != nil {
		pipes.Add(1)
		go func() {
			defer pipes.Done()
			defer status.Close()
			s.readLines(status, func(line string) {
				var m Message
				if json.Unmarshal([]byte(line), &m) != nil {
					return // not ours: ignore rather than fail the job
				}
				if m.Kind == KindExit {
					c.mu.Lock()
					c.report, c.reportAt = &m, time.Now()
					c.mu.Unlock()
					return
				}
				if s.o.OnMessage != nil {
					s.o.OnMessage(c, m)
				}
			})
		}()
	}
	go func() {
		pipes.Wait() // os/exec: Wait after the pipes are drained
		err := cmd.Wait()
		c.mu.Lock()
		c.err, c.exited = err, time.Now()
		c.mu.Unlock()
		s.exits <- c
	}()
	return nil
}

func (s *Supervisor) readLines(r io.Reader, line func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line(sc.Text())
	}
	_, _ = io.Copy(io.Discard, r) // a line too long: keep draining
}

// Wait returns when every started child exited. A failure is a *Failure
// (the root cause); ctx's end stops the job and returns an error saying
// so. Every child has exited when Wait returns.
func (s *Supervisor) Wait(ctx context.Context) ([]*Child, error) {
	var failed *Child // the first child that failed on its own accord
	var grace <-chan time.Time
	var kill <-chan time.Time
	var late error // servers that outlived the workers
	var interrupted error
	for {
		s.mu.Lock()
		running := s.running
		s.mu.Unlock()
		if running == 0 {
			break
		}
		select {
		case c := <-s.exits:
			s.mu.Lock()
			s.running--
			c.mu.Lock()
			bad := c.err != nil && c.stopped.IsZero()
			c.mu.Unlock()
			s.mu.Unlock()
			if bad && failed == nil {
				failed = c
				grace = time.After(s.o.Grace)
			}
			switch {
			case failed != nil && s.onlyLostLeft():
				// Whoever is left is what the others lost: hung, not
				// coming back. Waiting out the grace would only delay.
				kill = s.stop()
			case failed == nil && grace == nil && kill == nil:
				if only, untilStopped := s.onlyServersLeft(); untilStopped {
					kill = s.stop()
				} else if only {
					grace = time.After(s.o.ServerGrace)
				}
			}
		case <-grace:
			grace = nil
			if failed == nil && interrupted == nil {
				late = fmt.Errorf("parameter servers did not exit %s after the last worker: did every worker join the job and finish it?", s.o.ServerGrace)
			}
			kill = s.stop()
		case <-kill:
			kill = nil
			s.signal(syscall.SIGKILL)
		case <-ctx.Done():
			interrupted = fmt.Errorf("interrupted: %w", context.Cause(ctx))
			kill = s.stop()
			ctx = context.Background()
		}
	}
	s.mu.Lock()
	s.stopping = true
	children := append([]*Child(nil), s.children...)
	s.mu.Unlock()
	switch {
	case interrupted != nil:
		return children, interrupted
	case failed != nil:
		return children, rootCause(children, s.start, s.o.LostPeer)
	case late != nil:
		return children, late
	}
	return children, nil
}

// stop sends SIGTERM (and SIGCONT, so that a stopped process can act on
// it) to every running child and returns when to send SIGKILL.
func (s *Supervisor) stop() <-chan time.Time {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.signal(syscall.SIGTERM)
	s.signal(syscall.SIGCONT)
	return time.After(s.o.KillAfter)
}

func (s *Supervisor) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.children {
		c.mu.Lock()
		if c.exited.IsZero() && c.Cmd.Process != nil {
			if c.stopped.IsZero() {
				c.stopped = time.Now()
			}
			_ = c.Cmd.Process.Signal(sig) // fails harmlessly once it exited
		}
		c.mu.Unlock()
	}
}

// onlyLostLeft: every child still running is one that a child which
// exited reported as silent: hung or cut off. (A peer that closed the
// connection with a reason, or reset it, is failing or dead: it exits.)
func (s *Supervisor) onlyLostLeft() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	lost := map[string]bool{}
	left := 0
	for _, c := range s.children {
		c.mu.Lock()
		if !c.exited.IsZero() && c.report != nil && c.report.Lost != nil && c.report.Lost.Silent {
			lost[c.report.Lost.Name()] = true
		}
		if c.exited.IsZero() {
			left++
		}
		c.mu.Unlock()
	}
	if left == 0 {
		return false
	}
	for _, c := range s.children {
		c.mu.Lock()
		running := c.exited.IsZero()
		c.mu.Unlock()
		if running && !lost[c.Name] {
			return false
		}
	}
	return true
}

// onlyServersLeft: every child still running is a server, and every other
// child exited 0 (only); untilStopped: besides, every one of those servers
// serves until stopped.
func (s *Supervisor) onlyServersLeft() (only, untilStopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left, serving := 0, 0
	for _, c := range s.children {
		c.mu.Lock()
		running, ok := c.exited.IsZero(), c.err == nil
		c.mu.Unlock()
		if running {
			left++
			if !c.Server {
				return false, false
			}
			if c.UntilStopped {
				serving++
			}
		} else if !ok {
			return false, false
		}
	}
	return left > 0, left > 0 && serving == left
}
