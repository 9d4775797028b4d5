package postgres

import (
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// fullScanEvery is how often Claim walks a topic's queued index from its
// start even when it has a floor for the topic (see claimFloors).
const fullScanEvery = time.Second

// claimFloors remembers, per topic, where the last claim of this process
// ended in the topic's queued index, so the next one starts there instead
// of at the beginning, and whether that claim found the topic limited
// (announceFreed).
//
// Why: the messages claim rows hold stay queued, in the index, until their
// outcomes; every acked message leaves a dead entry there, and nothing but
// VACUUM removes those entries, since btree only cleans a page when an
// insert fills it and inserts land at the tail. A claim that starts at
// the head walks all of them: with autovacuum off or behind, after a few
// hundred thousand messages each claim reads a thousand index pages.
// Starting at the last key the previous claim took skips them, and the
// held messages before it.
//
// A floor is a hint and never decides what may be claimed: a message that
// became available behind it (a transaction that committed late with an
// older now(), a message whose attempt was retried or taken back) is
// found by the next walk from the start, which comes when a claim from
// the floor returns short, and at least every fullScanEvery. Order stays
// by key but for those stragglers, which wait at most that long. A
// message submitted with a higher priority than the floor's is announced
// with it (its notification names the priority), and the floor is dropped
// (raised): with the listener up, such a message waits for no full scan.
type claimFloors struct {
	mu sync.Mutex
	m  map[string]claimFloor
}

type claimFloor struct {
	prio     int       // priority of the last message the last claim took
	at       time.Time // and its available_at
	id       int64     // and its id; 0 when there is no floor (ids start at 1)
	fullScan time.Time // when the last walk from the start ran
	limited  bool      // the last claim found the topic limited
}

// get returns the floor to claim topic from, or ok false when this claim
// walks from the start (no floor yet, or the last walk is too old).
func (f *claimFloors) get(topic string, now time.Time) (fl claimFloor, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, found := f.m[topic]
	if !found || fl.id == 0 || now.Sub(fl.fullScan) >= fullScanEvery {
		return claimFloor{}, false
	}
	return fl, true
}

// raised hears of messages of topic submitted with priority: when the
// topic's floor is at a lower priority, the messages are behind it, and
// the next claim walks from the start.
func (f *claimFloors) raised(topic string, priority int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[topic]; ok && fl.id != 0 && priority > fl.prio {
		fl.prio, fl.at, fl.id = 0, time.Time{}, 0
		f.m[topic] = fl
	}
}

// isLimited reports whether the last claim of topic by this process found
// it limited (it has a concurrency limit).
func (f *claimFloors) isLimited(topic string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[topic].limited
}

// claimed records a claim of topic that the gate allowed to take allowed
// messages and that got msgs (sorted by key), walking from the start when
// full is set, and that found the topic limited or not. A claim that got
// fewer than the gate allowed ran out of queue: what is left may be behind
// the floor, which it clears.
func (f *claimFloors) claimed(topic string, full bool, now time.Time, allowed int, limited bool, msgs []broker.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]claimFloor)
	}
	fl := f.m[topic]
	fl.limited = limited
	if full {
		fl.fullScan = now
	}
	switch {
	case len(msgs) < allowed:
		fl.prio, fl.at, fl.id = 0, time.Time{}, 0
	case len(msgs) > 0:
		last := msgs[len(msgs)-1]
		fl.prio, fl.at, fl.id = last.Priority, last.AvailableAt, last.ID
	}
	if fl.id == 0 && fl.fullScan.IsZero() && !fl.limited {
		delete(f.m, topic)
		return
	}
	f.m[topic] = fl
}
