package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/taskhost/taskhost/broker"
)

// Submits with a unique key (see broker.SubmitRequest.UniqueKey and
// migration 012). They run in a transaction of their own (the broker's
// Submit, SubmitBatch and schedule fires) or the application's (pgtx), and
// take up to three statements:
//
//  1. insertSQL inserts the message unless another holds the key in its
//     unique states (ON CONFLICT on tw_messages_unique: a concurrent holder
//     that has not committed yet makes it wait, then skip), and moves the
//     key's row in tw_unique_keys to it unless the request's window finds
//     the row's latest message too recent.
//  2. When the message was not inserted, holderSQL reads the holder (in a
//     new snapshot, which sees it). When the holder left its states in
//     between, the submit starts over.
//  3. When the window refused, undoSQL deletes the message inserted in
//     step 1, unseen by anyone (the transaction has not committed), and
//     reads the key's latest message.
//
// No statement raises a conflict, so the application's transaction stays
// usable.
type keyedSQL struct {
	insert, holder, undo string
}

func newKeyedSQL(schema string) keyedSQL {
	s := pgx.Identifier{schema}.Sanitize()
	return keyedSQL{
		// $1..$8 as insertMessageSQL; $9 key, $10 unique states, $11
		// window µs or NULL.
		insert: `
	WITH topic AS (
		INSERT INTO ` + s + `.tw_topics (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
	), ins AS (
		INSERT INTO ` + s + `.tw_messages (topic, task, payload, headers, max_attempts, available_at, created_at,
			priority, unique_key, unique_states)
		VALUES ($1, $2, $3::text::jsonb, $4::text::jsonb, $5, ` + availableSQL + `, now(), $8, $9, $10::text[])
		ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state = ANY (unique_states) DO NOTHING
		RETURNING id, created_at
	), k AS (
		INSERT INTO ` + s + `.tw_unique_keys AS u (key, message_id, created_at)
		SELECT $9, id, created_at FROM ins
		ON CONFLICT (key) DO UPDATE SET message_id = excluded.message_id, created_at = excluded.created_at
		WHERE $11::bigint IS NULL OR u.created_at <= now() - $11::bigint * interval '1 microsecond'
		RETURNING 1
	)
	SELECT id, EXISTS (SELECT 1 FROM k) FROM ins`,
		holder: `SELECT id FROM ` + s + `.tw_messages
	WHERE unique_key = $1 AND unique_key IS NOT NULL AND state = ANY (unique_states)`,
		undo: `
	WITH d AS (DELETE FROM ` + s + `.tw_messages WHERE id = $1)
	SELECT message_id FROM ` + s + `.tw_unique_keys WHERE key = $2`,
	}
}

// keyedTries bounds how often a keyed submit starts over because the
// holder it met left its unique states before it could be read.
const keyedTries = 10

// insertKeyed queues the validated req, which has a unique key, through q,
// which must be in a transaction, or returns the holder of its key.
func (in *Inserter) insertKeyed(ctx context.Context, q Querier, req broker.SubmitRequest) (broker.Submitted, error) {
	if err := in.checkVersion([]broker.SubmitRequest{req}); err != nil {
		return broker.Submitted{}, err
	}
	payload, headers, err := submitFields(req)
	if err != nil {
		return broker.Submitted{}, err
	}
	var window *int64
	if req.UniqueFor > 0 {
		w := micros(req.UniqueFor)
		window = &w
	}
	states := broker.UniqueStates(req)
	for try := 0; try < keyedTries; try++ {
		var (
			id   int64
			took bool
		)
		err := q.QueryRow(ctx, in.keyed.insert, req.Topic, req.Task, payload, headers, req.MaxAttempts,
			micros(req.Delay), runAt(req), req.Priority, req.UniqueKey, states, window).Scan(&id, &took)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			var holder int64
			err := q.QueryRow(ctx, in.keyed.holder, req.UniqueKey).Scan(&holder)
			if errors.Is(err, pgx.ErrNoRows) {
				continue // the holder left its states meanwhile
			}
			if err != nil {
				return broker.Submitted{}, err
			}
			return broker.Submitted{ID: holder, Duplicate: true}, nil
		case err != nil:
			return broker.Submitted{}, err
		case took:
			return broker.Submitted{ID: id}, nil
		}
		var holder int64
		if err := q.QueryRow(ctx, in.keyed.undo, id, req.UniqueKey).Scan(&holder); err != nil {
			return broker.Submitted{}, err
		}
		return broker.Submitted{ID: holder, Duplicate: true}, nil
	}
	return broker.Submitted{}, fmt.Errorf("unique key %q: its holders kept changing over %d tries", req.UniqueKey, keyedTries)
}

// insertBatch queues the validated reqs through q, which must be in a
// transaction when any has a unique key: runs of requests without a key
// as one statement each (insertMany), the others one by one, in request
// order so the ids ascend; a request whose key an earlier one carries is
// a duplicate of it.
func (in *Inserter) insertBatch(ctx context.Context, q Querier, reqs []broker.SubmitRequest) ([]broker.Submitted, error) {
	out := make([]broker.Submitted, len(reqs))
	first := broker.FirstOfKey(reqs)
	for i := 0; i < len(reqs); {
		if reqs[i].UniqueKey == "" {
			j := i
			for j < len(reqs) && reqs[j].UniqueKey == "" {
				j++
			}
			rows, err := manyRows(reqs[i:j])
			if err != nil {
				return nil, fmt.Errorf("request %d: %w", i, err)
			}
			ids, err := in.insertMany(ctx, q, rows)
			if err != nil {
				return nil, err
			}
			for k, id := range ids {
				out[i+k] = broker.Submitted{ID: id}
			}
			i = j
			continue
		}
		if f := first[i]; f >= 0 {
			out[i] = broker.Submitted{ID: out[f].ID, Duplicate: true}
		} else {
			s, err := in.insertKeyed(ctx, q, reqs[i])
			if err != nil {
				return nil, fmt.Errorf("request %d: %w", i, err)
			}
			out[i] = s
		}
		i++
	}
	return out, nil
}

// stored returns the requests of reqs that stored a message, by out:
// reqs itself when all did.
func stored(reqs []broker.SubmitRequest, out []broker.Submitted) []broker.SubmitRequest {
	dups := 0
	for _, o := range out {
		if o.Duplicate {
			dups++
		}
	}
	if dups == 0 {
		return reqs
	}
	s := make([]broker.SubmitRequest, 0, len(reqs)-dups)
	for i, r := range reqs {
		if !out[i].Duplicate {
			s = append(s, r)
		}
	}
	return s
}

// InsertBatch validates every request (broker.ValidateSubmitMany) and
// queues them through q, which must be a transaction when any request has
// a unique key, as InsertMany does, saying which were duplicates (see
// broker.BatchSubmitter.SubmitBatch).
func (in *Inserter) InsertBatch(ctx context.Context, q Querier, reqs []broker.SubmitRequest, maxPayload int) ([]broker.Submitted, error) {
	if err := broker.ValidateSubmitMany(reqs, maxPayload); err != nil {
		return nil, err
	}
	if err := in.checkVersion(reqs); err != nil {
		return nil, err
	}
	return in.insertBatch(ctx, q, reqs)
}

// errNotQuerier: a schedule fire's connection cannot send batches (never
// happens: it is a pgx transaction).
var errNotQuerier = errors.New("postgres broker: the fire's connection is not a pgx transaction")

// isUniqueViolation reports whether err is a write that would have made
// two messages hold one unique key (tw_messages_unique).
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "tw_messages_unique"
}
