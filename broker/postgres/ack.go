package postgres

import (
	"context"
	"errors"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// releaseLocksSQL deletes the locks held under the claims ($1 ids, $2
// tokens) that no longer hold their message. It runs as its own statement
// after the claim-ending one, so it reads a snapshot that includes any
// lock an AcquireLock committed while the claim-ending statement waited
// for it (AcquireLock holds the claim row, or the message's row made
// running the old way, FOR SHARE).
var releaseLocksSQL = `
	DELETE FROM tw_locks l
	USING unnest($1::bigint[], $2::text[]) AS u(id, tok)
	WHERE l.message_id = u.id AND l.token::text = u.tok
		AND NOT ` + lockHeld

// ackTakeCTEs is takeCTEs for an ack statement, which counts what it
// ends in tw_topic_counts itself (ackCounts): a claim row it takes from
// also sets taskhost.topic_counts_kept to the schema until the
// transaction ends, which says so, and the update and delete triggers of
// tw_messages, whose WHEN reads it (migration 025), are then not called.
// The rows an ack changes are counted once either way: the held ones it
// ends (the only ones that change a count) are those t took, so the
// setting is set whenever there are any, before the statement ends and
// its triggers' WHEN is read; a row made running the old way counts in
// neither count. That the setting holds for the rest of the transaction is
// right because nothing after an ack in its transaction (the release of
// its claims' locks, the claim of an AckAndClaim) updates or deletes a
// message.
//
// Counted in the statement, an ack adds to one row of tw_topic_counts;
// counted by the triggers, it cost two trigger calls reading transition
// tables, in the transaction of nearly every claim.
func ackTakeCTEs(ids, cids, keys string) string {
	return takeCTEsAnd(ids, cids, keys, `set_config('taskhost.topic_counts_kept', current_schema(), true) IS NOT NULL`)
}

// ackCounts is the CTE n of an ack statement: it takes the queued rows the
// ack ended (those of ended, a CTE of the statement with the columns topic
// and taken: the row was held by a claim row, so queued) off their topics'
// counts, in a shard of each topic (countsShard). An ack ends no dead
// row.
func ackCounts(ended string) string {
	return `n AS (
		INSERT INTO tw_topic_counts AS c (topic, shard, queued, dead)
		SELECT e.topic, ` + countsShard("e.topic") + `, -count(*), 0 FROM ` + ended + ` e WHERE e.taken GROUP BY e.topic
		ON CONFLICT (topic, shard) DO UPDATE SET queued = c.queued + excluded.queued
	)`
}

// countsShard is the SQL expression of the shard of tw_topic_counts a
// statement adds the changes of topic (an expression) to, and locks until
// its transaction ends: the first of the 16, from the connection's own,
// whose lock it gets without waiting, else the connection's own, waiting
// for it. The locks are tw_topic_counts_add's (migration 025), which the
// triggers call: countsLock.
func countsShard(topic string) string {
	return `coalesce(
			(SELECT (pg_backend_pid() + g) % 16 FROM generate_series(0, 15) g
				WHERE pg_try_advisory_xact_lock(` + countsLock(topic, "(pg_backend_pid() + g) % 16") + `) LIMIT 1),
			(SELECT pg_backend_pid() % 16 FROM pg_advisory_xact_lock(` + countsLock(topic, "pg_backend_pid() % 16") + `)))`
}

// countsLock is the key of the advisory lock of a shard of topic's counts
// (expressions), as tw_topic_counts_add takes it.
func countsLock(topic, shard string) string {
	return `hashtextextended('taskhost topic counts ' || current_schema() || ' ' || ` + topic + `, ` + shard + `)`
}

// ackSQL marks done the messages whose claims are in the arrays $1 ids
// and $2 tokens (their claim rows and keys $5 and $6: takeCTEs), storing
// the results $3, and returns the ordinals $4 of the outcomes it applied,
// with their messages' topics (ackCounts counts them).
var ackSQL = `WITH ` + ackTakeCTEs("$1", "$5", "$6") + `, a AS (
	UPDATE tw_messages m
	SET state = 'done', finished_at = now(), result = u.res::jsonb, token = NULL, ` + heldSet + `
	FROM unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::bigint[], $6::bigint[]) AS u(id, tok, res, ord, cid, ckey)
		LEFT JOIN ` + hJoin("u") + `
	WHERE m.id = ANY ($1::bigint[]) AND m.id = u.id AND ` + heldBy("u.tok") + `
	RETURNING u.ord, m.topic, h.id IS NOT NULL AS taken
), ` + ackCounts("a") + `
	SELECT ord, topic FROM a`

// ackReportsSQL is ackSQL (its claim rows and keys $22 and $23) storing,
// in the same statement, the reports
// given as the arrays of reportCTEs from $5 of the outcomes it applied: a
// report rides on its outcome, and is stored only when the outcome is.
// The report arrays line up with the ack's (element i is the report of
// outcome i; its ref is the outcome's ordinal, and its status is empty
// when the outcome has none), so that one unnest reads both.
//
// A report that $21 marks plain (plainReport) and that names the
// message's task and topic is kept in the row, in the report_ columns,
// with an id from the reports' sequence (migration 019); every other
// report is inserted into tw_report_rows by reportCTEs (a ends with
// whether the row kept one). A kept report is not checked against
// tw_report_rows for its key: a report of the same attempt is stored apart
// only after its outcome failed (a lost report), and AddReports checks the
// rows (held).
var ackReportsSQL = `WITH ` + ackTakeCTEs("$1", "$22", "$23") + `, a AS (
	UPDATE tw_messages m
	SET state = 'done', finished_at = now(), result = v.ares::jsonb, token = NULL, ` + heldSet + `,
		` + heldReportSet("v.keep AND v.task = m.task AND v.topic = m.topic") + `
	FROM unnest($1::bigint[], $2::text[], $3::text[], $4::int[], ` + reportArrays(5) + `, $21::bool[], $22::bigint[], $23::bigint[])
		AS v(id, tok, ares, ord, ` + reportArrayCols + `, keep, cid, ckey) LEFT JOIN ` + hJoin("v") + `
	WHERE m.id = ANY ($1::bigint[]) AND m.id = v.id AND ` + heldBy("v.tok") + `
	RETURNING v.ord, m.topic, m.report_id IS NOT NULL AS held, h.id IS NOT NULL AS taken
), ` + reportCTEs(5, "x.status <> '' AND x.ref IN (SELECT ord FROM a WHERE NOT held)") + `, ` + ackCounts("a") + `
	SELECT ord, topic FROM a`

// endOneSQL wraps the claim-ending UPDATE sql of message $1 under token
// $2, which takes params parameters and reads the claim that held it as
// h (takeCTEs, heldBy), into one statement that takes the message out of
// its claim row first (the row's id and key are the two parameters after
// params, or after the report's arrays) and, with withReport, also stores
// the report given as the arrays of reportCTEs that follow the params,
// only when the UPDATE matched (applied); it returns what sql returns.
func endOneSQL(sql string, params int, withReport bool) string {
	next := params + 1
	reports := ""
	if withReport {
		reports = `, ` + reportCTEs(next, "EXISTS (SELECT 1 FROM a)")
		next += reportParams
	}
	return `WITH ` + takeCTEs("ARRAY[$1::bigint]", "ARRAY[$"+strconv.Itoa(next)+"::bigint]", "ARRAY[$"+strconv.Itoa(next+1)+"::bigint]") + `,
	a AS (` + sql + `)` + reports + `
	SELECT * FROM a`
}

// endOneWhere is the FROM and WHERE of the claim-ending UPDATE of message
// $1 under token $2 that endOneSQL wraps: the claim row takeCTEs took it
// from, if any, is h.
var endOneWhere = `FROM (SELECT 1) one LEFT JOIN t h ON $1 = ANY (h.took)
			WHERE m.id = $1 AND ` + heldBy("$2::text")

// lockInIDOrderSQL locks the messages $1 (sorted) in id order. It goes
// before ackKeptSQL when the call acks keyed messages (Outcome.Keyed):
// that statement deletes the unkeyed ones first and updates the keyed ones
// after, which would lock them out of id order, and a reaper pass, which
// locks in id order, could deadlock with it. A call without keyed
// messages locks its rows in id order without it.
const lockInIDOrderSQL = `SELECT 1 FROM tw_messages WHERE id = ANY ($1::bigint[]) ORDER BY id FOR UPDATE`

// ackBatch is an Ack call's outcomes as its statements take them: the
// distinct claims with a token, sorted by id.
type ackBatch struct {
	n       int // outcomes in the call
	ids     []int64
	toks    []string
	results []*string
	ords    []int32
	// cids and keys: the claim rows and keys of toks (claimArgs).
	cids, keys []int64
	// reports of the claims sent, if any, one per claim, with their
	// outcomes' ordinals: the arrays of ackKeptSQL when kept is set (every
	// claim sent carries a plain report), else of ackReportsSQL, with
	// plain marking the plain ones.
	reports reportArgs
	withRep bool
	plain   []bool
	kept    []any
	// keyed: some claim sent is of a keyed message (Outcome.Keyed); see
	// lockFirst.
	keyed bool
	// topics the applied outcomes freed a slot of, read by read.
	topics map[string]bool
}

// newAckBatch checks outcomes (a result that is not JSON, or an invalid
// report, is broker.ErrInvalid) and arranges them for ackSQL, ackKeptSQL
// when every claim carries a plain report, or ackReportsSQL when some
// carry a report.
func newAckBatch(outcomes []broker.Outcome) (*ackBatch, error) {
	if err := broker.CheckOutcomes(outcomes); err != nil {
		return nil, err
	}
	type entry struct {
		ord int32
		id  int64
		tok string
		res *string
		rep *broker.Report
		key bool
	}
	var send []entry
	seen := make(map[broker.Claim]bool, len(outcomes))
	for i, o := range outcomes {
		if o.Claim.Token == "" || seen[o.Claim] {
			continue
		}
		seen[o.Claim] = true
		var res *string
		if len(o.Result) > 0 {
			s := string(o.Result)
			res = &s
		}
		send = append(send, entry{ord: int32(i), id: o.Claim.ID, tok: o.Claim.Token, res: res, rep: o.Report, key: o.Keyed})
	}
	// Lock the rows in id order, as the reaper does, so the two never
	// deadlock.
	sort.Slice(send, func(i, j int) bool { return send[i].id < send[j].id })
	a := &ackBatch{
		n:       len(outcomes),
		ids:     make([]int64, len(send)),
		toks:    make([]string, len(send)),
		results: make([]*string, len(send)),
		ords:    make([]int32, len(send)),
	}
	// The reports line up with the claims sent (ackReportsSQL): a claim
	// without one has an empty report, which its status (none) marks.
	reps := make([]*broker.Report, len(send))
	a.plain = make([]bool, len(send))
	allPlain := len(send) > 0
	for i, e := range send {
		a.ids[i], a.toks[i], a.results[i], a.ords[i] = e.id, e.tok, e.res, e.ord
		reps[i], a.plain[i] = e.rep, plainReport(e.rep, e.res)
		a.withRep = a.withRep || e.rep != nil
		a.keyed = a.keyed || e.key
		allPlain = allPlain && a.plain[i]
	}
	a.cids, a.keys = claimArgs(a.toks)
	if allPlain {
		a.kept = keptArgs(reps)
		return a, nil
	}
	if a.withRep {
		vals := make([]broker.Report, len(reps))
		for i, r := range reps {
			if r != nil {
				vals[i] = *r
			}
		}
		var err error
		if a.reports, err = newReportArgs(vals, a.ords); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// lostAll is the answer when nothing was applied.
func (a *ackBatch) lostAll() []error {
	errs := make([]error, a.n)
	for i := range errs {
		errs[i] = broker.ErrClaimLost
	}
	return errs
}

// lockFirst reports whether the ack goes after lockInIDOrderSQL: when it
// is ackKeptSQL and some claim is of a keyed message.
func (a *ackBatch) lockFirst() bool { return a.kept != nil && a.keyed }

// queue adds the ack (with the reports) and the release of the claims'
// locks to batch. A claim row the ack empties stays, for the next claim
// of its topic to reuse (claimStatement).
func (a *ackBatch) queue(batch *pgx.Batch) {
	switch {
	case a.kept != nil:
		if a.lockFirst() {
			batch.Queue(lockInIDOrderSQL, a.ids)
		}
		batch.Queue(ackKeptSQL, append(append([]any{a.ids, a.toks, a.results, a.ords}, a.kept...), a.cids, a.keys)...)
	case a.withRep:
		a.reports.queueLocks(batch)
		args := append([]any{a.ids, a.toks, a.results, a.ords}, a.reports.arrays...)
		batch.Queue(ackReportsSQL, append(args, a.plain, a.cids, a.keys)...)
	default:
		batch.Queue(ackSQL, a.ids, a.toks, a.results, a.ords, a.cids, a.keys)
	}
	batch.Queue(releaseLocksSQL, a.ids, a.toks)
}

// read reads the answers of the statements queue added.
func (a *ackBatch) read(br pgx.BatchResults) ([]error, error) {
	errs := a.lostAll()
	if a.lockFirst() {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	if a.withRep && a.kept == nil {
		if err := a.reports.readLocks(br); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	a.topics = make(map[string]bool, 1)
	for rows.Next() {
		var ord int32
		var topic string
		if err := rows.Scan(&ord, &topic); err != nil {
			rows.Close()
			return nil, err
		}
		errs[ord] = nil
		a.topics[topic] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	return errs, nil
}

// Ack marks the outcomes' messages done, storing their results and the
// reports of those it applied, in one statement, and releases the locks
// held under those claims in the same transaction. It returns one error
// per outcome: nil, or broker.ErrClaimLost when the claim no longer holds
// its message (a repeated claim in the batch loses after its first). A result that is not JSON fails the whole call
// with broker.ErrInvalid before anything changes.
func (b *Broker) Ack(ctx context.Context, outcomes []broker.Outcome) ([]error, error) {
	a, err := newAckBatch(outcomes)
	if err != nil {
		return nil, err
	}
	return b.ack(ctx, a)
}

func (b *Broker) ack(ctx context.Context, a *ackBatch) ([]error, error) {
	var errs []error
	err := b.run(ctx, "ack", func(c *pgx.Conn) error {
		if len(a.ids) == 0 {
			errs = a.lostAll()
			return nil
		}
		batch := &pgx.Batch{}
		a.queue(batch)
		br := c.SendBatch(ctx, batch)
		var err error
		if errs, err = a.read(br); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	if err != nil {
		return nil, err
	}
	b.announceFreed(a.topics)
	return errs, nil
}

// announceFreed announces the topics among freed that have a concurrency
// limit (as the last claim of this process found them), after the
// transaction that freed their slots committed: a pool of another process
// waiting for a slot of such a topic claims at once instead of at its
// fallback poll. Topics without a limit are not announced: a finished
// message of theirs lets no one claim more.
func (b *Broker) announceFreed(freed map[string]bool) {
	var reqs []broker.SubmitRequest
	for topic := range freed {
		if b.floors.isLimited(topic) {
			reqs = append(reqs, broker.SubmitRequest{Topic: topic})
		}
	}
	if len(reqs) > 0 {
		b.announce.add(reqs)
	}
}

// endClaimTopic runs the claim-ending UPDATE sql (its $1 and $2 are the
// claim's id and token, args the rest), which returns the message's topic
// (and more columns, read into dest after topic), storing report (when
// not nil) in the same statement when it applies (withReport), and
// releases the claim's locks, in one transaction; broker.ErrClaimLost when
// the UPDATE matched nothing.
func (b *Broker) endClaimTopic(ctx context.Context, op string, c broker.Claim, report *broker.Report, dest []any, sql string, args ...any) error {
	if err := broker.CheckOutcomeReport(c, report); err != nil {
		return err
	}
	var ra reportArgs
	sql = endOneSQL(sql, 2+len(args), report != nil)
	if report != nil {
		var err error
		if ra, err = newReportArgs([]broker.Report{*report}, nil); err != nil {
			return err
		}
		args = append(args, ra.arrays...)
	}
	cid, key := parseClaimToken(c.Token)
	args = append(args, cid, key)
	if c.Token == "" {
		if b.closed.Load() {
			return broker.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return broker.ErrClaimLost
	}
	return b.run(ctx, op, func(conn *pgx.Conn) error {
		batch := &pgx.Batch{}
		ra.queueLocks(batch)
		batch.Queue(sql, append([]any{c.ID, c.Token}, args...)...)
		batch.Queue(releaseLocksSQL, []int64{c.ID}, []string{c.Token})
		br := conn.SendBatch(ctx, batch)
		if err := ra.readLocks(br); err != nil {
			br.Close()
			return err
		}
		lost := false
		err := br.QueryRow().Scan(dest...)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			lost = true
		case err != nil:
			br.Close()
			return err
		}
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		if err := br.Close(); err != nil {
			return err
		}
		if lost {
			return broker.ErrClaimLost
		}
		return nil
	})
}

// Nack ends an attempt without success, recording req.Error as the last
// error and storing req.Report with it. With Requeue the message goes back to the queue, available after
// Delay, its claim fields cleared and its attempts kept; without, it ends
// dead when its topic dead-letters and failed otherwise. With Cancel, or
// with Requeue when its cancel was requested, it ends cancelled.
func (b *Broker) Nack(ctx context.Context, req broker.NackRequest) error {
	if err := broker.CheckDelay(req.Delay); err != nil {
		return err
	}
	req.Error = broker.CleanText(req.Error)
	if req.Cancel {
		return b.endClaimFreeing(ctx, "nack", req.Claim, req.Report, `
			UPDATE tw_messages m
			SET state = 'cancelled', finished_at = now(), token = NULL, last_error = $3, suspect = $4, waiting_since = NULL,
				`+heldSet+`
			`+endOneWhere+`
			RETURNING m.topic`,
			cancelReason(req.Error), req.Suspect)
	}
	if req.Requeue {
		// The requeued message is announced as a submit is, with its
		// delay, so that the pools that wait for announcements claim it
		// when it is due rather than at their fallback poll. A message
		// whose cancel was requested ends cancelled instead, freeing its
		// slot.
		var topic, state string
		err := b.endClaimTopic(ctx, "nack", req.Claim, req.Report, []any{&topic, &state}, `
			UPDATE tw_messages m
			SET state = CASE WHEN m.cancel_requested_at IS NULL THEN 'queued' ELSE 'cancelled' END,
				claimed_by = CASE WHEN m.cancel_requested_at IS NULL THEN NULL ELSE `+heldClaimedBy+` END,
				claimed_at = CASE WHEN m.cancel_requested_at IS NULL THEN NULL ELSE `+heldClaimedAt+` END,
				token = NULL,
				finished_at = CASE WHEN m.cancel_requested_at IS NULL THEN NULL ELSE now() END,
				available_at = CASE WHEN m.cancel_requested_at IS NULL
					THEN now() + $3::bigint * interval '1 microsecond' ELSE m.available_at END,
				last_error = CASE WHEN m.cancel_requested_at IS NULL THEN $4 ELSE $8 END,
				attempts = CASE WHEN $5 AND m.cancel_requested_at IS NULL THEN `+notRunAttempts+` ELSE `+heldAttempts+` END,
				suspect = $6,
				waiting_since = CASE WHEN m.cancel_requested_at IS NULL THEN $7::timestamptz END
			`+endOneWhere+`
			RETURNING m.topic, m.state`,
			micros(req.Delay), req.Error, req.NotRun, req.Suspect, req.WaitingSince, cancelReason(req.Error))
		switch {
		case err != nil:
		case state == broker.StateCancelled:
			b.announceFreed(map[string]bool{topic: true})
		default:
			b.announce.add([]broker.SubmitRequest{{Topic: topic, Delay: req.Delay}})
		}
		return err
	}
	return b.endClaimFreeing(ctx, "nack", req.Claim, req.Report, `
		UPDATE tw_messages m
		SET state = CASE
				WHEN coalesce((SELECT t.dead_letter_enabled FROM tw_topics t WHERE t.name = m.topic), true)
				THEN 'dead' ELSE 'failed' END,
			finished_at = now(), token = NULL, last_error = $3, suspect = $4, waiting_since = NULL, `+heldSet+`
		`+endOneWhere+`
		RETURNING m.topic`,
		req.Error, req.Suspect)
}

// cancelReason is the last error of a cancelled attempt that said reason.
func cancelReason(reason string) string {
	if reason == "" {
		return broker.CancelledError
	}
	return reason
}

// endClaimFreeing is endClaimTopic for a statement that ends the message
// (it leaves the running state for good), announcing the slot it freed
// (announceFreed).
func (b *Broker) endClaimFreeing(ctx context.Context, op string, c broker.Claim, report *broker.Report, sql string, args ...any) error {
	var topic string
	err := b.endClaimTopic(ctx, op, c, report, []any{&topic}, sql, args...)
	if err == nil {
		b.announceFreed(map[string]bool{topic: true})
	}
	return err
}

// DeadLetter ends an attempt dead with reason as its last error, whatever
// the topic's dead-letter setting, storing report with it.
func (b *Broker) DeadLetter(ctx context.Context, c broker.Claim, reason string, report *broker.Report) error {
	reason = broker.CleanText(reason)
	return b.endClaimFreeing(ctx, "dead letter", c, report, `
		UPDATE tw_messages m
		SET state = 'dead', finished_at = now(), token = NULL, last_error = $3, suspect = false, waiting_since = NULL,
			`+heldSet+`
		`+endOneWhere+`
		RETURNING m.topic`,
		reason)
}
