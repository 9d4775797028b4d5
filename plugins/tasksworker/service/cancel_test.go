package service

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

// TestCancelHooks: a queued task's cancel is counted under its topic, a
// running one's calls OnCancelRequested with its id, a finished one's
// neither; CancelQueued without a topic counts each topic's under it.
func TestCancelHooks(t *testing.T) {
	ctx := context.Background()
	b := memory.New()
	t.Cleanup(func() { _ = b.Close() })
	var (
		mu        sync.Mutex
		counted   = map[string]int{}
		requested []int64
	)
	s := New(Deps{Broker: b,
		Cancelled: func(topic string, n int) {
			mu.Lock()
			defer mu.Unlock()
			counted[topic] += n
		},
		OnCancelRequested: func(id int64) {
			mu.Lock()
			defer mu.Unlock()
			requested = append(requested, id)
		},
	})
	submit := func(topic, task string) int64 {
		t.Helper()
		id, err := b.Submit(ctx, broker.SubmitRequest{Topic: topic, Task: task})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	queued := submit("a", "x")
	if m, err := s.Cancel(ctx, queued); err != nil || m.State != broker.StateCancelled {
		t.Fatalf("Cancel of a queued task = %s, %v", m.State, err)
	}
	running := submit("a", "x")
	if _, err := b.Claim(ctx, broker.ClaimRequest{WorkerID: "w", Topics: []string{"a"}, Max: 1}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Cancel(ctx, running); err != nil || m.State != broker.StateRunning || m.CancelRequestedAt == nil {
		t.Fatalf("Cancel of a running task = %+v, %v", m, err)
	}
	if _, err := s.Cancel(ctx, queued); !errors.Is(err, broker.ErrFinished) {
		t.Fatalf("Cancel of a cancelled task: %v, want ErrFinished", err)
	}

	submit("a", "y")
	submit("b", "y")
	submit("b", "y")
	submit("b", "z")
	if _, err := s.CancelQueued(ctx, broker.CancelFilter{}); !errors.Is(err, broker.ErrInvalid) {
		t.Fatalf("CancelQueued with an empty filter: %v, want ErrInvalid", err)
	}
	if n, err := s.CancelQueued(ctx, broker.CancelFilter{Task: "y"}); err != nil || n != 3 {
		t.Fatalf("CancelQueued(task y) = %d, %v; want 3", n, err)
	}
	if n, err := s.CancelQueued(ctx, broker.CancelFilter{Topic: "b"}); err != nil || n != 1 {
		t.Fatalf("CancelQueued(topic b) = %d, %v; want 1", n, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if counted["a"] != 2 || counted["b"] != 3 || len(counted) != 2 {
		t.Fatalf("counted %v, want a:2 b:3", counted)
	}
	if !slices.Equal(requested, []int64{running}) {
		t.Fatalf("OnCancelRequested got %v, want [%d]", requested, running)
	}
}
