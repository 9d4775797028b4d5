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
		if strings.Contains(plan, "Seq Scan on tw_messages") || strings.Contains(plan, "Index Scan Backward using tw_messages_pkey") {
			t.Errorf("%+v: the list walks the table:\n%s", f, plan)
		}
	}
}
