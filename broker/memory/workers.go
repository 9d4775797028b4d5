package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/taskhost/taskhost/broker"
)

// RegisterWorker records w (replacing a worker with the same id); its
// StartedAt and HeartbeatAt are now.
func (b *Broker) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	if w.ID == "" {
		return broker.Invalid("worker id is empty")
	}
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	now := b.now()
	w.Roles = slices.Clone(w.Roles)
	w.Topics = slices.Clone(w.Topics)
	w.Tasks = slices.Clone(w.Tasks)
	if w.Tasks == nil {
		w.Tasks = []string{}
	}
	w.StartedAt = now
	if old, ok := b.workers[w.ID]; ok && old.Host == w.Host && old.PID == w.PID {
		w.StartedAt = old.StartedAt // the same process, registering again
	}
	w.HeartbeatAt = now
	w.Running = 0
	b.workers[w.ID] = &w
	return nil
}

// Heartbeat stamps the worker's HeartbeatAt; broker.ErrNotFound when it is
// not registered.
func (b *Broker) Heartbeat(ctx context.Context, workerID string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	w := b.workers[workerID]
	if w == nil {
		return fmt.Errorf("worker %q: %w", workerID, broker.ErrNotFound)
	}
	w.HeartbeatAt = b.now()
	return nil
}

// UnregisterWorker forgets the worker; an unknown id is not an error.
func (b *Broker) UnregisterWorker(ctx context.Context, workerID string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	delete(b.workers, workerID)
	return nil
}

// RunningClaims returns the claims of the messages running under
// workerID, by message id.
func (b *Broker) RunningClaims(ctx context.Context, workerID string) ([]broker.Claim, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := []broker.Claim{}
	for _, e := range b.running {
		if e.m.ClaimedBy == workerID {
			out = append(out, e.m.ClaimOf())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (b *Broker) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	running := make(map[string]int)
	for _, e := range b.running {
		running[e.m.ClaimedBy]++
	}
	out := make([]broker.WorkerInfo, 0, len(b.workers))
	for _, w := range b.workers {
		c := *w
		c.Roles = slices.Clone(w.Roles)
		c.Topics = slices.Clone(w.Topics)
		c.Tasks = slices.Clone(w.Tasks)
		c.Running = running[w.ID]
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
