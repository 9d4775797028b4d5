package local

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskhost/taskhost/broker"
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
	out := []broker.WorkerInfo{}
	err := d.b.read(ctx, "workers", func(tx *txn, _ time.Time) error {
		out = out[:0]
		running := map[string]int{}
		if err := countBy(tx, running, nil,
			`SELECT claimed_by, count(*), 0 FROM tw_messages WHERE state = 'running' GROUP BY claimed_by`); err != nil {
			return err
		}
		rows, err := tx.Query(`SELECT id, host, pid, roles, topics, capacity, tasks, started_at, heartbeat_at
			FROM tw_workers ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var w broker.WorkerInfo
			var roles, topics, tasks string
			var started, heartbeat int64
			if err := rows.Scan(&w.ID, &w.Host, &w.PID, &roles, &topics, &w.Capacity, &tasks, &started, &heartbeat); err != nil {
				return err
			}
			if err := unmarshalWorker(&w, roles, topics); err != nil {
				return err
			}
			if err := json.Unmarshal([]byte(tasks), &w.Tasks); err != nil {
				return fmt.Errorf("worker %q: tasks: %w", w.ID, err)
			}
			w.StartedAt = fromNS(started)
			w.HeartbeatAt = fromNS(heartbeat)
			w.Running = running[w.ID]
			out = append(out, w)
		}
		return rows.Err()
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

// countBy runs q, which selects (key, count, min) rows, into counts and,
// when mins is not nil, mins.
func countBy(tx *txn, counts map[string]int, mins map[string]int64, q string, args ...any) error {
	rows, err := tx.Query(q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var n int
		var lo sql.NullInt64
		if err := rows.Scan(&key, &n, &lo); err != nil {
			return err
		}
		counts[key] = n
		if mins != nil && lo.Valid {
			mins[key] = lo.Int64
		}
	}
	return rows.Err()
}
