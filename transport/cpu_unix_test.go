//go:build unix

package transport

import (
	"syscall"
	"time"
)

// processCPU is the user and system CPU this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
