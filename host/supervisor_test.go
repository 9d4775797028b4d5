package host

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/taskhost/taskhost/capability"
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

// TestOnlyProcessesSeenToEndAreNamedEnded: the next process of a plugin is
// told which earlier ones ended (capability.EndedEnv), newest first and at
// most capability.MaxEndedInstances of them, and only those go-plugin has
// waited on: a process never started is named nowhere.
func TestOnlyProcessesSeenToEndAreNamedEnded(t *testing.T) {
	s := &Supervisor{}
	ended := func() *plugin.Client {
		pc := plugin.NewClient(&plugin.ClientConfig{
			HandshakeConfig:  capability.Handshake,
			VersionedPlugins: capability.VersionedPlugins(nil),
			Cmd:              exec.Command("true"),
			AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
			Logger:           hclog.NewNullLogger(),
			StartTimeout:     5 * time.Second,
		})
		if _, err := pc.Client(); err == nil {
			t.Fatal("true answered the plugin handshake")
		}
		pc.Kill()
		return pc
	}
	unstarted := plugin.NewClient(&plugin.ClientConfig{HandshakeConfig: capability.Handshake, Cmd: exec.Command("true"), Logger: hclog.NewNullLogger()})
	s.noteEnded("00000000000000ff", unstarted)
	if got := s.endedInstances(); len(got) != 0 {
		t.Fatalf("a process never started is named ended: %v", got)
	}
	var want []string
	for i := range capability.MaxEndedInstances + 2 {
		id := fmt.Sprintf("%016x", i)
		s.noteEnded(id, ended())
		want = append([]string{id}, want...)
	}
	want = want[:capability.MaxEndedInstances]
	if got := s.endedInstances(); !slices.Equal(got, want) {
		t.Fatalf("ended instances %v, want the newest %d first: %v", got, capability.MaxEndedInstances, want)
	}
	if a, b := newInstance(), newInstance(); !capability.ValidInstance(a) || a == b {
		t.Fatal("instance ids are not 16 random hex digits")
	}
}
