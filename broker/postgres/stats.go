package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// Stats counts per topic and overall in one round trip, in one snapshot,
// at a cost that follows the topics, the running messages and the live
// workers, never the queue: the queued and dead counts are the sums of the
// topic's rows of tw_topic_counts, which triggers keep with every write of
// tw_messages (migration 025), less the messages claim rows hold (they
// stay queued rows while they run); running is the rows made running the
// old way plus the held ones, each through an index of running rows alone.
// Workers, Beats and Subscribers count live workers only (heartbeat
// fresher than LiveAfter, by database time).
func (d dialect) Stats(ctx context.Context) (broker.Stats, error) {
	var st broker.Stats
	err := d.b.run(ctx, "stats", func(c *pgx.Conn) error {
		st = broker.Stats{Topics: []broker.TopicStats{}}
		live := micros(d.b.liveAfter)
		batch := &pgx.Batch{}
		batch.Queue(`
			SELECT
				(SELECT count(*) FROM tw_workers
					WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond'),
				(SELECT count(*) FROM tw_workers
					WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond' AND 'beat' = ANY (roles)),
				(SELECT count(*) FROM tw_locks)`, live)
		batch.Queue(`
			WITH live AS (
				SELECT topics FROM tw_workers WHERE heartbeat_at > now() - $1::bigint * interval '1 microsecond'
			)
			SELECT t.name, t.concurrency_limit, t.dead_letter_enabled, t.paused,
				k.queued - r.held,
				r.n,
				r.age_us,
				k.dead,
				(SELECT count(*) FROM live w WHERE t.name = ANY (w.topics) OR '*' = ANY (w.topics))
			FROM tw_topics t
			CROSS JOIN LATERAL (
				SELECT coalesce(sum(k.queued), 0)::bigint AS queued, coalesce(sum(k.dead), 0)::bigint AS dead
				FROM tw_topic_counts k WHERE k.topic = t.name
			) k
			CROSS JOIN `+topicRunning("t.name")+` r
			ORDER BY t.name`, live)
		br := c.SendBatch(ctx, batch)
		if err := br.QueryRow().Scan(&st.Workers, &st.Beats, &st.Locks); err != nil {
			br.Close()
			return err
		}
		rows, err := br.Query()
		if err != nil {
			br.Close()
			return err
		}
		for rows.Next() {
			var (
				ts    broker.TopicStats
				ageUS int64
			)
			if err := rows.Scan(&ts.Name, &ts.ConcurrencyLimit, &ts.DeadLetterEnabled, &ts.Paused,
				&ts.Queued, &ts.Running, &ageUS, &ts.DeadLetter, &ts.Subscribers); err != nil {
				rows.Close()
				br.Close()
				return err
			}
			ts.OldestClaimAge = time.Duration(ageUS) * time.Microsecond
			st.Topics = append(st.Topics, ts)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	if err != nil {
		return broker.Stats{}, err
	}
	return st, nil
}
