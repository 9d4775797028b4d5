package tasksworker

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
	"github.com/taskhost/taskhost/internal/testdb"
)

// BenchmarkOperatorReads times the reads that operators and their tools
// make over and over, on the postgres broker (TEST_DATABASE_URL) with a
// paused topic of 1,000, 1,000,000 and 10,000,000 queued messages:
// GET topics (what `host topics list` reads), the metrics the aggregator
// collects at each scrape, GET health, the host's health check, and the
// task UI's dashboard and topics page, each through the plugin's
// capabilities as the host calls them. Each reports its median
// (median-ms) besides the mean. Run it with
//
//	go test -run '^$' -bench OperatorReads -benchtime 20x ./plugins/tasksworker/
//
// The queues are seeded as a submit leaves them (no VACUUM), once per run,
// in schemas of their own dropped at its end; the ten million take a few
// minutes and about 4 GB. Without -bench nothing is seeded.
func BenchmarkOperatorReads(b *testing.B) {
	for _, q := range []struct {
		name  string
		depth int
	}{{"1k", 1_000}, {"1M", 1_000_000}, {"10M", 10_000_000}} {
		b.Run("queued="+q.name, func(b *testing.B) {
			c := readsPlugin(b, q.depth)
			for _, r := range operatorReads {
				r.read(b, c) // once untimed: caches and plans
				b.Run(r.name, func(b *testing.B) {
					took := make([]time.Duration, 0, b.N)
					b.ResetTimer()
					for range b.N {
						start := time.Now()
						r.read(b, c)
						took = append(took, time.Since(start))
					}
					b.StopTimer()
					slices.Sort(took)
					b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms")
				})
			}
		})
	}
}

// readsTopic is the paused topic the reads' queue waits in.
const readsTopic = "deep"

var operatorReads = []struct {
	name string
	read func(b *testing.B, c *capability.Client)
}{
	{"topics", func(b *testing.B, c *capability.Client) {
		readsGet(b, c, "/api/topics", `"queued":`)
	}},
	{"scrape", func(b *testing.B, c *capability.Client) {
		m, err := c.CollectMetrics(context.Background())
		if err != nil || !bytes.Contains(m.Body, []byte("fastpluggy_broker_topic_queued")) {
			b.Fatalf("CollectMetrics = %.200s, %v; want the broker gauges", m.Body, err)
		}
	}},
	{"health", func(b *testing.B, c *capability.Client) {
		readsGet(b, c, "/api/health", `"status":"ok"`)
	}},
	{"health_check", func(b *testing.B, c *capability.Client) {
		if h, err := c.CheckHealth(context.Background()); err != nil || h.Status != capability.HealthOK {
			b.Fatalf("CheckHealth = %+v, %v", h, err)
		}
	}},
	{"dashboard", func(b *testing.B, c *capability.Client) {
		readsGet(b, c, "/ui/", "Dashboard")
	}},
	{"ui_topics", func(b *testing.B, c *capability.Client) {
		readsGet(b, c, "/ui/topics", readsTopic)
	}},
}

// readsGet GETs path through the plugin's HTTP capability, with the
// headers the host's proxy sets, and fails b unless it answers 200 with
// a body holding want.
func readsGet(b *testing.B, c *capability.Client, path, want string) {
	var status int
	var body bytes.Buffer
	err := c.ProxyHTTP(context.Background(), capability.ProxyRequest{
		Method: "GET", Path: path, Actor: "local",
		Header: http.Header{"X-Forwarded-Host": {uiTestHost}, "X-Forwarded-Prefix": {uiTestPrefix}, "X-Forwarded-For": {"127.0.0.1"}},
	}, func(s int, _ http.Header) { status = s }, func(p []byte) error {
		body.Write(p)
		return nil
	})
	if err != nil || status != http.StatusOK || !strings.Contains(body.String(), want) {
		b.Fatalf("GET %s = %d %.300s, %v; want 200 with %q", path, status, body.String(), err, want)
	}
}

// readsPlugin seeds a fresh schema with depth queued messages on the
// paused topic readsTopic and returns the plugin configured on it.
func readsPlugin(b *testing.B, depth int) *capability.Client {
	schema := testdb.FreshSchema(b, "tw_bench_reads_")
	ctx := context.Background()
	if err := postgres.Migrate(ctx, testdb.DSN(), schema); err != nil {
		b.Fatal(err)
	}
	conn := testdb.Connect(b, schema)
	start := time.Now()
	if _, err := conn.Exec(ctx, `INSERT INTO tw_topics (name, paused) VALUES ($1, true)`, readsTopic); err != nil {
		b.Fatal(err)
	}
	const chunk = 1_000_000
	for from := 1; from <= depth; from += chunk {
		if _, err := conn.Exec(ctx, `INSERT INTO tw_messages (topic, task, payload, available_at)
			SELECT $1, 'send', jsonb_build_object('n', i), now() - interval '1 hour' + i * interval '1 microsecond'
			FROM generate_series($2::bigint, $3::bigint) i`, readsTopic, from, min(from+chunk-1, depth)); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `ANALYZE tw_messages`); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d queued messages in %v", depth, time.Since(start).Round(time.Millisecond))
	p := New(hclog.NewNullLogger())
	c := capabilitytest.Start(b, p, map[string]any{
		"broker": "postgres", "dsn": testdb.DSN(), "schema": schema, "workers": 2, "drain_timeout_seconds": 0,
	}, nil)
	var body bytes.Buffer
	err := c.ProxyHTTP(ctx, capability.ProxyRequest{Method: "GET", Path: "/api/topics"}, func(int, http.Header) {}, func(p []byte) error {
		body.Write(p)
		return nil
	})
	if want := fmt.Sprintf(`"name":%q,"queued":%d,`, readsTopic, depth); err != nil || !strings.Contains(body.String(), want) {
		b.Fatalf("GET topics = %.300s, %v; want %s", body.String(), err, want)
	}
	return c
}
