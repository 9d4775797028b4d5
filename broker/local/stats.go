package local

import (
	"context"
	"slices"
	"time"

	"github.com/taskhost/taskhost/broker"
)

func topicConfigs(tx *txn) ([]broker.TopicConfig, error) {
	rows, err := tx.Query(`SELECT name, concurrency_limit, dead_letter_enabled, paused FROM tw_topics ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []broker.TopicConfig{}
	for rows.Next() {
		var c broker.TopicConfig
		if err := rows.Scan(&c.Name, &c.ConcurrencyLimit, &c.DeadLetterEnabled, &c.Paused); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Stats counts per topic and overall from one snapshot; see broker.Stats.
// Workers, Beats and Subscribers count live workers only (heartbeat within
// LiveAfter).
func (d dialect) Stats(ctx context.Context) (broker.Stats, error) {
	var st broker.Stats
	err := d.b.read(ctx, "stats", func(tx *txn, now time.Time) error {
		cfgs, err := topicConfigs(tx)
		if err != nil {
			return err
		}
		queued, running, dead := map[string]int{}, map[string]int{}, map[string]int{}
		oldest := map[string]int64{}
		if err := countBy(tx, queued, nil,
			`SELECT topic, count(*), 0 FROM tw_messages WHERE state = 'queued' GROUP BY topic`); err != nil {
			return err
		}
		if err := countBy(tx, running, oldest,
			`SELECT topic, count(*), min(claimed_at) FROM tw_messages WHERE state = 'running' GROUP BY topic`); err != nil {
			return err
		}
		if err := countBy(tx, dead, nil,
			`SELECT topic, count(*), 0 FROM tw_messages WHERE state = 'dead' GROUP BY topic`); err != nil {
			return err
		}

		var live []broker.WorkerInfo
		rows, err := tx.Query(`SELECT id, roles, topics FROM tw_workers WHERE heartbeat_at >= ?`,
			addNS(now, -d.b.opts.LiveAfter))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var w broker.WorkerInfo
			var roles, topics string
			if err := rows.Scan(&w.ID, &roles, &topics); err != nil {
				return err
			}
			if err := unmarshalWorker(&w, roles, topics); err != nil {
				return err
			}
			live = append(live, w)
		}
		if err := rows.Err(); err != nil {
			return err
		}

		st = broker.Stats{Topics: make([]broker.TopicStats, 0, len(cfgs)), Workers: len(live)}
		if err := tx.QueryRow(`SELECT count(*) FROM tw_locks`).Scan(&st.Locks); err != nil {
			return err
		}
		for _, cfg := range cfgs {
			ts := broker.TopicStats{
				TopicConfig: cfg,
				Queued:      queued[cfg.Name],
				Running:     running[cfg.Name],
				DeadLetter:  dead[cfg.Name],
			}
			if o, ok := oldest[cfg.Name]; ok {
				ts.OldestClaimAge = max(now.Sub(fromNS(o)), 0)
			}
			for _, w := range live {
				if slices.Contains(w.Topics, cfg.Name) || slices.Contains(w.Topics, "*") {
					ts.Subscribers++
				}
			}
			st.Topics = append(st.Topics, ts)
		}
		for _, w := range live {
			if w.HasRole(broker.RoleBeat) {
				st.Beats++
			}
		}
		return nil
	})
	if err != nil {
		return broker.Stats{}, err
	}
	return st, nil
}
