package host

import (
	"testing"
	"time"
)

// TestOnlyCrashLoopsUseTheRestartBudget: crashes of a plugin that could
// not stay up a minute use up restart_budget; a crash after a longer run
// (tasks_worker killed by a task it ran, say) does not, so any number of
// them leave the plugin restarting.
func TestOnlyCrashLoopsUseTheRestartBudget(t *testing.T) {
	s := &Supervisor{host: &Config{RestartBudget: 2, RestartWindow: time.Hour}}
	for i := range 10 {
		if s.recordCrash(stableAfter + time.Duration(i)*time.Second) {
			t.Fatalf("crash %d after a stable run spent the budget", i+1)
		}
	}
	for i, ran := range []time.Duration{0, stableAfter - time.Second} {
		if s.recordCrash(ran) {
			t.Fatalf("quick crash %d of a budget of 2 spent it", i+1)
		}
	}
	if !s.recordCrash(time.Second) {
		t.Fatal("the third quick crash within the window did not spend a budget of 2")
	}
}
