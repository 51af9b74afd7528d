package supervise

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"github.com/autobyte/autobyte/units"
)

// Failure is the root cause of a failed job.
type Failure struct {
	// Child is the process at fault ("worker 1").
	Child string
	// Exit is how it ended ("exit status 1", "signal: killed"; for a hung
	// child, how the supervisor's stop ended it).
	Exit string
	// Reason is its own error (its exit message, else its last line of
	// stderr), or for a hung child what the peer that lost it said.
	Reason string
	// Hung: the child did not fail but stopped responding; LostBy is the
	// child that noticed first.
	Hung   bool
	LostBy string
	// After is when it failed (or was noticed), since the supervisor's start.
	After time.Duration
	// Lines are its last lines of stderr (none for a hung child: they
	// would be what it wrote once stopped).
	Lines []string
}

func (f *Failure) Error() string {
	after := units.FormatSeconds(f.After.Seconds())
	if f.Hung {
		return fmt.Sprintf("%s stopped responding: %s lost it %s into the job (%s); stopped it (%s)", f.Child, f.LostBy, after, f.Reason, f.Exit)
	}
	return fmt.Sprintf("%s failed (%s) after %s: %s", f.Child, f.Exit, after, f.Reason)
}

// rootCause picks the first root cause among the children, in exit order:
//
//  1. the first child that failed without reporting a lost peer (its own
//     error, a crash, a kill, or a script that raised, unless its last
//     line says it lost a peer): the others failed because they lost it;
//  2. otherwise every failure was a lost peer: follow who lost whom from
//     the first one to a child that lost nobody or that the supervisor
//     stopped; when that one never failed by itself (it was still
//     running, silent, until the supervisor stopped it), it hung;
//  3. otherwise (a cycle) the first failure.
func rootCause(children []*Child, start time.Time, lostPeer func(string) bool) *Failure {
	type exitInfo struct {
		c       *Child
		err     error
		report  *Message
		exited  time.Time
		stopped bool // signalled by the supervisor before it reported
		lines   []string
	}
	var infos []exitInfo
	byName := map[string]*exitInfo{}
	for _, c := range children {
		c.mu.Lock()
		// A report sent after the supervisor's signal is the signal's effect.
		stopped := !c.stopped.IsZero() && (c.report == nil || c.reportAt.After(c.stopped))
		infos = append(infos, exitInfo{c: c, err: c.err, report: c.report, exited: c.exited, stopped: stopped, lines: slices.Clone(c.lines)})
		c.mu.Unlock()
	}
	slices.SortStableFunc(infos, func(a, b exitInfo) int { return a.exited.Compare(b.exited) })
	for i := range infos {
		byName[infos[i].c.Name] = &infos[i]
	}
	failure := func(x *exitInfo) *Failure {
		f := &Failure{Child: x.c.Name, Exit: exitString(x.err), After: x.exited.Sub(start), Lines: x.lines}
		switch {
		case x.report != nil && x.report.Error != "":
			f.Reason = x.report.Error
		case len(x.lines) > 0:
			f.Reason = x.lines[len(x.lines)-1]
		default:
			f.Reason = f.Exit
		}
		return f
	}
	failedAlone := func(x *exitInfo) bool {
		if x.err == nil || x.stopped || x.report != nil && x.report.Lost != nil {
			return false
		}
		return x.report != nil || lostPeer == nil || len(x.lines) == 0 || !lostPeer(x.lines[len(x.lines)-1])
	}
	for i := range infos {
		if failedAlone(&infos[i]) {
			return failure(&infos[i])
		}
	}
	var first *exitInfo
	for i := range infos {
		if x := &infos[i]; x.err != nil && !x.stopped {
			first = x
			break
		}
	}
	if first == nil {
		return nil
	}
	seen := map[string]bool{first.c.Name: true}
	for x := first; x.report != nil && x.report.Lost != nil; {
		name := x.report.Lost.Name()
		y, ok := byName[name]
		if !ok || seen[name] {
			break // a peer that is not ours, or a cycle
		}
		seen[name] = true
		// What a child says after the supervisor stopped it (woken by
		// SIGCONT, it finds its peers gone) is no cause: it ends the chain.
		if y.stopped || y.report == nil || y.report.Lost == nil {
			if failedAlone(y) {
				return failure(y)
			}
			// y did not fail on its own before the supervisor stopped it:
			// it hung (or was cut off) and x noticed.
			f := failure(y)
			f.Hung, f.LostBy, f.Reason = true, x.c.Name, x.report.Error
			f.Lines = nil // what it wrote once stopped, not why it hung
			f.After = x.exited.Sub(start)
			return f
		}
		x = y
	}
	return failure(first)
}

// exitString says how a process ended.
func exitString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "signal: " + ws.Signal().String()
		}
	}
	return err.Error()
}
