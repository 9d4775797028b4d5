package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// This file owns the statements that queue messages and announce them.
// They are written once, for a schema named in full, and shared by the
// broker's Submit, SubmitMany and schedule fires and by client/pgtx, which
// runs them in an application's own transaction (whose search_path is the
// application's).
//
// The announcement is a notification on the schema's channel
// (NotifyChannel), one per distinct topic and delay, which PostgreSQL
// delivers when (and only if) the sending transaction commits; the
// broker's listener (listen.go) wakes the worker pools of every process
// with it. It is a statement of its own, and the broker's Submit and
// SubmitMany send it after their transaction, from a transaction of its
// own (announce.go), because PostgreSQL serialises the commits of
// transactions that notify: from the start of such a commit to its end,
// WAL flush included, it holds a lock on the notification queue that
// every other notifying commit waits for. Submits that notified in their
// own transaction would commit one at a time, each after the WAL flush of
// the one before: the submit rate would be bounded by the flush's latency,
// however many clients submit.

// Querier is what the insert statements need of a connection or a
// transaction: *pgx.Conn and pgx.Tx have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Inserter holds the insert statements of one schema. Create it with
// NewInserter; it is safe for concurrent use.
type Inserter struct {
	schema  string
	channel string
	one     string
	many    string
	notify  string
	keyed   keyedSQL
	// pre12: the tables are at a migration before 12 (no priorities or
	// unique keys): see AtVersion.
	pre12   bool
	version int
}

// NewInserter returns the insert statements for the broker's tables in
// schema ("" means "public").
func NewInserter(schema string) (*Inserter, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := CheckSchema(schema); err != nil {
		return nil, err
	}
	ch := NotifyChannel(schema)
	return &Inserter{
		schema:  schema,
		channel: ch,
		one:     insertMessageSQL(schema, true),
		many:    submitManySQL(schema, true),
		notify:  notifySQL(ch),
		keyed:   newKeyedSQL(schema),
	}, nil
}

// intakeVersion is the migration that brought priorities, unique keys and
// run-at times.
const intakeVersion = 12

// AtVersion returns the statements for tables at migration version v: for
// a version before 12 they write no priority and refuse requests with a
// priority or a unique key (ErrInvalid saying to migrate), so an
// application's newer package keeps writing to tables its hosts have not
// migrated yet.
func (in *Inserter) AtVersion(v int) *Inserter {
	if v >= intakeVersion || v <= 0 {
		return in
	}
	old := *in
	old.pre12, old.version = true, v
	old.one, old.many = insertMessageSQL(in.schema, false), submitManySQL(in.schema, false)
	return &old
}

// checkVersion refuses what tables before migration 12 cannot store.
func (in *Inserter) checkVersion(reqs []broker.SubmitRequest) error {
	if !in.pre12 {
		return nil
	}
	for i, r := range reqs {
		if r.Priority != 0 || r.UniqueKey != "" {
			return broker.Invalid("request %d: the tables in schema %s are at migration %d: a priority or a unique key needs migration %d (run `host migrate`, or upgrade the hosts)",
				i, in.schema, in.version, intakeVersion)
		}
	}
	return nil
}

// Schema is the schema the statements write to.
func (in *Inserter) Schema() string { return in.schema }

// Channel is the notification channel the statements notify.
func (in *Inserter) Channel() string { return in.channel }

// NotifyChannel is the name of the channel that messages submitted to the
// tables in schema are announced on: "taskhost_<schema>", or, when that
// would pass PostgreSQL's 63-byte limit on names, the schema's first 45
// bytes followed by "_" and a hash of the whole name. The payload of each
// notification is a JSON object: {"topic": <topic>, "delay_us": <the
// messages' delay in µs>, "priority": <their priority, absent when 0>}.
func NotifyChannel(schema string) string { return channelName("taskhost_", schema) }

// channelName is prefix followed by schema's name ("" is DefaultSchema),
// or, past PostgreSQL's 63 bytes, by as much of it as leaves room for "_"
// and a hash of the whole name.
func channelName(prefix, schema string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	if len(prefix)+len(schema) <= 63 {
		return prefix + schema
	}
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("%s%s_%08x", prefix, schema[:63-len(prefix)-9], h.Sum32())
}

// notifyPayload is a notification's payload (see NotifyChannel).
type notifyPayload struct {
	Topic   string `json:"topic"`
	DelayUS int64  `json:"delay_us"`
	// Priority is the messages' priority (absent: 0): claimers whose
	// claim starts past where such messages sort go back to the head of
	// the queue (claim.go).
	Priority int `json:"priority,omitempty"`
}

func (p notifyPayload) text() string {
	b, _ := json.Marshal(p) // a string and a number: cannot fail
	return string(b)
}

// notifySQL announces the payload texts in the array $1 on channel. The
// count makes PostgreSQL run pg_notify for each.
func notifySQL(channel string) string {
	return `SELECT count(*) FROM (SELECT pg_notify('` + channel + `', p) FROM unnest($1::text[]) p) n`
}

// payloads returns the distinct payloads announcing reqs.
func payloads(reqs []broker.SubmitRequest) []string {
	seen := make(map[notifyPayload]bool, 1)
	now := time.Now()
	var out []string
	for _, r := range reqs {
		p := notifyPayload{Topic: r.Topic, DelayUS: micros(r.AvailableAt(now).Sub(now)), Priority: r.Priority}
		if !seen[p] {
			seen[p] = true
			out = append(out, p.text())
		}
	}
	return out
}

// Notify announces reqs, already queued through q, on the schema's
// channel, in q's transaction when q is one: the notifications are
// delivered when it commits. Transactions that notify commit one at a time
// (see the top of this file).
func (in *Inserter) Notify(ctx context.Context, q Querier, reqs []broker.SubmitRequest) error {
	var n int64
	return q.QueryRow(ctx, in.notify, payloads(reqs)).Scan(&n)
}

// availableSQL is when a message becomes available: at run-at time $7
// (now when that is past) or after a delay of $6 microseconds.
const availableSQL = `CASE WHEN $7::timestamptz IS NULL THEN now() + $6::bigint * interval '1 microsecond'
		ELSE greatest(now(), $7::timestamptz) END`

// insertMessageSQL is Submit's statement: queue one message, creating its
// topic's row when missing. $1 topic, $2 task, $3 payload text, $4
// headers text or NULL, $5 max attempts, $6 delay µs, $7 run-at time or
// NULL, $8 priority (without prio, for tables before migration 12: no $8).
func insertMessageSQL(schema string, prio bool) string {
	s := pgx.Identifier{schema}.Sanitize()
	col, val := ", priority", ", $8"
	if !prio {
		col, val = "", ""
	}
	return `
	WITH topic AS (
		INSERT INTO ` + s + `.tw_topics (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
	)
	INSERT INTO ` + s + `.tw_messages (topic, task, payload, headers, max_attempts, available_at, created_at` + col + `)
	VALUES ($1, $2, $3::text::jsonb, $4::text::jsonb, $5, ` + availableSQL + `, now()` + val + `)
	RETURNING id`
}

// submitManySQL queues the rows of the arrays $1 topics, $2 tasks, $3
// payload texts, $4 header texts (NULL for none), $5 max attempts, $6
// delays in µs, $7 run-at times (NULL for none) and $8 priorities (without
// prio, for tables before migration 12: no $8), creating missing topics (in name order, so concurrent
// calls cannot deadlock on them). Each row draws its id from the sequence
// in the CTE, next to its ordinal, so the answer pairs them without
// relying on the order rows are inserted or returned in.
func submitManySQL(schema string, prio bool) string {
	s := pgx.Identifier{schema}.Sanitize()
	arr, name, col, val := ", $8::int[]", ", priority", ", priority", ", priority"
	if !prio {
		arr, name, col, val = "", "", "", ""
	}
	return `
	WITH u AS MATERIALIZED (
		SELECT nextval('` + pgx.Identifier{schema, "tw_messages_id_seq"}.Sanitize() + `') AS id, x.*
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::bigint[], $7::timestamptz[]` + arr + `)
			WITH ORDINALITY AS x(topic, task, payload, headers, max_attempts, delay_us, run_at` + name + `, ord)
	), topics AS (
		INSERT INTO ` + s + `.tw_topics (name)
		SELECT DISTINCT topic FROM u ORDER BY 1
		ON CONFLICT (name) DO NOTHING
	), ins AS (
		INSERT INTO ` + s + `.tw_messages (id, topic, task, payload, headers, max_attempts, available_at, created_at` + col + `)
		SELECT id, topic, task, payload::jsonb, headers::jsonb, max_attempts,
			CASE WHEN run_at IS NULL THEN now() + delay_us * interval '1 microsecond'
				ELSE greatest(now(), run_at) END, now()` + val + `
		FROM u
		RETURNING 1
	)
	SELECT u.ord, u.id, (SELECT count(*) FROM ins) FROM u`
}

// maxSubmitMany bounds one SubmitMany statement; longer calls are sent as
// several statements of that many rows, still in one transaction.
const maxSubmitMany = 5000

// submitFields returns the payload ({} when empty) and headers (NULL when
// none) of req as the JSON text the insert statements take.
func submitFields(req broker.SubmitRequest) (string, *string, error) {
	payload := "{}"
	if len(req.Payload) > 0 {
		payload = string(req.Payload)
	}
	if len(req.Headers) == 0 {
		return payload, nil, nil
	}
	h, err := json.Marshal(req.Headers)
	if err != nil {
		return "", nil, broker.Invalid("headers: %v", err)
	}
	s := string(h)
	return payload, &s, nil
}

// Insert validates req (broker.ValidateSubmit, with maxPayload; 0 means
// broker.MaxPayloadSize) and queues it through q, in q's transaction when
// q is one, creating its topic's row when missing. It returns the
// message's id. It announces nothing: see Notify. A request with a unique
// key needs q to be a transaction; a duplicate returns the holder's id
// and a *broker.DuplicateError.
func (in *Inserter) Insert(ctx context.Context, q Querier, req broker.SubmitRequest, maxPayload int) (int64, error) {
	if err := broker.ValidateSubmit(req, maxPayload); err != nil {
		return 0, err
	}
	if req.UniqueKey != "" {
		s, err := in.insertKeyed(ctx, q, req)
		if err == nil && s.Duplicate {
			err = &broker.DuplicateError{ID: s.ID, Key: req.UniqueKey}
		}
		return s.ID, err
	}
	return in.insert(ctx, q, req)
}

// insert is Insert without the validation.
func (in *Inserter) insert(ctx context.Context, q Querier, req broker.SubmitRequest) (int64, error) {
	payload, headers, err := submitFields(req)
	if err != nil {
		return 0, err
	}
	if err := in.checkVersion([]broker.SubmitRequest{req}); err != nil {
		return 0, err
	}
	args := []any{req.Topic, req.Task, payload, headers, req.MaxAttempts, micros(req.Delay), runAt(req), req.Priority}
	if in.pre12 {
		args = args[:7]
	}
	var id int64
	err = q.QueryRow(ctx, in.one, args...).Scan(&id)
	return id, err
}

// runAt is req's run-at time for the statements: nil when it has none.
func runAt(req broker.SubmitRequest) *time.Time {
	if req.RunAt.IsZero() {
		return nil
	}
	t := req.RunAt
	return &t
}

// InsertMany validates every request (broker.ValidateSubmitMany) and
// queues them all through q, in q's transaction when q is one (otherwise
// in one implicit transaction per 5,000), as Insert queues one. It
// returns their ids in the order of reqs.
//
// With unique keys (q must be a transaction then), a duplicate's id is its
// holder's: InsertBatch says which they are.
func (in *Inserter) InsertMany(ctx context.Context, q Querier, reqs []broker.SubmitRequest, maxPayload int) ([]int64, error) {
	if err := broker.ValidateSubmitMany(reqs, maxPayload); err != nil {
		return nil, err
	}
	if err := in.checkVersion(reqs); err != nil {
		return nil, err
	}
	if broker.HasUniqueKey(reqs) {
		out, err := in.insertBatch(ctx, q, reqs)
		return broker.IDs(out), err
	}
	rows, err := manyRows(reqs)
	if err != nil {
		return nil, err
	}
	return in.insertMany(ctx, q, rows)
}

// manyArgs are SubmitMany's requests as the statement's arrays.
type manyArgs struct {
	topics, tasks, payloads []string
	headers                 []*string
	attempts                []int32
	delays                  []int64
	runAts                  []*time.Time
	priorities              []int32
}

func manyRows(reqs []broker.SubmitRequest) (*manyArgs, error) {
	n := len(reqs)
	a := &manyArgs{
		topics: make([]string, n), tasks: make([]string, n), payloads: make([]string, n),
		headers: make([]*string, n), attempts: make([]int32, n), delays: make([]int64, n),
		runAts: make([]*time.Time, n), priorities: make([]int32, n),
	}
	for i, req := range reqs {
		p, h, err := submitFields(req)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		a.topics[i], a.tasks[i], a.payloads[i], a.headers[i] = req.Topic, req.Task, p, h
		a.attempts[i], a.delays[i] = int32(min(req.MaxAttempts, math.MaxInt32)), micros(req.Delay)
		a.runAts[i], a.priorities[i] = runAt(req), int32(req.Priority) // checked: -100..100
	}
	return a, nil
}

// errManyAnswer marks an answer of the statement that does not match what
// was sent.
var errManyAnswer = errors.New("submit many")

// insertMany sends a's rows as one batch of statements of up to
// maxSubmitMany rows and pairs the ids with the rows.
func (in *Inserter) insertMany(ctx context.Context, q Querier, a *manyArgs) ([]int64, error) {
	n := len(a.topics)
	ids := make([]int64, n)
	if n == 0 {
		return ids, ctx.Err()
	}
	batch := &pgx.Batch{}
	for from := 0; from < n; from += maxSubmitMany {
		to := min(from+maxSubmitMany, n)
		args := []any{a.topics[from:to], a.tasks[from:to], a.payloads[from:to],
			a.headers[from:to], a.attempts[from:to], a.delays[from:to], a.runAts[from:to], a.priorities[from:to]}
		if in.pre12 {
			args = args[:7]
		}
		batch.Queue(in.many, args...)
	}
	br := q.SendBatch(ctx, batch)
	for from := 0; from < n; from += maxSubmitMany {
		want := min(maxSubmitMany, n-from)
		if err := readMany(br, ids[from:from+want]); err != nil {
			br.Close()
			return nil, err
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	return ids, nil
}

// readMany reads the answer of one statement of submitManySQL into ids.
func readMany(br pgx.BatchResults, ids []int64) error {
	want := len(ids)
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	got := 0
	for rows.Next() {
		var ord, id, inserted int64
		if err := rows.Scan(&ord, &id, &inserted); err != nil {
			return err
		}
		if ord < 1 || ord > int64(want) || inserted != int64(want) {
			return fmt.Errorf("%w: row %d of %d, %d inserted", errManyAnswer, ord, want, inserted)
		}
		ids[ord-1] = id
		got++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%w: %d ids back for %d messages", errManyAnswer, got, want)
	}
	return nil
}

// SchemaVersion returns the migration version of the broker's tables in
// schema ("" means "public"), read through q (in q's transaction when q
// is one): the newest version in its tw_schema_migrations table, or 0
// when the schema has no such table (nothing was ever migrated there).
// It never makes q's transaction fail: a missing table is looked up before
// it is read.
func SchemaVersion(ctx context.Context, q Querier, schema string) (int, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := CheckSchema(schema); err != nil {
		return 0, err
	}
	table := pgx.Identifier{schema, "tw_schema_migrations"}.Sanitize()
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return 0, fmt.Errorf("reading the migration version of schema %s: %w", schema, err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+table).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading the migration version of schema %s: %w", schema, err)
	}
	return v, nil
}

// LatestVersion is the newest migration this package embeds: the version
// `host migrate` (Migrate) brings the tables to.
func LatestVersion() int {
	all, _ := migrations() // checked by init
	return all[len(all)-1].version
}
