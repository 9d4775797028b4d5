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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
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
	// Retain caps the finished (done, failed, dead) messages kept for
	// reading by id; past it the oldest finished ones are dropped. Zero
	// or less means DefaultRetain.
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

	queues  map[string][]*entry // queued messages per topic by (available_at, id)
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
}

type entry struct {
	m      broker.Message
	finSeq uint64 // non-zero while finished: its place in finQ
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

// Submit validates req and queues it; see the package documentation.
func (b *Broker) Submit(ctx context.Context, req broker.SubmitRequest) (int64, error) {
	if err := broker.ValidateSubmit(req, 0); err != nil {
		return 0, err
	}
	if err := b.begin(ctx); err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	return b.submitLocked(req), nil
}

var _ broker.BatchSubmitter = (*Broker)(nil)

// SubmitMany queues reqs at once, or none of them when one is invalid.
func (b *Broker) SubmitMany(ctx context.Context, reqs []broker.SubmitRequest) ([]int64, error) {
	if err := broker.ValidateSubmitMany(reqs, 0); err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	ids := make([]int64, len(reqs))
	for i, req := range reqs {
		ids[i] = b.submitLocked(req)
	}
	return ids, nil
}

// submitLocked queues the valid req; b.mu is held.
func (b *Broker) submitLocked(req broker.SubmitRequest) int64 {
	now := b.now()
	b.topic(req.Topic)
	b.nextID++
	payload := json.RawMessage(`{}`)
	if len(req.Payload) > 0 {
		payload = slices.Clone(req.Payload)
	}
	e := &entry{m: broker.Message{
		ID:          b.nextID,
		Topic:       req.Topic,
		Task:        req.Task,
		Payload:     payload,
		Headers:     cloneHeaders(req.Headers),
		State:       broker.StateQueued,
		MaxAttempts: req.MaxAttempts,
		AvailableAt: now.Add(req.Delay),
		CreatedAt:   now,
	}}
	b.msgs[e.m.ID] = e
	b.ids = append(b.ids, e.m.ID)
	b.enqueue(e)
	return e.m.ID
}

// topic returns name's config, creating it with the defaults.
func (b *Broker) topic(name string) *broker.TopicConfig {
	cfg := b.topics[name]
	if cfg == nil {
		cfg = &broker.TopicConfig{Name: name, DeadLetterEnabled: true}
		b.topics[name] = cfg
	}
	return cfg
}

// enqueue inserts a queued message in its topic's queue.
func (b *Broker) enqueue(e *entry) {
	q := b.queues[e.m.Topic]
	i := sort.Search(len(q), func(i int) bool { return before(e, q[i]) })
	b.queues[e.m.Topic] = slices.Insert(q, i, e)
}

// before orders queued messages by (available_at, id).
func before(a, c *entry) bool {
	if !a.m.AvailableAt.Equal(c.m.AvailableAt) {
		return a.m.AvailableAt.Before(c.m.AvailableAt)
	}
	return a.m.ID < c.m.ID
}

// Claim takes up to req.Max available messages; see the package
// documentation.
func (b *Broker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	if req.WorkerID == "" {
		return nil, broker.Invalid("worker id is empty")
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	want := max(req.Max, 1)
	var topics []string
	for _, t := range req.Topics {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		return nil, nil
	}
	start := int(b.rr % uint64(len(topics)))
	b.rr++

	now := b.now()
	var out []broker.Message
	for len(out) < want {
		progress := false
		for i := 0; i < len(topics) && len(out) < want; i++ {
			t := topics[(start+i)%len(topics)]
			cfg := b.topics[t]
			if cfg == nil || cfg.Paused {
				continue
			}
			if cfg.ConcurrencyLimit > 0 && b.runningBy[t] >= cfg.ConcurrencyLimit {
				continue
			}
			q := b.queues[t]
			if len(q) == 0 || q[0].m.AvailableAt.After(now) {
				continue
			}
			e := q[0]
			q[0] = nil
			b.queues[t] = q[1:]

			claimedAt := now
			e.m.State = broker.StateRunning
			e.m.ClaimedBy = req.WorkerID
			e.m.ClaimedAt = &claimedAt
			e.m.Attempts++
			e.m.Token = newToken()
			b.running[e.m.ID] = e
			b.runningBy[t]++

			m := copyMessage(&e.m)
			m.Token = e.m.Token
			out = append(out, m)
			progress = true
		}
		if !progress {
			break
		}
	}
	return out, nil
}

func newToken() string {
	var buf [16]byte
	_, _ = rand.Read(buf[:]) // never fails (crypto/rand crashes instead)
	return hex.EncodeToString(buf[:])
}

// held returns the running message c names, or nil when c does not hold it.
func (b *Broker) held(c broker.Claim) *entry {
	e := b.running[c.ID]
	if e == nil || c.Token == "" || e.m.Token != c.Token {
		return nil
	}
	return e
}

// release ends e's claim: it leaves the running set, its token is cleared
// and the locks held under it are released.
func (b *Broker) release(e *entry) {
	delete(b.running, e.m.ID)
	b.runningBy[e.m.Topic]--
	if b.runningBy[e.m.Topic] <= 0 {
		delete(b.runningBy, e.m.Topic)
	}
	for name, l := range b.locks {
		if l.token == e.m.Token {
			delete(b.locks, name)
		}
	}
	e.m.Token = ""
}

// finish moves e (no longer running) to a finished state.
func (b *Broker) finish(e *entry, state string, now time.Time) {
	e.m.State = state
	e.m.FinishedAt = &now
	if state == broker.StateDead {
		b.deadBy[e.m.Topic]++
	}
	b.finSeq++
	e.finSeq = b.finSeq
	b.finQ = append(b.finQ, finRef{id: e.m.ID, seq: e.finSeq})
	b.finished++
	b.trim()
}

// unfinish takes e out of the finished states' books, before it is
// requeued or deleted.
func (b *Broker) unfinish(e *entry) {
	if e.finSeq == 0 {
		return
	}
	e.finSeq = 0
	b.finished--
	if e.m.State == broker.StateDead {
		b.deadBy[e.m.Topic]--
		if b.deadBy[e.m.Topic] <= 0 {
			delete(b.deadBy, e.m.Topic)
		}
	}
}

// trim drops the oldest finished messages past Retain and compacts finQ.
func (b *Broker) trim() {
	limit := b.retain()
	for b.finished > limit && len(b.finQ) > 0 {
		ref := b.finQ[0]
		b.finQ = b.finQ[1:]
		if e := b.msgs[ref.id]; e != nil && e.finSeq == ref.seq {
			b.unfinish(e)
			b.remove(e)
		}
	}
	if len(b.finQ) > 2*b.finished+1024 {
		live := make([]finRef, 0, b.finished)
		for _, ref := range b.finQ {
			if e := b.msgs[ref.id]; e != nil && e.finSeq == ref.seq {
				live = append(live, ref)
			}
		}
		b.finQ = live
	}
}

// remove deletes a message that is not queued or running.
func (b *Broker) remove(e *entry) {
	delete(b.msgs, e.m.ID)
	b.deleted++
	if b.deleted > 1024 && b.deleted > len(b.ids)/2 {
		ids := make([]int64, 0, len(b.msgs))
		for _, id := range b.ids {
			if b.msgs[id] != nil {
				ids = append(ids, id)
			}
		}
		b.ids = ids
		b.deleted = 0
	}
}

// Ack marks the outcomes' messages done; see the package documentation.
// A result that is not JSON makes the whole call fail with
// broker.ErrInvalid before anything changes.
func (b *Broker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	if err := broker.CheckOutcomes(outcomes); err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	now := b.now()
	errs := make([]error, len(outcomes))
	for i, o := range outcomes {
		e := b.held(o.Claim)
		if e == nil {
			errs[i] = broker.ErrClaimLost
			continue
		}
		b.release(e)
		if len(o.Result) > 0 {
			e.m.Result = slices.Clone(o.Result)
		}
		b.finish(e, broker.StateDone, now)
	}
	return errs, nil
}

// Nack ends an attempt without success; see the package documentation.
func (b *Broker) Nack(ctx context.Context, req broker.NackRequest) error {
	if err := broker.CheckDelay(req.Delay); err != nil {
		return err
	}
	req.Error = broker.CleanText(req.Error)
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	e := b.held(req.Claim)
	if e == nil {
		return broker.ErrClaimLost
	}
	now := b.now()
	b.release(e)
	e.m.LastError = req.Error
	if req.Requeue {
		if req.NotRun && e.m.Attempts > 0 {
			e.m.Attempts--
		}
		b.requeue(e, now.Add(req.Delay))
		return nil
	}
	state := broker.StateFailed
	if b.topic(e.m.Topic).DeadLetterEnabled {
		state = broker.StateDead
	}
	b.finish(e, state, now)
	return nil
}

// requeue queues e (not running) again, available at at.
func (b *Broker) requeue(e *entry, at time.Time) {
	b.unfinish(e)
	e.m.State = broker.StateQueued
	e.m.ClaimedBy = ""
	e.m.ClaimedAt = nil
	e.m.Token = ""
	e.m.FinishedAt = nil
	e.m.AvailableAt = at
	b.enqueue(e)
}

// DeadLetter ends an attempt dead with reason as its last error, whatever
// the topic's dead-letter setting.
func (b *Broker) DeadLetter(ctx context.Context, c broker.Claim, reason string) error {
	reason = broker.CleanText(reason)
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	e := b.held(c)
	if e == nil {
		return broker.ErrClaimLost
	}
	b.release(e)
	e.m.LastError = reason
	b.finish(e, broker.StateDead, b.now())
	return nil
}

// RegisterWorker records w (replacing a worker with the same id); its
// StartedAt and HeartbeatAt are now.
func (b *Broker) RegisterWorker(ctx context.Context, w broker.WorkerInfo) error {
	if w.ID == "" {
		return broker.Invalid("worker id is empty")
	}
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	now := b.now()
	w.Roles = slices.Clone(w.Roles)
	w.Topics = slices.Clone(w.Topics)
	w.Tasks = slices.Clone(w.Tasks)
	if w.Tasks == nil {
		w.Tasks = []string{}
	}
	w.StartedAt = now
	if old, ok := b.workers[w.ID]; ok && old.Host == w.Host && old.PID == w.PID {
		w.StartedAt = old.StartedAt // the same process, registering again
	}
	w.HeartbeatAt = now
	w.Running = 0
	b.workers[w.ID] = &w
	return nil
}

// Heartbeat stamps the worker's HeartbeatAt; broker.ErrNotFound when it is
// not registered.
func (b *Broker) Heartbeat(ctx context.Context, workerID string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	w := b.workers[workerID]
	if w == nil {
		return fmt.Errorf("worker %q: %w", workerID, broker.ErrNotFound)
	}
	w.HeartbeatAt = b.now()
	return nil
}

// UnregisterWorker forgets the worker; an unknown id is not an error.
func (b *Broker) UnregisterWorker(ctx context.Context, workerID string) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	delete(b.workers, workerID)
	return nil
}

// RunningClaims returns the claims of the messages running under
// workerID, by message id.
func (b *Broker) RunningClaims(ctx context.Context, workerID string) ([]broker.Claim, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := []broker.Claim{}
	for _, e := range b.running {
		if e.m.ClaimedBy == workerID {
			out = append(out, e.m.ClaimOf())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Workers lists every registered worker (live or not) by id, with Running
// counted from the running messages it claimed.
func (b *Broker) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	running := make(map[string]int)
	for _, e := range b.running {
		running[e.m.ClaimedBy]++
	}
	out := make([]broker.WorkerInfo, 0, len(b.workers))
	for _, w := range b.workers {
		c := *w
		c.Roles = slices.Clone(w.Roles)
		c.Topics = slices.Clone(w.Topics)
		c.Tasks = slices.Clone(w.Tasks)
		c.Running = running[w.ID]
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// SetTopic applies patch to the topic's config, creating it with the
// defaults when missing, and returns the result.
func (b *Broker) SetTopic(ctx context.Context, name string, patch broker.TopicPatch) (broker.TopicConfig, error) {
	if err := broker.ValidateTopicName(name); err != nil {
		return broker.TopicConfig{}, err
	}
	if err := broker.ValidatePatch(patch); err != nil {
		return broker.TopicConfig{}, err
	}
	if err := b.begin(ctx); err != nil {
		return broker.TopicConfig{}, err
	}
	defer b.mu.Unlock()

	cfg := b.topic(name)
	if patch.ConcurrencyLimit != nil {
		cfg.ConcurrencyLimit = *patch.ConcurrencyLimit
	}
	if patch.DeadLetterEnabled != nil {
		cfg.DeadLetterEnabled = *patch.DeadLetterEnabled
	}
	if patch.Paused != nil {
		cfg.Paused = *patch.Paused
	}
	return *cfg, nil
}

// Topics lists the topic configs by name.
func (b *Broker) Topics(ctx context.Context) ([]broker.TopicConfig, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := make([]broker.TopicConfig, 0, len(b.topics))
	for _, cfg := range b.topics {
		out = append(out, *cfg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Drain pauses the topic (creating its config when missing): Claim hands
// out nothing more from it while running messages finish.
func (b *Broker) Drain(ctx context.Context, topic string) error {
	paused := true
	_, err := b.SetTopic(ctx, topic, broker.TopicPatch{Paused: &paused})
	return err
}

// Purge deletes the topic's queued messages (delayed ones too) and, when
// deadLetters is set, its dead ones. Running messages are never touched.
// An unknown topic purges nothing.
func (b *Broker) Purge(ctx context.Context, topic string, deadLetters bool) (broker.PurgeResult, error) {
	if err := broker.ValidateTopicName(topic); err != nil {
		return broker.PurgeResult{}, err
	}
	if err := b.begin(ctx); err != nil {
		return broker.PurgeResult{}, err
	}
	defer b.mu.Unlock()

	var res broker.PurgeResult
	for _, e := range b.queues[topic] {
		b.remove(e)
		res.Queued++
	}
	delete(b.queues, topic)
	if deadLetters {
		for _, e := range b.msgs {
			if e.m.Topic == topic && e.m.State == broker.StateDead {
				b.unfinish(e)
				b.remove(e)
				res.DeadLetter++
			}
		}
	}
	return res, nil
}

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

// ListMessages returns the messages matching f, newest (highest id) first:
// at most f.Limit (50 when not positive, 1000 at most), with ids below
// f.Before when it is positive. An unknown state is invalid.
func (b *Broker) ListMessages(ctx context.Context, f broker.MessageFilter) ([]broker.Message, error) {
	limit, err := broker.ValidateMessageFilter(f)
	if err != nil {
		return nil, err
	}
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	i := len(b.ids)
	if f.Before > 0 {
		i = sort.Search(len(b.ids), func(i int) bool { return b.ids[i] >= f.Before })
	}
	out := []broker.Message{}
	for i--; i >= 0 && len(out) < limit; i-- {
		e := b.msgs[b.ids[i]]
		if e == nil ||
			(f.State != "" && e.m.State != f.State) ||
			(f.Topic != "" && e.m.Topic != f.Topic) ||
			(f.Task != "" && e.m.Task != f.Task) {
			continue
		}
		out = append(out, copyMessage(&e.m))
	}
	return out, nil
}

// GetMessage returns the message (without its token); broker.ErrNotFound
// when there is none with that id (never stored, purged or dropped past
// Retain).
func (b *Broker) GetMessage(ctx context.Context, id int64) (broker.Message, error) {
	if err := b.begin(ctx); err != nil {
		return broker.Message{}, err
	}
	defer b.mu.Unlock()

	e := b.msgs[id]
	if e == nil {
		return broker.Message{}, fmt.Errorf("message %d: %w", id, broker.ErrNotFound)
	}
	return copyMessage(&e.m), nil
}

// Requeue puts a dead or failed message back in the queue, available now,
// keeping its attempts and last error. Any other state is
// broker.ErrInvalid; an unknown id broker.ErrNotFound.
func (b *Broker) Requeue(ctx context.Context, id int64) error {
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	e := b.msgs[id]
	if e == nil {
		return fmt.Errorf("message %d: %w", id, broker.ErrNotFound)
	}
	if e.m.State != broker.StateDead && e.m.State != broker.StateFailed {
		return broker.Invalid("message %d is %s; only dead or failed messages can be requeued", id, e.m.State)
	}
	b.requeue(e, b.now())
	return nil
}

// AcquireLock takes lock name for the running claim c: true when it is
// taken now or was already held under c, false when another claim holds
// it. A claim that does not hold its message is broker.ErrClaimLost.
func (b *Broker) AcquireLock(ctx context.Context, name, holder string, c broker.Claim) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	if err := b.begin(ctx); err != nil {
		return false, err
	}
	defer b.mu.Unlock()

	if b.held(c) == nil {
		return false, broker.ErrClaimLost
	}
	if l := b.locks[name]; l != nil {
		return l.token == c.Token && l.lock.MessageID == c.ID, nil
	}
	b.locks[name] = &lockEntry{
		lock:  broker.Lock{Name: name, Holder: holder, MessageID: c.ID, AcquiredAt: b.now()},
		token: c.Token,
	}
	return true, nil
}

// ReleaseLock releases lock name if it is held under claim c; otherwise
// (held by another claim, or not held at all) broker.ErrClaimLost.
func (b *Broker) ReleaseLock(ctx context.Context, name string, c broker.Claim) error {
	if name == "" {
		return broker.Invalid("lock name is empty")
	}
	if err := b.begin(ctx); err != nil {
		return err
	}
	defer b.mu.Unlock()

	l := b.locks[name]
	if l == nil || c.Token == "" || l.token != c.Token || l.lock.MessageID != c.ID {
		return broker.ErrClaimLost
	}
	delete(b.locks, name)
	return nil
}

// ForceReleaseLock deletes lock name whoever holds it; false when it was
// not held.
func (b *Broker) ForceReleaseLock(ctx context.Context, name string) (bool, error) {
	if name == "" {
		return false, broker.Invalid("lock name is empty")
	}
	if err := b.begin(ctx); err != nil {
		return false, err
	}
	defer b.mu.Unlock()

	if b.locks[name] == nil {
		return false, nil
	}
	delete(b.locks, name)
	return true, nil
}

// Locks lists the held locks by name.
func (b *Broker) Locks(ctx context.Context) ([]broker.Lock, error) {
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()

	out := make([]broker.Lock, 0, len(b.locks))
	for _, l := range b.locks {
		out = append(out, l.lock)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// copyMessage returns a deep copy of m without its token.
func copyMessage(m *broker.Message) broker.Message {
	c := *m
	c.Token = ""
	c.Payload = slices.Clone(m.Payload)
	c.Result = slices.Clone(m.Result)
	c.Headers = cloneHeaders(m.Headers)
	if m.ClaimedAt != nil {
		t := *m.ClaimedAt
		c.ClaimedAt = &t
	}
	if m.FinishedAt != nil {
		t := *m.FinishedAt
		c.FinishedAt = &t
	}
	return c
}

func cloneHeaders(h map[string]string) map[string]string {
	if len(h) == 0 {
		return nil
	}
	c := make(map[string]string, len(h))
	for k, v := range h {
		c[k] = v
	}
	return c
}
