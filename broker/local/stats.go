package local

import (
	"context"
	"slices"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/sqlstore"
)

// Stats counts per topic and overall from one snapshot; see broker.Stats.
// Its cost follows the topics, the running messages and the live workers,
// never the queue: the queued and dead counts are read from
// tw_topic_counts, which triggers keep with every write of tw_messages
// (migration 0016); running ones are counted through the state index.
// Workers, Beats and Subscribers count live workers only (heartbeat within
// LiveAfter).
func (d dialect) Stats(ctx context.Context) (broker.Stats, error) {
	var st broker.Stats
	err := d.b.read(ctx, "stats", func(tx *txn, now time.Time) error {
		c := &conn{tx: tx, now: now}
		rows, err := c.Query(queries.Topics)
		cfgs, err := sqlstore.Collect(rows, err, sqlstore.ScanTopic)
		if err != nil {
			return err
		}
		queued, _, err := countBy(c, `SELECT topic, queued, NULL FROM tw_topic_counts`)
		if err != nil {
			return err
		}
		running, oldest, err := countBy(c, `SELECT topic, count(*), min(claimed_at) FROM tw_messages WHERE state = 'running' GROUP BY topic`)
		if err != nil {
			return err
		}
		dead, _, err := countBy(c, `SELECT topic, dead, NULL FROM tw_topic_counts`)
		if err != nil {
			return err
		}
		rows, err = c.Query(`SELECT id, roles, topics FROM tw_workers WHERE heartbeat_at >= ?`, sqlstore.Ago(d.b.opts.LiveAfter))
		live, err := sqlstore.Collect(rows, err, func(r sqlstore.Row) (broker.WorkerInfo, error) {
			var w broker.WorkerInfo
			var roles, topics string
			if err := r.Scan(&w.ID, &roles, &topics); err != nil {
				return w, err
			}
			return w, unmarshalWorker(&w, roles, topics)
		})
		if err != nil {
			return err
		}

		st = broker.Stats{Topics: make([]broker.TopicStats, 0, len(cfgs)), Workers: len(live)}
		if err := c.QueryRow(`SELECT count(*) FROM tw_locks`).Scan(&st.Locks); err != nil {
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
