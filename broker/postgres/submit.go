package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Submit validates req and queues it, creating the topic's row (unlimited,
// dead-lettering, not paused) when it is missing, and, once it is
// committed, announces it to the worker pools (announce.go). An empty
// payload is stored as {}.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, b.maxPayload); err != nil {
		return 0, err
	}
	var id int64
	err := b.run(ctx, "submit", func(c *pgx.Conn) error {
		var err error
		id, err = b.ins.insert(ctx, c, req)
		return err
	})
	if err == nil {
		b.announce.add([]broker.SubmitRequest{req})
	}
	return id, err
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// SubmitMany validates every request, then queues them all in one
// transaction and returns their ids in the order of reqs (see
// broker.BatchSubmitter). Each message is stored as Submit stores it.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	if err := broker.ValidateSubmitMany(reqs, b.maxPayload); err != nil {
		return nil, err
	}
	rows, err := manyRows(reqs)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		if b.closed.Load() {
			return nil, broker.ErrClosed
		}
		return []int64{}, ctx.Err()
	}
	var ids []int64
	err = b.run(ctx, "submit many", func(c *pgx.Conn) error {
		var err error
		ids, err = b.ins.insertMany(ctx, c, rows)
		return err
	})
	if err != nil {
		return nil, err
	}
	b.announce.add(reqs)
	return ids, nil
}

// InsertMessage queues the validated req in c's transaction, as Submit
// does, and returns its id. A schedule's fire is rare: it announces its
// message in the same transaction.
func (d dialect) InsertMessage(c sqlstore.Conn, req broker.SubmitRequest) (int64, error) {
	payload, headers, err := submitFields(req)
	if err != nil {
		return 0, err
	}
	var id, n int64
	err = c.QueryRow(d.b.ins.one,
		req.Topic, req.Task, payload, headers, req.MaxAttempts, micros(req.Delay)).Scan(&id)
	if err != nil {
		return 0, err
	}
	if err := c.QueryRow(d.b.ins.notify, payloads([]broker.SubmitRequest{req})).Scan(&n); err != nil {
		return 0, err
	}
	return id, nil
}
