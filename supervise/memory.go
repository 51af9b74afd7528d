package supervise

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// MachineMemory is the memory this machine has available for a new job,
// in bytes (MemAvailable of /proc/meminfo, else MemTotal); 0 when
// unknown. Every process of a local job shares it.
func MachineMemory() int64 {
	if m := meminfo("MemAvailable:"); m > 0 {
		return m
	}
	return meminfo("MemTotal:")
}

// meminfo reads one kB field of /proc/meminfo, in bytes (0 if missing).
func meminfo(field string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "MemTotal:       24523184 kB"
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			fields := strings.Fields(rest)
			if len(fields) == 2 && fields[1] == "kB" {
				if kb, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}
