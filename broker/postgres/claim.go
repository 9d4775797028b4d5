package postgres

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/taskhost/taskhost/broker"
)

// serialLockSQL takes a topic's serialisation lock: every claim of the
// topic takes it first, in a statement of its own. In READ COMMITTED each
// statement reads a snapshot taken when it starts, so the claim that
// follows sees every claim row the lock's previous holders committed:
// the limit's count is exact, and no message is claimed twice. (Locking
// in the same statement as the claim would read a snapshot taken before
// the lock was granted.) The other writers of queued rows that could race
// a claim take it too: Purge, and a cancel of queued messages.
//
// A topic's row is inserted with its first message, so the lock finds no
// row while that submit has not committed; if it commits before the
// statement that follows, that statement would see the topic and its
// message and run unserialised beside a cancel or another claim. The lock
// therefore records, for the rest of its transaction, the topic it locked
// (in the setting topicLocked names, empty when it found no row), and the
// statements it serialises read the topic only when the setting names it
// (lockedTopic).
const serialLockSQL = `SELECT set_config('` + topicLocked + `', coalesce(max(l.name), ''), true)
	FROM (SELECT name FROM tw_topics WHERE name = $1 FOR UPDATE) l`

// topicLocked is the setting in which serialLockSQL records the topic it
// locked.
const topicLocked = `taskhost.topic_locked`

// lockedTopic is the condition that serialLockSQL locked the topic
// (an expression) earlier in the transaction.
func lockedTopic(topic string) string {
	return `current_setting('` + topicLocked + `', true) = ` + topic
}

// The claim statements claim up to $2 of topic $1's oldest available
// queued messages for worker $3: none when the topic is paused or unknown,
// at most limit - running when it is limited (running: the messages claim
// rows hold, and rows made running otherwise). The walk reads the
// partial queued index in (-priority, available_at, id) order (the highest
// priority first), passing by the messages the topic's claim rows hold
// (held ones stay queued: see claims.go); claimFromSQL starts it at the
// key ($6 -priority, $4 available_at, $5 id) (see claimFloors). The
// messages taken go into one row of tw_claims, with a new key: a row of
// the topic that outcomes left empty, when one is not locked (free:
// reused), else a new one (added); their rows are not written. Writing
// over the empty rows keeps the table as small as the claims outstanding
// without VACUUM: inserted and deleted, its rows left dead tuples and
// pages that only VACUUM gives back, and the outcomes' cached plans read
// it whole (bench/JOURNAL.md). A claim runs only after serialLockSQL, so no other claim of the
// topic runs at the same time.
//
// claimed_at is the claim statement's start, not the transaction's: an
// AckAndClaim waits for its acked rows and the topic lock first, and a
// claim stamped with that earlier time would look older than it is to the
// reaper's grace and the oldest-claim gauge.
//
// Each row is a claimed message (msgCols, as a reader sees it held, and
// its token) followed by the number the gate allowed, whether the topic
// is limited and, when it is, its room (its limit less its running
// messages before this claim); when nothing was claimed one row of NULLs
// carries those alone. (A LIMIT of 0 reads nothing.) The OFFSET 0 keeps
// the planner from pulling the room's subquery up into the expressions
// that use it, which would count the topic's running messages once for
// each of them.
var (
	claimSQL     = claimStatement("")
	claimFromSQL = claimStatement(claimFrom)
)

const claimFrom = "AND (-q.priority, q.available_at, q.id) >= ($6::int, $4::timestamptz, $5::bigint)"

func claimStatement(from string) string {
	return `
	WITH gate AS MATERIALIZED (
		SELECT greatest(coalesce(t.n, 0), 0) AS n, coalesce(t.limited, false) AS limited, t.room
		FROM (SELECT 1) one LEFT JOIN LATERAL (
			SELECT CASE
				WHEN t.paused THEN 0
				WHEN t.room IS NULL THEN $2::int
				ELSE least($2::int, t.room)
			END AS n, t.room IS NOT NULL AS limited, t.room
			FROM (SELECT t.paused, CASE WHEN t.concurrency_limit > 0 THEN t.concurrency_limit - ((
					SELECT count(*) FROM tw_messages r WHERE r.topic = $1 AND r.state = 'running') + ` + heldCount("$1") + `)::int END AS room
				FROM tw_topics t
				WHERE t.name = $1 AND ` + lockedTopic("$1") + `
				OFFSET 0) t) t ON true
	), picked AS MATERIALIZED (
		SELECT q.* FROM tw_messages q
		WHERE q.topic = $1 AND q.state = 'queued' AND q.available_at <= now() ` + from + `
			AND q.id NOT IN ` + heldIDs("$1") + `
		ORDER BY -q.priority, q.available_at, q.id
		LIMIT (SELECT n FROM gate)
	), taken AS MATERIALIZED (
		SELECT array_agg(id ORDER BY id) AS ids, ` + claimKeySQL + ` AS key FROM picked HAVING count(*) > 0
	), free AS MATERIALIZED (
		SELECT f.id FROM tw_claims f WHERE f.topic = $1 AND f.ids = '{}' LIMIT 1 FOR UPDATE SKIP LOCKED
	), reused AS (
		UPDATE tw_claims r SET worker = $3, claimed_at = statement_timestamp(), key = k.key, ids = k.ids, took = NULL
		FROM taken k
		WHERE r.id = (SELECT id FROM free)
		RETURNING r.id, r.key, r.claimed_at
	), added AS (
		INSERT INTO tw_claims (topic, worker, claimed_at, key, ids)
		SELECT $1, $3, statement_timestamp(), k.key, k.ids FROM taken k WHERE NOT EXISTS (SELECT 1 FROM free)
		RETURNING id, key, claimed_at
	), c AS (
		SELECT * FROM reused UNION ALL SELECT * FROM added
	)
	SELECT p.id, p.topic, p.task, p.payload::text, p.headers::text, 'running'::text, p.attempts + 1, p.max_attempts,
		$3::text, c.claimed_at, p.available_at, p.created_at, p.finished_at, p.last_error, p.result::text,
		p.suspect, p.waiting_since, p.cancel_requested_at, p.priority, p.unique_key, c.id, c.key # p.id,
		gate.n, gate.limited, gate.room
	FROM gate LEFT JOIN (picked p CROSS JOIN c) ON true`
}

// Claim takes up to req.Max available messages of req.Topics for
// req.WorkerID. The topics are served round-robin from a starting topic
// that rotates per call: Max is shared out among them in passes (the first
// topics of the rotation get the remainder) and a topic that yields less
// than its share drops out, its share going to the others on the next
// pass. Each topic's share is claimed in its own transaction; see
// serialLockSQL and claimSQL. Within a topic the messages come by
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
// The transaction locks the acked messages' claim rows (in id order) and
// their rows before it waits for the topic lock. That cannot deadlock: a
// transaction holding a topic lock waits for no row (a claim writes only
// its claim row, an empty one only when no one holds it locked; Purge
// passes locked rows by; a cancel waits for the
// topic lock only while it holds a queued row no claim holds).
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
	active, idle := b.idle.split(broker.ClaimOrder(req.Topics, b.rr.Add(1)-1))
	if len(active) == 0 && len(idle) > 0 {
		// No claim to look at the idle topics with: a read of its own.
		woke, err := b.idle.peek(ctx, b, idle)
		if err != nil {
			return nil, nil, err
		}
		active, idle = woke, nil
	}
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
			got, err := b.claimTopic(ctx, topic, share, req.WorkerID, a, idle)
			msgs := got.msgs
			if err == nil {
				b.idle.claimed(topic, len(msgs) > 0)
				if idle != nil {
					// The idle topics that may have a message now are
					// claimed in the next pass.
					next = append(next, got.woke...)
					idle = nil
				}
			}
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
func (b *Broker) claimTopic(ctx context.Context, topic string, n int, worker string, a *ackBatch, idle []string) (claimTx, error) {
	started := time.Now()
	floor, hinted := b.floors.get(topic, started)
	first, err := b.claimFrom(ctx, topic, n, worker, a, idle, hinted, floor)
	if err != nil {
		return claimTx{}, err
	}
	b.floors.claimed(topic, !hinted, started, first.allowed, first.limited, first.msgs)
	if !hinted || len(first.msgs) >= first.allowed {
		return first, nil
	}
	more, err := b.claimFrom(ctx, topic, n-len(first.msgs), worker, nil, nil, false, claimFloor{})
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
	// woke is the idle topics looked at with the claim (idleTopics) that
	// may have a message to claim.
	woke []string
}

// full reports whether t left its topic with no free slot: it is limited
// and the claim took all the room there was.
func (t claimTx) full() bool { return t.limited && t.room <= len(t.msgs) }

// claimFrom is one claim transaction of claimTopic, from the key of floor
// when hinted (see claimStatement), with a look at the idle topics idle
// before the topic's lock (idleTopics).
func (b *Broker) claimFrom(ctx context.Context, topic string, n int, worker string, a *ackBatch, idle []string,
	hinted bool, floor claimFloor) (claimTx, error) {
	var (
		errs    []error
		cid     int64 // a claimed row's claim row, and its key XOR the message's id
		ckey    int64
		allowed int32
		limited bool
		room    pgtype.Int4
		woke    []string
	)
	out := make([]broker.Message, 0, n)
	err := b.run(ctx, "claim", func(c *pgx.Conn) error {
		out, woke = out[:0], nil
		batch := &pgx.Batch{}
		if a != nil {
			a.queue(batch)
		}
		if len(idle) > 0 {
			batch.Queue(peekSQL, idle)
		}
		batch.Queue(serialLockSQL, topic)
		if hinted {
			batch.Queue(claimFromSQL, topic, n, worker, floor.at, floor.id, -floor.prio)
		} else {
			batch.Queue(claimSQL, topic, n, worker)
		}
		br := c.SendBatch(ctx, batch)
		if a != nil {
			var err error
			if errs, err = a.read(br); err != nil {
				br.Close()
				return err
			}
		}
		if len(idle) > 0 {
			rows, err := br.Query()
			if err == nil {
				woke, err = pgx.CollectRows(rows, pgx.RowTo[string])
			}
			if err != nil {
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
				scan = newMessageScanner(false, &cid, &ckey, &allowed, &limited, &room)
			}
			m, err := scan.scan(rows)
			if err != nil {
				rows.Close()
				br.Close()
				return err
			}
			m.Token = formatClaimToken(cid, ckey)
			// The outcomes of the message lock its claim row (takeCTEs).
			m.ClaimGroup = cid
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
	return claimTx{msgs: out, allowed: int(allowed), limited: limited, room: int(room.Int32), errs: errs,
		woke: b.idle.looked(idle, woke)}, nil
}

// gateOnly is the scan destinations of a claim row that claimed nothing:
// the last three of its n columns into gate, limited and room, the others
// skipped.
func gateOnly(n int, gate *int32, limited *bool, room *pgtype.Int4) []any {
	dest := make([]any, n)
	dest[n-3], dest[n-2], dest[n-1] = gate, limited, room
	return dest
}
