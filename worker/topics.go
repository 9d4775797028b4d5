package worker

import (
	"slices"
	"sync/atomic"
)

// topicSet is the topics a pool claims from, sorted: Options.Topics and
// the topic of every registered task, set by Start and widened by the
// heartbeat when tasks are registered later (refreshTopics).
// A topic is never dropped: its messages still need this worker.
type topicSet struct {
	reg   *Registry
	extra []string // Options.Topics
	cur   atomic.Pointer[[]string]
}

// claim is the topics to claim from now; the caller must not change the
// slice.
func (ts *topicSet) claim() []string {
	if t := ts.cur.Load(); t != nil {
		return *t
	}
	return nil
}

// list is a copy of claim, for callers outside the package.
func (ts *topicSet) list() []string { return append([]string(nil), ts.claim()...) }

// ours reports whether the pool claims from topic.
func (ts *topicSet) ours(topic string) bool {
	_, ok := slices.BinarySearch(ts.claim(), topic)
	return ok
}

// wanted is Options.Topics and the topic of every registered task, sorted.
func (ts *topicSet) wanted() []string {
	topics := map[string]bool{}
	for _, t := range ts.reg.Topics() {
		topics[t] = true
	}
	for _, t := range ts.extra {
		topics[t] = true
	}
	return sortedKeys(topics)
}

// added is the wanted topics not claimed from yet.
func (ts *topicSet) added() []string {
	old := ts.claim()
	var added []string
	for _, t := range ts.wanted() {
		if _, has := slices.BinarySearch(old, t); !has {
			added = append(added, t)
		}
	}
	return added
}

// set makes topics, sorted, the ones to claim from.
func (ts *topicSet) set(topics []string) { ts.cur.Store(&topics) }

// widen adds topics to those claimed from and returns the whole set.
func (ts *topicSet) widen(topics []string) []string {
	all := slices.Sorted(slices.Values(append(slices.Clone(ts.claim()), topics...)))
	ts.set(all)
	return all
}
