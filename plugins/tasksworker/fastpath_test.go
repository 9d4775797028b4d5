package tasksworker

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/local"
	"github.com/taskhost/taskhost/reaper"
)

// goneProcessPID returns the pid of a process that ran and exited.
func goneProcessPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("run true: %v", err)
	}
	if !pidGone(cmd.Process.Pid) {
		t.Fatalf("pid %d still exists", cmd.Process.Pid)
	}
	return cmd.Process.Pid
}

// TestFastReclaimLeavesHeartbeatingNeighbours: two workers registered from
// this machine's name with pids that do not exist here. The one that stays
// silent is the previous process, dead: the fast path marks it dead and its
// message goes back to the queue. The one that goes on heartbeating runs in
// another PID namespace (a container with the same hostname): it is left
// alone, and so is its message.
func TestFastReclaimLeavesHeartbeatingNeighbours(t *testing.T) {
	ctx := t.Context()
	b, err := local.Open(ctx, local.Options{Path: filepath.Join(t.TempDir(), "tw.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	pid := goneProcessPID(t)
	for _, id := range []string{"self", "dead", "elsewhere"} {
		p := pid
		if id == "self" {
			p = os.Getpid()
		}
		if err := b.RegisterWorker(ctx, broker.WorkerInfo{ID: id, Host: host, PID: p, Roles: []string{broker.RoleWorker}}); err != nil {
			t.Fatal(err)
		}
	}
	claimed := map[string]int64{}
	for _, id := range []string{"dead", "elsewhere"} {
		if _, err := b.Submit(ctx, broker.SubmitRequest{Topic: "q", Task: "t"}); err != nil {
			t.Fatal(err)
		}
		ms, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: id, Topics: []string{"q"}, Max: 1})
		if err != nil || len(ms) != 1 {
			t.Fatalf("claim for %s: %v, %v", id, ms, err)
		}
		claimed[id] = ms[0].ID
	}
	const heartbeat = 200 * time.Millisecond
	hbCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for hbCtx.Err() == nil {
			_ = b.Heartbeat(hbCtx, "self")
			_ = b.Heartbeat(hbCtx, "elsewhere")
			time.Sleep(heartbeat / 4)
		}
	}()
	// "dead" stopped heartbeating a while ago.
	time.Sleep(2*heartbeat + 50*time.Millisecond)

	s := reaper.DefaultSettings()
	s.Grace = 0
	rp := reaper.New(b, "self", s, hclog.NewNullLogger(), reaper.NewMetrics(prometheus.NewRegistry()))
	reclaimDeadNeighbours(ctx, b, rp, "self", 0, heartbeat, hclog.NewNullLogger())

	live, err := b.LiveWorkers(ctx, 2*heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(live, "elsewhere") || slices.Contains(live, "dead") {
		t.Errorf("live workers after the fast path: %v; want elsewhere in, dead out", live)
	}
	if m, err := b.GetMessage(ctx, claimed["dead"]); err != nil || m.State != broker.StateQueued {
		t.Errorf("the dead worker's message: %+v, %v; want it back in the queue", m, err)
	}
	if m, err := b.GetMessage(ctx, claimed["elsewhere"]); err != nil || m.State != broker.StateRunning || m.ClaimedBy != "elsewhere" {
		t.Errorf("the heartbeating worker's message: %+v, %v; want it still running under elsewhere", m, err)
	}
}
