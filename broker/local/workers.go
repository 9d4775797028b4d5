package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// RegisterWorker records w (replacing a worker with the same id); its
// StartedAt and HeartbeatAt are now. Roles and Topics are stored as JSON
// as they are (nil as null), Tasks nil as [].
func (d dialect) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	roles, err := json.Marshal(w.Roles)
	if err != nil {
		return broker.Invalid("roles: %v", err)
	}
	topics, err := json.Marshal(w.Topics)
	if err != nil {
		return broker.Invalid("topics: %v", err)
	}
	tasks := w.Tasks
	if tasks == nil {
		tasks = []string{}
	}
	tasksJSON, err := json.Marshal(tasks)
	if err != nil {
		return broker.Invalid("tasks: %v", err)
	}
	return d.b.write(ctx, "register worker", func(tx *txn, now time.Time) error {
		_, err := tx.Exec(`INSERT INTO tw_workers
			(id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid,
				roles = excluded.roles, topics = excluded.topics, capacity = excluded.capacity,
				tasks = excluded.tasks,
				started_at = CASE WHEN tw_workers.host = excluded.host AND tw_workers.pid = excluded.pid
					THEN tw_workers.started_at ELSE excluded.started_at END,
				heartbeat_at = excluded.heartbeat_at`,
			w.ID, w.Host, w.PID, string(roles), string(topics), w.Capacity, string(tasksJSON), ns(now), ns(now))
		return err
	})
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (d dialect) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	var out []broker.WorkerInfo
	err := d.Read(ctx, "workers", func(c sqlstore.Conn) error {
		running, _, err := countBy(c, `SELECT claimed_by, count(*), NULL FROM tw_messages WHERE state = 'running' GROUP BY claimed_by`)
		if err != nil {
			return err
		}
		rows, err := c.Query(`SELECT id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at
			FROM tw_workers ORDER BY id`)
		out, err = sqlstore.Collect(rows, err, func(r sqlstore.Row) (broker.WorkerInfo, error) {
			var w broker.WorkerInfo
			var roles, topics, tasks string
			if err := r.Scan(&w.ID, &w.Host, &w.PID, &roles, &topics, &w.Capacity, &tasks,
				nsTime{&w.StartedAt}, nsTime{&w.HeartbeatAt}); err != nil {
				return w, err
			}
			if err := unmarshalWorker(&w, roles, topics); err != nil {
				return w, err
			}
			if err := json.Unmarshal([]byte(tasks), &w.Tasks); err != nil {
				return w, fmt.Errorf("worker %q: tasks: %w", w.ID, err)
			}
			w.Running = running[w.ID]
			return w, nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func unmarshalWorker(w *broker.WorkerInfo, roles, topics string) error {
	if err := json.Unmarshal([]byte(roles), &w.Roles); err != nil {
		return fmt.Errorf("worker %q: roles: %w", w.ID, err)
	}
	if err := json.Unmarshal([]byte(topics), &w.Topics); err != nil {
		return fmt.Errorf("worker %q: topics: %w", w.ID, err)
	}
	return nil
}

// countBy runs q, which selects (key, count, min or NULL) rows, and
// returns the counts and the mins by key.
func countBy(c sqlstore.Conn, q string) (map[string]int, map[string]int64, error) {
	type count struct {
		key string
		n   int
		lo  sql.NullInt64
	}
	rows, err := c.Query(q)
	counts, err := sqlstore.Collect(rows, err, func(r sqlstore.Row) (count, error) {
		var v count
		err := r.Scan(&v.key, &v.n, &v.lo)
		return v, err
	})
	if err != nil {
		return nil, nil, err
	}
	byKey, mins := map[string]int{}, map[string]int64{}
	for _, v := range counts {
		byKey[v.key] = v.n
		if v.lo.Valid {
			mins[v.key] = v.lo.Int64
		}
	}
	return byKey, mins, nil
}
