package postgres

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/broker"
)

// TestListPlansUseIndexes: on a table where most messages are done, the
// lists the task UI shows walk an index in id order (or a small partial
// index) rather than the whole table. The state is a literal in the SQL,
// so generic and custom plans alike can use the partial indexes.
func TestListPlansUseIndexes(t *testing.T) {
	b := newTestBroker(t, Options{})
	ctx := t.Context()
	c := schemaConn(t, b)
	execAll(t, c,
		`INSERT INTO tw_topics (name) VALUES ('big'), ('rare')`,
		`INSERT INTO tw_messages (topic, task, state, token, claimed_by, claimed_at)
			SELECT CASE WHEN i % 500 = 0 THEN 'rare' ELSE 'big' END, 'x', s,
				CASE WHEN s = 'running' THEN gen_random_uuid() END,
				CASE WHEN s = 'running' THEN 'w' END,
				CASE WHEN s = 'running' THEN now() END
			FROM generate_series(1, 50000) i,
			LATERAL (SELECT CASE WHEN i % 1000 = 1 THEN 'failed' WHEN i % 1000 = 2 THEN 'dead'
				WHEN i % 1000 = 3 THEN 'running' WHEN i % 10 = 4 THEN 'queued' ELSE 'done' END AS s) st`,
		`ANALYZE tw_messages`,
		fillDoneSQL, `ANALYZE tw_done`,
		`SET plan_cache_mode = force_generic_plan`,
	)
	// Each filter's statement, as ListMessages builds it (listing through
	// the broker first: it must work).
	for _, f := range []broker.MessageFilter{
		{State: broker.StateFailed},
		{State: broker.StateDead},
		{State: broker.StateRunning},
		{Topic: "rare"},
		{Topic: "rare", State: broker.StateDone},
		{Topic: "rare", Before: 40000},
		{Topic: "rare", Before: 140000},
		// tw_messages has no index for these (a task, or no filter: the
		// primary key backwards): only the batches are checked.
		{State: broker.StateDone, Task: "task7"},
		{Task: "task7", Before: 140000},
		{},
		{Before: 120000},
	} {
		if _, err := b.ListMessages(ctx, f); err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		sql, args := listSQL(f, 50)
		rows, err := c.Query(ctx, `EXPLAIN `+sql, args...)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if testing.Verbose() {
			t.Logf("%+v:\n%s", f, plan)
		}
		rowsChecked := f.Topic != "" || (f.State != "" && f.State != broker.StateDone)
		if (rowsChecked && (strings.Contains(plan, "Seq Scan on tw_messages") || walksPrimaryKey(lines))) ||
			strings.Contains(plan, "Seq Scan on tw_done") {
			t.Errorf("%+v: the list walks the table:\n%s", f, plan)
		}
	}
}

// walksPrimaryKey reports whether the plan lines walk tw_messages' primary
// key backwards with no condition on it: a lookup of the ids claim rows
// hold (Index Cond: id = ANY) reads only those.
func walksPrimaryKey(lines []string) bool {
	for i, l := range lines {
		if strings.Contains(l, "Index Scan Backward using tw_messages_pkey") &&
			(i+1 == len(lines) || !strings.Contains(lines[i+1], "Index Cond: (id = ANY")) {
			return true
		}
	}
	return false
}

// fillDoneSQL adds 2,500 batches of 20 done messages to tw_done (migration
// 020), with ids from 100,000 and report ids from 200,000, in topics big
// and rare (one batch in 500) and tasks task0 to task19.
const fillDoneSQL = `INSERT INTO tw_done (topic, task, finished_at, ids, max_id, reports, max_report, first_ended, messages)
	SELECT CASE WHEN b % 500 = 0 THEN 'rare' ELSE 'big' END, 'task' || (b % 20), now(),
		int8range(100000 + b * 20, 100019 + b * 20, '[]'), 100019 + b * 20,
		int8range(200000 + b * 20, 200019 + b * 20, '[]'), 200019 + b * 20, now(),
		ARRAY (SELECT ROW(100000 + b * 20 + j, '{}'::jsonb, NULL, 1, 0, 'w', now(), now(), now(), NULL, NULL, false,
			NULL, NULL, 0, 0, 200000 + b * 20 + j, 1, NULL, now(), now(), 0.1, 1)::tw_done_message
			FROM generate_series(0, 19) j)
	FROM generate_series(1, 2500) b`
