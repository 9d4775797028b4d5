package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// RegisterWorker records w, replacing a worker with the same id; its
// StartedAt and HeartbeatAt are the database's now(). In the same
// transaction it purges the rows of workers whose heartbeat is older than
// Options.WorkerTTL (bookkeeping: liveness is LiveAfter).
func (d dialect) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	roles, topics, tasks := w.Roles, w.Topics, w.Tasks
	if roles == nil {
		roles = []string{}
	}
	if topics == nil {
		topics = []string{}
	}
	if tasks == nil {
		tasks = []string{}
	}
	return d.b.run(ctx, "register worker", func(c *pgx.Conn) error {
		batch := &pgx.Batch{}
		batch.Queue(`
			INSERT INTO tw_workers (id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now())
			ON CONFLICT (id) DO UPDATE SET
				host = excluded.host, pid = excluded.pid, roles = excluded.roles, topics = excluded.topics,
				capacity = excluded.capacity, tasks = excluded.tasks,
				started_at = CASE WHEN tw_workers.host = excluded.host AND tw_workers.pid = excluded.pid
					THEN tw_workers.started_at ELSE now() END,
				heartbeat_at = now()`,
			w.ID, w.Host, w.PID, roles, topics, w.Capacity, tasks)
		batch.Queue(`DELETE FROM tw_workers WHERE heartbeat_at < now() - $1::bigint * interval '1 microsecond' AND id <> $2`,
			micros(d.b.workerTTL), w.ID)
		return c.SendBatch(ctx, batch).Close()
	})
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (d dialect) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	var out []broker.WorkerInfo
	err := d.Read(ctx, "workers", func(c sqlstore.Conn) error {
		rows, err := c.Query(`
			SELECT w.id, w.host, w.pid, w.roles, w.topics, w.capacity, w.tasks, w.started_at, w.heartbeat_at,
				` + workerRunning("w.id") + `
			FROM tw_workers w
			ORDER BY w.id`)
		out, err = sqlstore.Collect(rows, err, func(r sqlstore.Row) (broker.WorkerInfo, error) {
			var w broker.WorkerInfo
			err := r.Scan(&w.ID, &w.Host, &w.PID, &w.Roles, &w.Topics, &w.Capacity, &w.Tasks,
				&w.StartedAt, &w.HeartbeatAt, &w.Running)
			return w, err
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
