package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// RegisterWorker records w, replacing a worker with the same id; its
// StartedAt and HeartbeatAt are the broker's now, and a registration again
// from the same host and pid keeps StartedAt.
func (s *Store) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	if w.ID == "" {
		return broker.Invalid("worker id is empty")
	}
	return s.d.RegisterWorker(ctx, w)
}

// Heartbeat stamps the worker's heartbeat with the broker's now;
// broker.ErrNotFound when its row is gone (never registered, unregistered
// or purged): the worker must register again.
func (s *Store) Heartbeat(ctx context.Context, workerID string) error {
	return s.d.Write(ctx, "heartbeat", func(c Conn) error {
		return exactlyOne(c, fmt.Sprintf("worker %q", workerID), s.q.Heartbeat, workerID, Now)
	})
}

// ExpireWorker marks the worker's heartbeat as long past, so it leaves the
// live set at once (its row stays until the store purges silent workers);
// broker.ErrNotFound when it is not registered.
func (s *Store) ExpireWorker(ctx context.Context, workerID string) error {
	return s.d.Write(ctx, "expire worker", func(c Conn) error {
		return exactlyOne(c, fmt.Sprintf("worker %q", workerID), s.q.ExpireWorker, workerID)
	})
}

// UnregisterWorker forgets the worker; an unknown id is not an error.
func (s *Store) UnregisterWorker(ctx context.Context, workerID string) error {
	return s.d.Write(ctx, "unregister worker", func(c Conn) error {
		_, err := c.Exec(s.q.UnregisterWorker, workerID)
		return err
	})
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (s *Store) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	return s.d.Workers(ctx)
}

// RunningClaims returns the claims of the messages running under
// workerID, by message id.
func (s *Store) RunningClaims(ctx context.Context, workerID string) ([]broker.Claim, error) {
	return list(ctx, s, "running claims", func(r Row) (broker.Claim, error) {
		var cl broker.Claim
		err := r.Scan(&cl.ID, &cl.Token)
		return cl, err
	}, s.q.RunningClaims, workerID)
}

// LiveWorkers returns, by id, the workers whose heartbeat is fresher than
// after by the broker's clock.
func (s *Store) LiveWorkers(ctx context.Context, after time.Duration) ([]string, error) {
	if after < 0 {
		return nil, broker.Invalid("liveness window is negative")
	}
	return list(ctx, s, "live workers", func(r Row) (string, error) {
		var id string
		err := r.Scan(&id)
		return id, err
	}, s.q.LiveWorkers, Ago(after))
}

// Stats counts per topic and overall from one snapshot; see broker.Stats.
// Workers, Beats and Subscribers count live workers only.
func (s *Store) Stats(ctx context.Context) (broker.Stats, error) {
	return s.d.Stats(ctx)
}
