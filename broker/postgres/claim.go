package postgres

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/taskhost/taskhost/broker"
)

// claimLockSQL takes a limited topic's serialisation lock. It is a
// statement of its own, before the count: in READ COMMITTED each statement
// reads a snapshot taken when it starts, so the count that follows sees
// every claim committed by the lock's previous holders. (Locking in the
// same statement as the count would count from a snapshot taken before the
// lock was granted, and admit too many.) Unlimited topics match nothing and
// lock nothing.
//
// serialLockSQL takes the same lock whatever the topic's limit: it goes
// with the claim statements that lock no rows (see claimStatement).
const (
	claimLockSQL  = `SELECT 1 FROM tw_topics WHERE name = $1 AND concurrency_limit > 0 FOR UPDATE`
	serialLockSQL = `SELECT 1 FROM tw_topics WHERE name = $1 FOR UPDATE`
)

// The claim statements claim up to $2 of topic $1's oldest available
// queued messages for worker $3: none when the topic is paused or unknown,
// at most limit - running when it is limited. The inner SELECT walks the
// partial queued index in (-priority, available_at, id) order (the highest
// priority first); the outer UPDATE finds the rows by their ctid, with a
// TID scan rather than a descent of the primary key for each row. A row
// changed since the statement's snapshot has its newest version
// elsewhere, which PostgreSQL's recheck of the ctid condition then skips:
// that message is left for a later claim. The From variants start the
// walk at the key ($6 -priority, $4 available_at, $5 id) (see
// claimFloors).
//
// claimSQL and claimFromSQL lock the rows they pick FOR UPDATE SKIP
// LOCKED, so claimers of an unlimited topic, which run side by side, pass
// each other's rows by. serialClaimSQL and serialClaimFromSQL lock nothing
// before the UPDATE: they run only after serialLockSQL, so no other claim
// of the topic runs at the same time, and the UPDATE's own check that the
// row is still queued (which PostgreSQL evaluates again on the newest
// version of a row that changed since the statement's snapshot) keeps a
// message from being claimed twice whatever else happens. The only other
// writer of queued rows, Purge, takes the topic lock too, so a serial
// claim never waits for a row lock held by a transaction waiting for it.
// Not locking saves a row lock and its WAL record per claimed message.
//
// claimed_at is the claim statement's start, not the transaction's: an
// AckAndClaim waits for its acked rows and the topic lock first, and a
// claim stamped with that earlier time would look older than it is to the
// reaper's grace and the oldest-claim gauge.
//
// Each row is a claimed message (msgCols and its token) followed by the
// number the gate allowed, whether the topic is limited and, when it is,
// its room (its limit less its running messages before this claim); when
// nothing was claimed one row of NULLs carries those alone. (A LIMIT of 0
// reads nothing.) The OFFSET 0 keeps the planner from pulling the room's
// subquery up into the expressions that use it, which would count the
// topic's running messages once for each of them.
var (
	claimSQL           = claimStatement("", "FOR UPDATE SKIP LOCKED")
	claimFromSQL       = claimStatement(claimFrom, "FOR UPDATE SKIP LOCKED")
	serialClaimSQL     = claimStatement("", "")
	serialClaimFromSQL = claimStatement(claimFrom, "")
)

const claimFrom = "AND (-q.priority, q.available_at, q.id) >= ($6::int, $4::timestamptz, $5::bigint)"

func claimStatement(from, lock string) string {
	return `
	WITH gate AS MATERIALIZED (
		SELECT greatest(coalesce(t.n, 0), 0) AS n, coalesce(t.limited, false) AS limited, t.room, ` + tokenSaltSQL + ` AS salt
		FROM (SELECT 1) one LEFT JOIN LATERAL (
			SELECT CASE
				WHEN t.paused THEN 0
				WHEN t.room IS NULL THEN $2::int
				ELSE least($2::int, t.room)
			END AS n, t.room IS NOT NULL AS limited, t.room
			FROM (SELECT t.paused, CASE WHEN t.concurrency_limit > 0 THEN t.concurrency_limit - (
					SELECT count(*) FROM tw_messages r WHERE r.topic = $1 AND r.state = 'running')::int END AS room
				FROM tw_topics t
				WHERE t.name = $1
				OFFSET 0) t) t ON true
	), claimed AS (
		UPDATE tw_messages m
		SET state = 'running', claimed_by = $3, claimed_at = statement_timestamp(), attempts = m.attempts + 1,
			token = ` + claimTokenSQL("(SELECT salt FROM gate)", "m.id") + `
		WHERE m.ctid = ANY (ARRAY (
				SELECT q.ctid FROM tw_messages q
				WHERE q.topic = $1 AND q.state = 'queued' AND q.available_at <= now() ` + from + `
				ORDER BY -q.priority, q.available_at, q.id
				LIMIT (SELECT n FROM gate)
				` + lock + `))
			AND m.state = 'queued'
		RETURNING ` + msgCols + `, token::text
	)
	SELECT c.*, gate.n, gate.limited, gate.room FROM gate LEFT JOIN claimed c ON true`
}

// A claim token must differ from every other claim's token of the same
// message (it fences a stale claim's acks), be hard to guess, and land
// at a random place in tw_messages_running_token (migration 007: the
// index then cleans itself of the dead entries of acked messages). A
// statement that claims many rows draws one random salt (tokenSaltSQL)
// and gives each row the md5 of the salt and the row's id
// (claimTokenSQL): distinct rows get distinct tokens, two claims get
// unrelated ones, and md5's output is spread evenly. One
// gen_random_uuid() per row took about a quarter of the claim statement's
// time (5.5 us of 19.7 a message in BenchmarkClaimAckLimited, with
// pg_stat_statements).
const tokenSaltSQL = `gen_random_uuid()::text`

// claimTokenSQL is the token of the row whose id is the expression id, in
// a statement whose salt (tokenSaltSQL, drawn once) is the expression
// salt.
func claimTokenSQL(salt, id string) string {
	return `md5(` + salt + ` || ` + id + `::text)::uuid`
}

// fullScanEvery is how often Claim walks a topic's queued index from its
// start even when it has a floor for the topic (see claimFloors).
const fullScanEvery = time.Second

// claimFloors remembers, per topic, where the last claim of this process
// started in the topic's queued index, so the next one starts there
// instead of at the beginning, and whether that claim found the topic
// limited (the next one then takes the serial statements: see
// claimStatement).
//
// Why: every claimed message leaves a dead entry at the head of the queued
// index (its key is the oldest), and nothing but VACUUM removes those
// entries, since btree only cleans a page when an insert fills it and
// inserts land at the tail. A claim that starts at the head walks all of
// them: with autovacuum off or behind, after a few hundred thousand
// messages each claim reads a thousand index pages. Starting at the first
// key the previous claim took skips them.
//
// A floor is a hint and never decides what may be claimed: a message that
// became available behind it (a transaction that committed late with an
// older now(), a row another claimer held and let go) is found by the
// next walk from the start, which comes when a claim from the floor
// returns short, and at least every fullScanEvery. Order stays by key but
// for those stragglers, which wait at most that long. A message submitted
// with a higher priority than the floor's is announced with it (its
// notification names the priority), and the floor is dropped (raised):
// with the listener up, such a message waits for no full scan.
type claimFloors struct {
	mu sync.Mutex
	m  map[string]claimFloor
}

type claimFloor struct {
	prio     int       // priority of the first message the last claim took
	at       time.Time // and its available_at
	id       int64     // and its id; 0 when there is no floor (ids start at 1)
	fullScan time.Time // when the last walk from the start ran
	limited  bool      // the last claim found the topic limited
}

// get returns the floor to claim topic from, or ok false when this claim
// walks from the start (no floor yet, or the last walk is too old), and
// whether the last claim found the topic limited (then the next one
// serialises on the topic lock and locks no rows: see claimStatement).
func (f *claimFloors) get(topic string, now time.Time) (fl claimFloor, ok, limited bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, found := f.m[topic]
	if !found || fl.id == 0 || now.Sub(fl.fullScan) >= fullScanEvery {
		return claimFloor{}, false, fl.limited
	}
	return fl, true, fl.limited
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
		fl.prio, fl.at, fl.id = msgs[0].Priority, msgs[0].AvailableAt, msgs[0].ID
	}
	if fl.id == 0 && fl.fullScan.IsZero() && !fl.limited {
		delete(f.m, topic)
		return
	}
	f.m[topic] = fl
}

// Claim takes up to req.Max available messages of req.Topics for
// req.WorkerID. The topics are served round-robin from a starting topic
// that rotates per call: Max is shared out among them in passes (the first
// topics of the rotation get the remainder) and a topic that yields less
// than its share drops out, its share going to the others on the next
// pass. Each topic's share is claimed in its own transaction; see
// claimLockSQL and claimSQL. Within a topic the messages come by
// (priority descending, available_at, id).
//
// When a later topic fails after earlier ones were claimed, Claim returns
// what it claimed and no error (the claims are running and must reach the
// caller); the error surfaces on the next call.
func (b *Broker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Message, error) {
	msgs, _, err := b.claim(ctx, req, nil)
	return msgs, err
}

var _ broker.AckClaimer = (*Broker)(nil)

// AckAndClaim acks outcomes as Ack does and claims as Claim does, in one
// round trip: the ack statements go first in the transaction that claims
// from the first topic served, so the count of running messages that gates
// the claim no longer includes the acked ones, and one commit serves both.
// When err is set nothing was written.
//
// The transaction locks the acked rows (in id order) before it waits for
// the topic lock. That cannot deadlock: a transaction holding a topic lock
// only ever waits for queued rows (the acked ones are running), and the
// only writer that holds queued rows and waits for anything, Purge, takes
// the topic lock first.
func (b *Broker) AckAndClaim(ctx context.Context, outcomes []broker.Outcome, req broker.ClaimRequest) ([]error, []broker.Message, error) {
	a, err := newAckBatch(outcomes)
	if err != nil {
		return nil, nil, err
	}
	if len(a.ids) == 0 {
		if len(outcomes) > 0 && b.closed.Load() {
			return nil, nil, broker.ErrClosed
		}
		msgs, err := b.Claim(ctx, req)
		if err != nil {
			return nil, nil, err
		}
		return a.lostAll(), msgs, nil
	}
	msgs, errs, err := b.claim(ctx, req, a)
	if err != nil {
		return nil, nil, err
	}
	if errs == nil { // no topic to claim from: the acks alone
		errs, err = b.ack(ctx, a)
		if err != nil {
			return nil, nil, err
		}
	}
	return errs, msgs, nil
}

// claim is Claim, with the acks of a (when not nil) written in the first
// transaction; it returns their errors then (nil when nothing was claimed
// because no topic was named).
func (b *Broker) claim(ctx context.Context, req broker.ClaimRequest, a *ackBatch) ([]broker.Message, []error, error) {
	if req.WorkerID == "" {
		return nil, nil, broker.Invalid("worker id is empty")
	}
	if b.closed.Load() {
		return nil, nil, broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	active := broker.ClaimOrder(req.Topics, b.rr.Add(1)-1)
	if len(active) == 0 {
		return nil, nil, nil
	}

	var (
		out     []broker.Message
		ackErrs []error
	)
	remaining := max(req.Max, 1)
	for remaining > 0 && len(active) > 0 {
		base, extra := remaining/len(active), remaining%len(active)
		var next []string
		for i, topic := range active {
			share := base
			if i < extra {
				share++
			}
			if share == 0 {
				next = append(next, topic)
				continue
			}
			got, err := b.claimTopic(ctx, topic, share, req.WorkerID, a)
			msgs := got.msgs
			if err != nil {
				// Once something was written (claims, or acks that went
				// with an earlier topic), it must reach the caller.
				if a == nil && (len(out) > 0 || ackErrs != nil) {
					b.log.Warn("claim: returning the messages already claimed after an error", "topic", topic, "claimed", len(out), "error", err)
					return out, ackErrs, nil
				}
				return nil, nil, err
			}
			if a != nil {
				// The acks committed with this topic's claim.
				b.announceFreed(stillFree(a.topics, topic, got))
				ackErrs, a = got.errs, nil
			}
			if out == nil {
				out = msgs
			} else {
				out = append(out, msgs...)
			}
			remaining -= len(msgs)
			if len(msgs) == share {
				next = append(next, topic)
			}
		}
		active = next
	}
	return out, ackErrs, nil
}

// stillFree is the topics among freed whose slots an AckAndClaim's acks
// freed and that still have one once its claim of topic (got) took what it
// could: topic is left out when the claim left it full (claimTx.full),
// since no pool could take a slot of it. In one busy process, whose pool
// takes at once what its own acks free, that spares an announcement per
// claim that would only wake its own listener.
func stillFree(freed map[string]bool, topic string, got claimTx) map[string]bool {
	if !freed[topic] || !got.full() {
		return freed
	}
	out := make(map[string]bool, len(freed))
	for t := range freed {
		if t != topic {
			out[t] = true
		}
	}
	return out
}

// claimTopic claims up to n messages of topic in one transaction: the
// topic lock and the claim go as one batch (one round trip), which pgx runs
// as one implicit transaction. With a, the acks go first in the same
// batch, and their errors come back (in the first transaction's claimTx,
// whose msgs are all the messages claimed).
//
// The claim starts at the topic's floor when it has one (claimFloors);
// when that comes back short, a second transaction claims the rest walking
// from the start, so a message behind the floor is never left waiting
// while the queue looks empty.
func (b *Broker) claimTopic(ctx context.Context, topic string, n int, worker string, a *ackBatch) (claimTx, error) {
	started := time.Now()
	floor, hinted, serial := b.floors.get(topic, started)
	first, err := b.claimFrom(ctx, topic, n, worker, a, serial, hinted, floor)
	if err != nil {
		return claimTx{}, err
	}
	b.floors.claimed(topic, !hinted, started, first.allowed, first.limited, first.msgs)
	if !hinted || len(first.msgs) >= first.allowed {
		return first, nil
	}
	more, err := b.claimFrom(ctx, topic, n-len(first.msgs), worker, nil, first.limited, false, claimFloor{})
	if err != nil {
		// The first claims are running and must reach the caller; the
		// error shows again on the next claim.
		b.log.Warn("claim: walking the queue from its start failed", "topic", topic, "error", err)
		return first, nil
	}
	b.floors.claimed(topic, true, started, more.allowed, more.limited, more.msgs)
	first.msgs = append(first.msgs, more.msgs...)
	sortByKey(first.msgs)
	return first, nil
}

// sortByKey sorts msgs by the claim's order: (priority descending,
// available_at, id).
func sortByKey(msgs []broker.Message) {
	sort.Slice(msgs, func(i, j int) bool {
		if msgs[i].Priority != msgs[j].Priority {
			return msgs[i].Priority > msgs[j].Priority
		}
		if !msgs[i].AvailableAt.Equal(msgs[j].AvailableAt) {
			return msgs[i].AvailableAt.Before(msgs[j].AvailableAt)
		}
		return msgs[i].ID < msgs[j].ID
	})
}

// claimTx is what one claim transaction (claimFrom) got.
type claimTx struct {
	msgs    []broker.Message // sorted by key
	allowed int              // how many the gate allowed
	limited bool             // the topic has a concurrency limit
	// room is, when limited, the topic's limit less its running messages
	// as the gate counted them (after the acks that went first, before the
	// claim).
	room int
	errs []error // the acks' errors, when acks went first
}

// full reports whether t left its topic with no free slot: it is limited
// and the claim took all the room there was.
func (t claimTx) full() bool { return t.limited && t.room <= len(t.msgs) }

// claimFrom is one claim transaction of claimTopic, from the key of floor
// when hinted, serialised on the topic lock without locking rows when
// serial is set (see claimStatement).
func (b *Broker) claimFrom(ctx context.Context, topic string, n int, worker string, a *ackBatch,
	serial, hinted bool, floor claimFloor) (claimTx, error) {
	var (
		errs    []error
		allowed int32
		limited bool
		room    pgtype.Int4
	)
	lockSQL, fullSQL, fromSQL := claimLockSQL, claimSQL, claimFromSQL
	if serial {
		lockSQL, fullSQL, fromSQL = serialLockSQL, serialClaimSQL, serialClaimFromSQL
	}
	out := make([]broker.Message, 0, n)
	err := b.run(ctx, "claim", func(c *pgx.Conn) error {
		out = out[:0]
		batch := &pgx.Batch{}
		if a != nil {
			a.queue(batch)
		}
		batch.Queue(lockSQL, topic)
		if hinted {
			batch.Queue(fromSQL, topic, n, worker, floor.at, floor.id, -floor.prio)
		} else {
			batch.Queue(fullSQL, topic, n, worker)
		}
		br := c.SendBatch(ctx, batch)
		if a != nil {
			var err error
			if errs, err = a.read(br); err != nil {
				br.Close()
				return err
			}
		}
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		rows, err := br.Query()
		if err != nil {
			br.Close()
			return err
		}
		var scan *messageScanner
		for rows.Next() {
			if rows.RawValues()[0] == nil { // nothing claimed: the gate alone
				if err := rows.Scan(gateOnly(len(rows.FieldDescriptions()), &allowed, &limited, &room)...); err != nil {
					rows.Close()
					br.Close()
					return err
				}
				continue
			}
			if scan == nil {
				scan = newMessageScanner(true, &allowed, &limited, &room)
			}
			m, err := scan.scan(rows)
			if err != nil {
				rows.Close()
				br.Close()
				return err
			}
			out = append(out, m)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	if err != nil {
		return claimTx{}, err
	}
	sortByKey(out)
	return claimTx{msgs: out, allowed: int(allowed), limited: limited, room: int(room.Int32), errs: errs}, nil
}

// gateOnly is the scan destinations of a claim row that claimed nothing:
// the last three of its n columns into gate, limited and room, the others
// skipped.
func gateOnly(n int, gate *int32, limited *bool, room *pgtype.Int4) []any {
	dest := make([]any, n)
	dest[n-3], dest[n-2], dest[n-1] = gate, limited, room
	return dest
}
