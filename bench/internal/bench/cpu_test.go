package bench

import (
	"crypto/sha256"
	"runtime"
	"testing"
	"time"
)

// TestCPUMeterCountsWork: work done between start and perMessage shows in
// this process's figure and, on Linux, in the machine's, and is shared out
// over the messages.
func TestCPUMeterCountsWork(t *testing.T) {
	var c cpuMeter
	c.start()
	// Burn at least 200 ms of CPU: getrusage counts in ticks of the
	// scheduler, /proc/stat in hundredths of a second.
	began := selfCPU()
	sum := sha256.Sum256(nil)
	for selfCPU()-began < 200*time.Millisecond {
		for range 10_000 {
			sum = sha256.Sum256(sum[:])
		}
	}
	self, machine := c.perMessage(4)
	if self < 200_000/4 {
		t.Errorf("this process: %.0f us a message over 4 messages after 200 ms of CPU, want at least 50000", self)
	}
	if runtime.GOOS == "linux" {
		// The machine's busy time includes this process's (give or take a
		// tick of /proc/stat's accounting).
		if machine < self-2*10_000/4 {
			t.Errorf("the machine: %.0f us a message, less than this process's %.0f", machine, self)
		}
	}
	if got := cpuNote(12.5, 40); got != "  CPU 12.50 us/message in this process, 40.00 on the machine" {
		t.Errorf("cpuNote = %q", got)
	}
	if got := cpuNote(12.5, 0); got != "  CPU 12.50 us/message in this process" {
		t.Errorf("cpuNote without the machine = %q", got)
	}
}
