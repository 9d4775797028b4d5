package memory

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Stats counts per topic and overall; see broker.Stats. Workers, Beats and
// Subscribers count live workers only (heartbeat within LiveAfter).
func (b *Broker) Stats(ctx context.Context) (broker.Stats, error) {
	if err := b.begin(ctx); err != nil {
		return broker.Stats{}, err
	}
	defer b.mu.Unlock()

	now := b.now()
	var live []*broker.WorkerInfo
	for _, w := range b.workers {
		if now.Sub(w.HeartbeatAt) <= b.liveAfter() {
			live = append(live, w)
		}
	}
	oldest := make(map[string]time.Time)
	for _, e := range b.running {
		if o, ok := oldest[e.m.Topic]; !ok || e.m.ClaimedAt.Before(o) {
			oldest[e.m.Topic] = *e.m.ClaimedAt
		}
	}

	st := broker.Stats{Topics: make([]broker.TopicStats, 0, len(b.topics)), Locks: len(b.locks)}
	for _, cfg := range b.topics {
		ts := broker.TopicStats{
			TopicConfig: *cfg,
			Queued:      len(b.queues[cfg.Name]),
			Running:     b.runningBy[cfg.Name],
			DeadLetter:  b.deadBy[cfg.Name],
		}
		if o, ok := oldest[cfg.Name]; ok {
			ts.OldestClaimAge = max(now.Sub(o), 0)
		}
		for _, w := range live {
			if slices.Contains(w.Topics, cfg.Name) || slices.Contains(w.Topics, "*") {
				ts.Subscribers++
			}
		}
		st.Topics = append(st.Topics, ts)
	}
	sort.Slice(st.Topics, func(i, j int) bool { return st.Topics[i].Name < st.Topics[j].Name })
	st.Workers = len(live)
	for _, w := range live {
		if w.HasRole(broker.RoleBeat) {
			st.Beats++
		}
	}
	return st, nil
}
