package pgtx

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/broker/postgres"
)

// Task is one task to queue.
type Task struct {
	// Topic is the queue the task's workers claim from. Required: unlike
	// the HTTP API, a transaction cannot look up a task's own topic.
	Topic string
	// Name is the task's name, such as "mail.receipt".
	Name string
	// Payload is the task's input, a JSON value; empty or null means {},
	// as in the HTTP API.
	Payload json.RawMessage
	// Headers travel with the task to its handler.
	Headers map[string]string
	// Delay postpones the first attempt.
	Delay time.Duration
	// MaxAttempts bounds error retries; 0 means the task's default.
	MaxAttempts int
	// RunAt, when set, is when the task becomes available (exclusive with
	// Delay; at once when past, but not more than 24 hours past).
	RunAt time.Time
	// Priority: a higher one is claimed first (-100 to 100, default 0).
	Priority int
	// UniqueKey, when set, makes the submit a duplicate while another
	// task holds the key (see broker.SubmitRequest.UniqueKey): Submit
	// then returns the holder's id and an error wrapping
	// broker.ErrDuplicate (a *broker.DuplicateError), stores nothing, and
	// leaves the transaction usable. A submit of a key another open
	// transaction just submitted waits for that transaction to end; two
	// transactions that submit the same keys in opposite orders can
	// deadlock, and PostgreSQL then aborts one of them (retry it).
	UniqueKey string
	// UniqueFor: a task with the key created less than this long ago
	// holds it whatever its state.
	UniqueFor time.Duration
	// UniqueStates: the states the task holds its key in (default
	// queued and running; must include both).
	UniqueStates []string
}

// MinVersion and MaxVersion bound the migration versions of the broker's
// tables this package writes (see the package documentation).
const MinVersion = 1

// MaxVersion is the newest migration version this package knows: the
// version of the broker in the same release.
var MaxVersion = postgres.LatestVersion()

// RecheckAfter is how long a schema's accepted migration version is
// trusted before it is read again.
const RecheckAfter = time.Minute

// Option configures Submit and SubmitMany.
type Option func(*config)

type config struct {
	schema     string
	maxPayload int
	quiet      bool
}

// WithSchema names the schema of the broker's tables: the broker's schema
// setting. Default public.
func WithSchema(schema string) Option { return func(c *config) { c.schema = schema } }

// WithoutNotify queues the tasks without announcing them: idle worker
// pools then find them by their fallback poll (worker.Options
// ClaimIdleFallback, 5 s by default) instead of at once, and the
// transaction does not wait for the commits of other notifying
// transactions (see the package documentation).
func WithoutNotify() Option { return func(c *config) { c.quiet = true } }

// WithMaxPayload bounds a payload in bytes, as the broker's max payload
// setting does. Default broker.MaxPayloadSize.
func WithMaxPayload(n int) Option { return func(c *config) { c.maxPayload = n } }

// VersionError says the tables in Schema are at a migration version this
// package does not write.
type VersionError struct {
	Schema string
	Found  int // 0: no tables
	Known  int // MaxVersion
}

func (e *VersionError) Error() string {
	if e.Found < MinVersion {
		return fmt.Sprintf("pgtx: no taskhost tables in schema %s: run `host migrate` (or start a host with the postgres broker on this schema and database) first",
			e.Schema)
	}
	return fmt.Sprintf("pgtx: the tables in schema %s are at migration %d; this package knows up to %d: upgrade the package (github.com/taskhost/taskhost) to the release of the hosts that migrated them",
		e.Schema, e.Found, e.Known)
}

// Submit queues t in tx and returns its id. The task exists once tx
// commits, and never if it rolls back. See the package documentation for
// what is checked and what is not. A duplicate (see Task.UniqueKey)
// returns the holder's id and an error wrapping broker.ErrDuplicate.
func Submit(ctx context.Context, tx pgx.Tx, t Task, opts ...Option) (int64, error) {
	cfg := configure(opts)
	req := t.request()
	if err := check(req, cfg); err != nil {
		return 0, err
	}
	in, err := prepare(ctx, tx, cfg)
	if err != nil {
		return 0, err
	}
	id, err := in.Insert(ctx, tx, req, cfg.maxPayload)
	if holder, dup := broker.DuplicateOf(err); dup {
		return holder, fmt.Errorf("pgtx: submit: %w", err)
	}
	if err != nil {
		return 0, fmt.Errorf("pgtx: submit: %w", err)
	}
	if !cfg.quiet && err == nil {
		if err := in.Notify(ctx, tx, []broker.SubmitRequest{req}); err != nil {
			return 0, fmt.Errorf("pgtx: submit: announcing the task: %w", err)
		}
	}
	return id, nil
}

// SubmitMany queues every task in tx, as Submit queues one, and returns
// their ids in the order of tasks (a duplicate's is its holder's:
// SubmitBatch says which). Nothing is sent when any task is refused; the
// error names the first one refused. At most broker.MaxSubmitBatch tasks
// per call.
func SubmitMany(ctx context.Context, tx pgx.Tx, tasks []Task, opts ...Option) ([]int64, error) {
	out, err := SubmitBatch(ctx, tx, tasks, opts...)
	return broker.IDs(out), err
}

// SubmitBatch is SubmitMany saying, for each task, whether it was a
// duplicate of the task whose id it returns (tasks with one unique key
// within the call collapse to the first).
func SubmitBatch(ctx context.Context, tx pgx.Tx, tasks []Task, opts ...Option) ([]broker.Submitted, error) {
	cfg := configure(opts)
	reqs := make([]broker.SubmitRequest, len(tasks))
	for i, t := range tasks {
		reqs[i] = t.request()
	}
	if len(reqs) > broker.MaxSubmitBatch {
		return nil, broker.Invalid("%d tasks in one call, the limit is %d: call SubmitMany several times in the transaction", len(reqs), broker.MaxSubmitBatch)
	}
	for i, req := range reqs {
		if err := check(req, cfg); err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
	}
	if len(reqs) == 0 {
		return []broker.Submitted{}, nil
	}
	in, err := prepare(ctx, tx, cfg)
	if err != nil {
		return nil, err
	}
	out, err := in.InsertBatch(ctx, tx, reqs, cfg.maxPayload)
	if err != nil {
		return nil, fmt.Errorf("pgtx: submit many: %w", err)
	}
	var sent []broker.SubmitRequest
	for i, r := range reqs {
		if !out[i].Duplicate {
			sent = append(sent, r)
		}
	}
	if !cfg.quiet && len(sent) > 0 {
		if err := in.Notify(ctx, tx, sent); err != nil {
			return nil, fmt.Errorf("pgtx: submit many: announcing the tasks: %w", err)
		}
	}
	return out, nil
}

func configure(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.schema == "" {
		c.schema = postgres.DefaultSchema
	}
	return c
}

func (t Task) request() broker.SubmitRequest {
	payload := t.Payload
	if string(bytes.TrimSpace(payload)) == "null" {
		payload = nil
	}
	return broker.SubmitRequest{Topic: t.Topic, Task: t.Name, Payload: payload, Headers: t.Headers,
		Delay: t.Delay, MaxAttempts: t.MaxAttempts, RunAt: t.RunAt, Priority: t.Priority,
		UniqueKey: t.UniqueKey, UniqueFor: t.UniqueFor, UniqueStates: t.UniqueStates}
}

// check applies the HTTP API's checks to req, with an answer for the
// topic the API would have filled in.
func check(req broker.SubmitRequest, cfg config) error {
	if req.Topic == "" {
		return broker.Invalid("task %q: topic is empty: name the topic the task's workers claim from (a transaction cannot look up the task's own topic)", req.Task)
	}
	if err := broker.ValidateNewTopicName(req.Topic); err != nil {
		return err
	}
	if err := broker.ValidateSubmit(req, cfg.maxPayload); err != nil {
		return fmt.Errorf("task %q: %w", req.Task, err)
	}
	return nil
}

// checked caches the accepted versions: key (database and schema) to
// when and what the version was read (a checkedVersion).
var checked sync.Map

type checkedVersion struct {
	at      time.Time
	version int
}

// inserters caches the statements by schema.
var inserters sync.Map

// prepare returns the schema's statements, once its version was accepted.
func prepare(ctx context.Context, tx pgx.Tx, cfg config) (*postgres.Inserter, error) {
	in, err := inserter(cfg.schema)
	if err != nil {
		return nil, err
	}
	cc := tx.Conn().Config()
	key := fmt.Sprintf("%s\x00%d\x00%s\x00%s", cc.Host, cc.Port, cc.Database, in.Schema())
	if c, ok := checked.Load(key); ok && time.Since(c.(checkedVersion).at) < RecheckAfter {
		return in.AtVersion(c.(checkedVersion).version), nil
	}
	v, err := postgres.SchemaVersion(ctx, tx, in.Schema())
	if err != nil {
		return nil, fmt.Errorf("pgtx: %w", err)
	}
	if v < MinVersion || v > MaxVersion {
		checked.Delete(key)
		return nil, &VersionError{Schema: in.Schema(), Found: v, Known: MaxVersion}
	}
	checked.Store(key, checkedVersion{at: time.Now(), version: v})
	return in.AtVersion(v), nil
}

func inserter(schema string) (*postgres.Inserter, error) {
	if in, ok := inserters.Load(schema); ok {
		return in.(*postgres.Inserter), nil
	}
	in, err := postgres.NewInserter(schema)
	if err != nil {
		return nil, fmt.Errorf("pgtx: %w", err)
	}
	got, _ := inserters.LoadOrStore(schema, in)
	return got.(*postgres.Inserter), nil
}
