package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

func TestHeartbeatRegistersAgainWhenTheRowIsGone(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	p := startPool(t, b, reg, Options{HeartbeatInterval: 10 * time.Millisecond, Roles: []string{broker.RoleWorker, broker.RoleBeat}, Topics: []string{"extra"}})
	ws, _ := b.Workers(context.Background())
	if len(ws) != 1 || ws[0].ID != p.WorkerID() || ws[0].Capacity != 8 || !ws[0].HasRole(broker.RoleBeat) {
		t.Fatalf("workers = %+v", ws)
	}
	if got := strings.Join(ws[0].Topics, ","); got != "default,extra" {
		t.Errorf("topics = %s, want default,extra", got)
	}
	if err := b.UnregisterWorker(context.Background(), p.WorkerID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker to register again", func() bool {
		ws, _ := b.Workers(context.Background())
		return len(ws) == 1
	})
}

// refusedHeartbeats is a broker whose heartbeats fail while refuse is set.
type refusedHeartbeats struct {
	broker.Broker
	refuse atomic.Bool
}

func (b *refusedHeartbeats) Heartbeat(ctx context.Context, id string) error {
	if b.refuse.Load() {
		return errors.New("database or disk is full")
	}
	return b.Broker.Heartbeat(ctx, id)
}

// TestLastHeartbeatSaysWhenWritesFail: LastHeartbeat gives the time of the
// last heartbeat that went through and the error of the latest one, so
// the plugin can say the worker is degraded while reads still work.
func TestLastHeartbeatSaysWhenWritesFail(t *testing.T) {
	b := &refusedHeartbeats{Broker: memory.New()}
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	p := startPool(t, b, reg, Options{HeartbeatInterval: 20 * time.Millisecond})
	waitFor := func(what string, ok func(time.Time, error) bool) (time.Time, error) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			at, err := p.LastHeartbeat()
			if ok(at, err) {
				return at, err
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: LastHeartbeat = %s, %v", what, at, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	started := time.Now()
	waitFor("a heartbeat after start", func(at time.Time, err error) bool { return err == nil && at.After(started) })
	b.refuse.Store(true)
	failedAt, _ := waitFor("a refused heartbeat", func(_ time.Time, err error) bool { return err != nil })
	if at, err := p.LastHeartbeat(); !strings.Contains(fmt.Sprint(err), "disk is full") || !at.Equal(failedAt) {
		t.Fatalf("after a refusal: %s, %v; want the last success kept and the error", at, err)
	}
	time.Sleep(100 * time.Millisecond)
	if at, _ := p.LastHeartbeat(); !at.Equal(failedAt) {
		t.Fatalf("the last success moved to %s while every heartbeat failed", at)
	}
	b.refuse.Store(false)
	waitFor("a heartbeat once writes go through again", func(at time.Time, err error) bool { return err == nil && at.After(failedAt) })
}

// TestTaskOfANewTopicRegisteredLaterRuns: a task registered after Start
// (another plugin's, found later) on a topic the pool did not claim from
// runs: the heartbeat adds its topic, creates it in the broker and
// registers the worker with it.
func TestTaskOfANewTopicRegisteredLaterRuns(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	p := startPool(t, b, reg, Options{HeartbeatInterval: 20 * time.Millisecond})
	if got := strings.Join(p.Topics(), ","); got != "default" {
		t.Fatalf("topics at start = %s, want default", got)
	}
	reg.MustRegister(Task{Name: "late", Topic: "images", Handler: func(context.Context, *TaskContext) (any, error) { return "ran", nil }})
	id, err := b.Submit(context.Background(), broker.SubmitRequest{Topic: "images", Task: "late"})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, b, id, broker.StateDone)
	if got := strings.Join(p.Topics(), ","); got != "default,images" {
		t.Errorf("topics after the late task = %s, want default,images", got)
	}
	eventually(t, "the worker registered with the new topic", func() bool {
		ws, _ := b.Workers(context.Background())
		return len(ws) == 1 && strings.Join(ws[0].Topics, ",") == "default,images"
	})
}
