package host

import (
	"strings"
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

// TestHungRestartSetting: a plugin that does not answer its health check
// is restarted after 60 s by default; hung_restart_seconds changes that,
// and 0 turns it off.
func TestHungRestartSetting(t *testing.T) {
	for yaml, want := range map[string]time.Duration{
		"listen: 127.0.0.1:8080\n":                           60 * time.Second,
		"listen: 127.0.0.1:8080\nhung_restart_seconds: 0\n":  0,
		"listen: 127.0.0.1:8080\nhung_restart_seconds: 90\n": 90 * time.Second,
	} {
		cfg, err := ParseConfig("t.yaml", []byte(yaml))
		if err != nil || cfg.HungRestart != want {
			t.Errorf("%q: hung restart %v, %v; want %v", yaml, cfg.HungRestart, err, want)
		}
	}
	if _, err := ParseConfig("t.yaml", []byte("hung_restart_seconds: -1\n")); err == nil || !strings.Contains(err.Error(), "hung_restart_seconds") {
		t.Errorf("a negative hung_restart_seconds: %v; want an error naming it", err)
	}
}
