package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuMeter measures the CPU time a phase took: this process's (user and
// system, from getrusage) and, on Linux, the whole machine's busy time
// (every core's, from /proc/stat), which with a local database includes
// PostgreSQL's. Per message, they show where a burn-down's time goes
// without a profiler, and a change that saves CPU shows in them even when
// the machine's noise hides it in the throughput.
type cpuMeter struct {
	self    time.Duration
	machine time.Duration
	hasMach bool
}

// selfCPU is this process's user and system time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineBusy is the machine's busy CPU time so far, summed over its
// cores: /proc/stat's first line less idle and iowait. ok is false where
// /proc/stat cannot be read or parsed.
func machineBusy() (d time.Duration, ok bool) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false
		}
		// The fields after the name: user nice system idle iowait irq
		// softirq steal guest guest_nice. guest time is already counted
		// in user.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += v
	}
	// USER_HZ is 100 on every Linux architecture Go runs on.
	return time.Duration(busy) * 10 * time.Millisecond, true
}

func (c *cpuMeter) start() {
	c.self = selfCPU()
	c.machine, c.hasMach = machineBusy()
}

// perMessage is the CPU time since start, in microseconds per message of
// n: this process's, and the machine's (0 when it cannot be read).
func (c *cpuMeter) perMessage(n int) (self, machine float64) {
	self = float64((selfCPU() - c.self).Microseconds()) / float64(n)
	if now, ok := machineBusy(); ok && c.hasMach {
		machine = float64((now - c.machine).Microseconds()) / float64(n)
	}
	return self, machine
}

// cpuNote is the figures perMessage returned, for a phase's line.
func cpuNote(self, machine float64) string {
	s := fmt.Sprintf("  CPU %s us/message in this process", fmtNum(self))
	if machine > 0 {
		s += fmt.Sprintf(", %s on the machine", fmtNum(machine))
	}
	return s
}
