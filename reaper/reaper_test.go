package reaper

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// fakeReclaimer is a broker with a scripted OrphanReclaimer side, to drive
// each guard. The SQL brokers' own tests cover the real reclaim.
type fakeReclaimer struct {
	broker.Broker
	live     []string
	liveErr  error
	err      error // from ReclaimOrphans
	result   broker.ReclaimResult
	reclaims int
	got      broker.ReclaimRequest
}

func (f *fakeReclaimer) LiveWorkers(context.Context, time.Duration) ([]string, error) {
	return f.live, f.liveErr
}

func (f *fakeReclaimer) ReclaimOrphans(_ context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	f.reclaims++
	f.got = req
	if f.err != nil {
		return broker.ReclaimResult{}, f.err
	}
	return f.result, nil
}

func (f *fakeReclaimer) ExpireWorker(context.Context, string) error { return nil }

func (f *fakeReclaimer) ReclaimDead(_ context.Context, req broker.ReclaimRequest) (broker.ReclaimResult, error) {
	f.reclaims++
	f.got = req
	if f.err != nil {
		return broker.ReclaimResult{}, f.err
	}
	return f.result, nil
}

func newReaper(t *testing.T, f *fakeReclaimer) (*Reaper, *Metrics, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	m := NewMetrics(prometheus.NewRegistry())
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	return New(f, "me", DefaultSettings(), log, m), m, &logs
}

func TestGuardsRefuseAndCount(t *testing.T) {
	tests := []struct {
		name  string
		fake  fakeReclaimer
		guard Guard
	}{
		{"unreadable live set reclaims nothing", fakeReclaimer{liveErr: errors.New("connection refused")}, GuardLiveSetUnreadable},
		{"empty live set reclaims nothing", fakeReclaimer{live: nil}, GuardLiveSetEmpty},
		{"caller not in live set reclaims nothing", fakeReclaimer{live: []string{"other"}}, GuardCallerNotLive},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake
			f.Broker = memory.New()
			r, m, logs := newReaper(t, &f)
			res := r.Pass(context.Background())
			if res.Skipped != tt.guard || res.Reason == "" {
				t.Fatalf("result = %+v, want skipped by %s with a reason", res, tt.guard)
			}
			if f.reclaims != 0 {
				t.Fatal("a guard refused, yet ReclaimOrphans ran")
			}
			if got := testutil.ToFloat64(m.Skipped); got != 1 {
				t.Fatalf("skipped counter = %v, want 1", got)
			}
			if !strings.Contains(logs.String(), "[ERROR]") || !strings.Contains(logs.String(), string(tt.guard)) {
				t.Fatalf("no ERROR line naming the guard: %s", logs.String())
			}
		})
	}
}

// TestFailedReclaimIsCountedUnderItsOwnName: a reclaim transaction that
// fails changes nothing and counts as a skip, and its ERROR line says the
// transaction failed, not that the live-worker set could not be read.
func TestFailedReclaimIsCountedUnderItsOwnName(t *testing.T) {
	f := &fakeReclaimer{Broker: memory.New(), live: []string{"me"}, err: errors.New("deadlock detected")}
	r, m, logs := newReaper(t, f)
	res := r.Pass(context.Background())
	if res.Skipped != GuardReclaimFailed || !strings.Contains(res.Reason, "deadlock detected") {
		t.Fatalf("result = %+v, want skipped by %s naming the error", res, GuardReclaimFailed)
	}
	if got := testutil.ToFloat64(m.Skipped); got != 1 {
		t.Fatalf("skipped counter = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "[ERROR]") || !strings.Contains(logs.String(), "guard=reclaim_failed") || strings.Contains(logs.String(), string(GuardLiveSetUnreadable)) {
		t.Fatalf("want one ERROR line naming reclaim_failed: %s", logs.String())
	}
}

func TestPassReclaimsAndCounts(t *testing.T) {
	f := &fakeReclaimer{Broker: memory.New(), live: []string{"a", "me"},
		result: broker.ReclaimResult{Reclaimed: 3, DeadLettered: 1, LocksReleased: 2}}
	r, m, _ := newReaper(t, f)
	res := r.Pass(context.Background())
	if res.Skipped != "" || res.Reclaimed != 3 || res.DeadLettered != 1 || res.LocksReleased != 2 {
		t.Fatalf("result = %+v", res)
	}
	if f.got.Grace != 60*time.Second || f.got.MaxAttempts != 5 || len(f.got.Live) != 2 {
		t.Fatalf("request = %+v", f.got)
	}
	if testutil.ToFloat64(m.Reclaimed) != 3 || testutil.ToFloat64(m.DeadLettered) != 1 || testutil.ToFloat64(m.Skipped) != 0 {
		t.Fatal("counters do not match the result")
	}
	if !strings.Contains(res.Summary(), "reclaimed 3, dead-lettered 1, released 2 lock(s)") {
		t.Fatalf("summary = %q", res.Summary())
	}
}

func TestOrphansWithinGraceAreLeftAndCounted(t *testing.T) {
	f := &fakeReclaimer{Broker: memory.New(), live: []string{"me"}, result: broker.ReclaimResult{WithinGrace: 2}}
	r, m, logs := newReaper(t, f)
	res := r.Pass(context.Background())
	if res.Reclaimed != 0 || res.WithinGrace != 2 {
		t.Fatalf("result = %+v", res)
	}
	if testutil.ToFloat64(m.Skipped) != 1 || !strings.Contains(logs.String(), string(GuardWithinGrace)) {
		t.Fatal("the grace guard's refusal was not logged and counted")
	}
}

// TestReclaimDeadAsksNoLiveSetAndNoGrace: the workers are named dead, so
// neither a broken live set (which would refuse a pass) nor the grace
// stands in the way; the orphan budget still applies, and the counters
// are the pass's, with no skip.
func TestReclaimDeadAsksNoLiveSetAndNoGrace(t *testing.T) {
	f := &fakeReclaimer{Broker: memory.New(), liveErr: errors.New("connection refused"),
		result: broker.ReclaimResult{Reclaimed: 2, DeadLettered: 1, Cancelled: 1, LocksReleased: 1}}
	r, m, logs := newReaper(t, f)
	res, err := r.ReclaimDead(context.Background(), []string{"gone"})
	if err != nil || res.Skipped != "" || res.Reclaimed != 2 || res.DeadLettered != 1 || res.LocksReleased != 1 {
		t.Fatalf("result = %+v, %v", res, err)
	}
	if f.reclaims != 1 || len(f.got.Dead) != 1 || f.got.Dead[0] != "gone" || f.got.Live != nil || f.got.Grace != 0 || f.got.MaxAttempts != 5 || f.got.Fence != nil {
		t.Fatalf("request = %+v, want the dead worker named, no live set, no grace, max attempts 5, no fence", f.got)
	}
	if testutil.ToFloat64(m.Reclaimed) != 2 || testutil.ToFloat64(m.DeadLettered) != 1 || testutil.ToFloat64(m.Skipped) != 0 {
		t.Fatal("counters do not match the result")
	}
	if !strings.Contains(logs.String(), "reclaimed the work of dead workers") || strings.Contains(logs.String(), "[ERROR]") {
		t.Fatalf("want a line saying what was reclaimed, no ERROR: %s", logs.String())
	}

	// A failed reclaim changes nothing and is no skip: no guard refused.
	f.err = errors.New("deadlock detected")
	if _, err := r.ReclaimDead(context.Background(), []string{"gone"}); err == nil || !strings.Contains(err.Error(), "deadlock detected") {
		t.Fatalf("failed reclaim: %v, want the error", err)
	}
	if testutil.ToFloat64(m.Skipped) != 0 {
		t.Fatal("a failed reclaim of dead workers counted a skip")
	}
	// A broker that cannot reclaim by worker says so.
	if _, err := New(memory.New(), "me", DefaultSettings(), nil, nil).ReclaimDead(context.Background(), []string{"gone"}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("memory broker: %v, want ErrUnsupported", err)
	}
}

func TestMemoryBrokerIsUnsupported(t *testing.T) {
	r := New(memory.New(), "me", DefaultSettings(), nil, nil)
	res := r.Pass(context.Background())
	if !res.Unsupported || !strings.Contains(res.Reason, "memory broker cannot orphan") {
		t.Fatalf("result = %+v", res)
	}
}

func TestValidate(t *testing.T) {
	hb := 5 * time.Second
	if err := DefaultSettings().Validate(hb); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	bad := map[string]func(*Settings){
		"orphan_reclaim_interval_seconds": func(s *Settings) { s.Interval = -time.Second },
		"at least two heartbeat":          func(s *Settings) { s.After = 9 * time.Second },
		"orphan_claim_grace_seconds":      func(s *Settings) { s.Grace = -1 },
		"orphan_max_attempts":             func(s *Settings) { s.MaxAttempts = 0 },
		"postgres_worker_ttl_seconds":     func(s *Settings) { s.WorkerTTL = time.Second },
	}
	for want, mutate := range bad {
		s := DefaultSettings()
		mutate(&s)
		if err := s.Validate(hb); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want an error mentioning %q", err, want)
		}
	}
}
