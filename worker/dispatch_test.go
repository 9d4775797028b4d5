package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/memory"
)

func TestWakeClaimsAtOnce(t *testing.T) {
	b := memory.New()
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return nil, nil }})
	p := startPool(t, b, reg, Options{ClaimIdleInterval: time.Hour})
	time.Sleep(20 * time.Millisecond) // the dispatcher is idle now
	id := submit(t, b, "x", `{}`)
	p.Wake()
	begin := time.Now()
	waitState(t, b, id, broker.StateDone)
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("took %s after Wake", took)
	}
}

// flakyBroker fails Claim while down is set.
type flakyBroker struct {
	broker.Broker
	down   atomic.Bool
	claims atomic.Int32
}

func (f *flakyBroker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	f.claims.Add(1)
	if f.down.Load() {
		return nil, errors.New("connection refused")
	}
	return f.Broker.Claim(ctx, req)
}

func TestBrokerErrorsBackOffInsteadOfSpinning(t *testing.T) {
	b := &flakyBroker{Broker: memory.New()}
	b.down.Store(true)
	reg := NewRegistry()
	reg.MustRegister(Task{Name: "x", Handler: func(context.Context, *TaskContext) (any, error) { return "ok", nil }})
	p := startPool(t, b, reg, Options{ClaimIdleInterval: time.Millisecond, Logger: hclog.NewNullLogger()})
	time.Sleep(700 * time.Millisecond)
	// 100ms, 200ms, 400ms (+-20%): at most 5 calls in 700ms.
	if n := b.claims.Load(); n > 5 || n < 2 {
		t.Errorf("%d claims in 700ms against a failing broker", n)
	}
	b.down.Store(false)
	id := submit(t, b, "x", `{}`)
	p.Wake()
	waitState(t, b, id, broker.StateDone)
}
