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
// payload is stored as {}. A request with a unique key runs in a
// transaction of its own (unique.go); a duplicate returns the holder's id
// and a *broker.DuplicateError.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, b.maxPayload); err != nil {
		return 0, err
	}
	if req.UniqueKey != "" {
		out, err := b.SubmitBatch(ctx, []broker.SubmitRequest{req})
		if err != nil {
			return 0, err
		}
		if out[0].Duplicate {
			return out[0].ID, &broker.DuplicateError{ID: out[0].ID, Key: req.UniqueKey}
		}
		return out[0].ID, nil
	}
	var id int64
	err := b.run(ctx, "submit", func(c *pgx.Conn) error {
		var err error
		id, err = b.ins.insert(ctx, c, req)
		return err
	})
	if err != nil {
		return 0, outcomeOf(err)
	}
	b.announce.add([]broker.SubmitRequest{req})
	b.stats.wrote(1)
	return id, nil
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// SubmitMany validates every request, then queues them all in one
// transaction and returns their ids in the order of reqs (see
// broker.BatchSubmitter). Each message is stored as Submit stores it.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	out, err := b.SubmitBatch(ctx, reqs)
	return broker.IDs(out), err
}

// SubmitBatch is SubmitMany saying which requests were duplicates. A batch
// with unique keys runs in an explicit transaction (unique.go).
func (b *Broker) SubmitBatch(ctx context.Context, reqs []broker.SubmitRequest) ([]broker.Submitted, error) {
	if err := broker.ValidateSubmitMany(reqs, b.maxPayload); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		if b.closed.Load() {
			return nil, broker.ErrClosed
		}
		return []broker.Submitted{}, ctx.Err()
	}
	var out []broker.Submitted
	var err error
	if broker.HasUniqueKey(reqs) {
		err = b.run(ctx, "submit many", func(c *pgx.Conn) error {
			return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
				var err error
				out, err = b.ins.insertBatch(ctx, tx, reqs)
				return err
			})
		})
	} else {
		var rows *manyArgs
		if rows, err = manyRows(reqs); err != nil {
			return nil, err
		}
		err = b.run(ctx, "submit many", func(c *pgx.Conn) error {
			ids, err := b.ins.insertMany(ctx, c, rows)
			out = make([]broker.Submitted, len(ids))
			for i, id := range ids {
				out[i].ID = id
			}
			return err
		})
	}
	if err != nil {
		return nil, outcomeOf(err)
	}
	if s := stored(reqs, out); len(s) > 0 {
		b.announce.add(s)
		b.stats.wrote(len(s))
	}
	return out, nil
}

// InsertMessage queues the validated req in c's transaction, as Submit
// does, and returns its id (the holder's, with a *broker.DuplicateError,
// for a duplicate). A schedule's fire is rare: it announces its message in
// the same transaction.
func (d dialect) InsertMessage(c sqlstore.Conn, req broker.SubmitRequest) (int64, error) {
	cn := c.(conn)
	q, ok := cn.q.(Querier)
	if !ok {
		return 0, errNotQuerier
	}
	var id int64
	var err error
	if req.UniqueKey != "" {
		var s broker.Submitted
		if s, err = d.b.ins.insertKeyed(cn.ctx, q, req); err == nil && s.Duplicate {
			return s.ID, &broker.DuplicateError{ID: s.ID, Key: req.UniqueKey}
		}
		id = s.ID
	} else {
		id, err = d.b.ins.insert(cn.ctx, q, req)
	}
	if err != nil {
		return 0, err
	}
	return id, d.b.ins.Notify(cn.ctx, q, []broker.SubmitRequest{req})
}
