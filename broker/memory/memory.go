// Package memory is the in-process broker: every message, worker, topic and
// lock lives in this process's memory behind one mutex, and dies with it.
//
// It keeps the rules every broker keeps (package broker's documentation
// lists them; broker/brokertest checks them).
//
// Nothing can be orphaned here: a crashed process takes its queue with it,
// so the reaper has nothing to reclaim on this broker.
package memory

import (
	"context"
	"sync"
	"time"

	"github.com/taskhost/taskhost/broker"
)

// Defaults of the Broker's settings.
const (
	// DefaultLiveAfter is how recent a worker's heartbeat must be for it to
	// count as live: three heartbeat intervals of 10 s.
	DefaultLiveAfter = 30 * time.Second
	// DefaultRetain is how many finished messages are kept.
	DefaultRetain = 100000
)

var _ broker.Broker = (*Broker)(nil)

// Broker is the in-memory broker. Create it with New; set the exported
// fields before first use.
type Broker struct {
	// LiveAfter is how recent a worker's heartbeat must be for the worker
	// to count as live in Stats (Workers, Beats, Subscribers). Zero means
	// DefaultLiveAfter.
	LiveAfter time.Duration
	// Retain caps the finished (done, failed, dead, cancelled) messages
	// kept for reading by id; past it the oldest finished ones are
	// dropped. Zero or less means DefaultRetain.
	Retain int

	mu     sync.Mutex
	closed bool
	now    func() time.Time

	nextID int64
	msgs   map[int64]*entry
	// ids holds every id ever stored, ascending; deleted ones are skipped
	// and compacted away when they pile up.
	ids     []int64
	deleted int

	queues  map[string][]*entry // queued messages per topic by (priority desc, available_at, id)
	running map[int64]*entry    // running messages
	// runningBy counts running messages per topic: the concurrency gate.
	runningBy map[string]int
	deadBy    map[string]int // dead messages per topic
	topics    map[string]*broker.TopicConfig
	leases    map[string]*broker.Lease
	rr        uint64 // rotates the first topic Claim serves

	// finQ lists finished messages in the order they finished, for
	// Retain. Entries whose message was deleted or left the finished
	// states are stale (their seq no longer matches) and are skipped.
	finQ     []finRef
	finished int
	finSeq   uint64

	workers map[string]*broker.WorkerInfo
	locks   map[string]*lockEntry

	sched *schedState // schedules, fires and reports (schedule.go)

	// keys are the unique keys submitted (messages.go).
	keys map[string]*keyState
}

type entry struct {
	m      broker.Message
	finSeq uint64 // non-zero while finished: its place in finQ
	// states are the states the message holds its unique key in.
	states []string
}

// keyState is what the broker knows of a unique key: the messages that
// carry it and the latest one created.
type keyState struct {
	ids    []int64
	lastID int64
	lastAt time.Time
}

type finRef struct {
	id  int64
	seq uint64
}

type lockEntry struct {
	lock  broker.Lock
	token string
}

// New returns an empty broker.
func New() *Broker {
	return &Broker{
		now:       time.Now,
		msgs:      make(map[int64]*entry),
		queues:    make(map[string][]*entry),
		running:   make(map[int64]*entry),
		runningBy: make(map[string]int),
		deadBy:    make(map[string]int),
		topics:    make(map[string]*broker.TopicConfig),
		workers:   make(map[string]*broker.WorkerInfo),
		locks:     make(map[string]*lockEntry),
	}
}

// Kind returns "memory".
func (b *Broker) Kind() string { return "memory" }

// Close closes the broker: every later call returns broker.ErrClosed.
// Closing twice is harmless.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// begin checks ctx and the closed flag and takes the lock. On success the
// caller must unlock.
func (b *Broker) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return broker.ErrClosed
	}
	return nil
}

func (b *Broker) liveAfter() time.Duration {
	if b.LiveAfter > 0 {
		return b.LiveAfter
	}
	return DefaultLiveAfter
}

func (b *Broker) retain() int {
	if b.Retain > 0 {
		return b.Retain
	}
	return DefaultRetain
}
