package metricsagg

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// HELP and TYPE lines of the aggregator's own families, for expectations.
const (
	upHeader = "# HELP fp_metrics_source_up 1 if the plugin's metrics were collected and decoded in this scrape, else 0.\n" +
		"# TYPE fp_metrics_source_up gauge\n"
	errorsHeader = "# HELP fp_metrics_source_errors_total Failed or partial collections of a plugin's metrics, by reason.\n" +
		"# TYPE fp_metrics_source_errors_total counter\n"
)

const (
	payloadA = `# HELP jobs_total Jobs done.
# TYPE jobs_total counter
jobs_total{queue="high",result="ok"} 3
jobs_total{result="failed",queue="high"} 1
# HELP queue_depth Items waiting.
# TYPE queue_depth gauge
queue_depth{queue="high"} 7
`
	payloadB = `# HELP jobs_total Jobs done by b.
# TYPE jobs_total counter
jobs_total{queue="low",result="ok"} 10
# HELP workers Live workers.
# TYPE workers gauge
workers 2
`
)

// Two plugins through the real gRPC path: every family is renamed, a
// family name both plugins use becomes two families, HELP, TYPE, labels
// and values survive, and plugins without the metrics capability (the
// aggregator included) are not asked.
func TestAggregatesPluginsOverGRPC(t *testing.T) {
	plugins := []capability.PluginInfo{
		self, running("a"), running("b"),
		{Name: "web", State: "running", Capabilities: []capability.Capability{capability.Lifecycles, capability.HTTP}},
	}
	host := newHost(t, plugins, fixed(map[string]capability.MetricsPayload{
		"a": text(payloadA),
		"b": {Body: []byte(payloadB), Format: string(expfmt.NewFormat(expfmt.TypeTextPlain))},
	}))
	c := capabilitytest.Start(t, New(newTestLogger(&logBuffer{})), nil, host)

	status, header, body := scrapeGRPC(t, c, "")
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("content type %q, want the text format", ct)
	}
	assertMetrics(t, body, `
# HELP fp_a_jobs_total Jobs done.
# TYPE fp_a_jobs_total counter
fp_a_jobs_total{queue="high",result="failed"} 1
fp_a_jobs_total{queue="high",result="ok"} 3
# HELP fp_a_queue_depth Items waiting.
# TYPE fp_a_queue_depth gauge
fp_a_queue_depth{queue="high"} 7
# HELP fp_b_jobs_total Jobs done by b.
# TYPE fp_b_jobs_total counter
fp_b_jobs_total{queue="low",result="ok"} 10
# HELP fp_b_workers Live workers.
# TYPE fp_b_workers gauge
fp_b_workers 2
`+upHeader+`
fp_metrics_source_up{plugin="a"} 1
fp_metrics_source_up{plugin="b"} 1
`, "fp_a_jobs_total", "fp_a_queue_depth", "fp_b_jobs_total", "fp_b_workers",
		"fp_metrics_source_up", "fp_metrics_source_errors_total")

	families := parse(t, body)
	for name := range families {
		if !strings.HasPrefix(name, "fp_") && !strings.HasPrefix(name, "promhttp_") {
			t.Errorf("unexpected family %s", name)
		}
	}
	durations := families["fp_metrics_source_scrape_duration_seconds"].GetMetric()
	if len(durations) != 2 {
		t.Errorf("want a scrape duration for a and b, got %v", durations)
	}
}

// A source that does not answer in time costs only its own series, and
// the scrape takes about one timeout.
func TestSlowSourceTimesOut(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	host := newHost(t, []capability.PluginInfo{running("fast"), running("slow")},
		func(ctx context.Context, name string) (capability.MetricsPayload, error) {
			if name == "slow" {
				select {
				case <-ctx.Done():
				case <-release:
				}
				return capability.MetricsPayload{}, ctx.Err()
			}
			return text("x 1\n"), nil
		})
	c := capabilitytest.Start(t, New(newTestLogger(&logBuffer{})), map[string]any{"source_timeout_seconds": 0.5}, host)

	start := time.Now()
	status, _, body := scrapeGRPC(t, c, "")
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("scrape took %v with a 0.5s source timeout", elapsed)
	}
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	assertMetrics(t, body, `
# TYPE fp_fast_x untyped
fp_fast_x 1
`+upHeader+`
fp_metrics_source_up{plugin="fast"} 1
fp_metrics_source_up{plugin="slow"} 0
`+errorsHeader+`
fp_metrics_source_errors_total{plugin="slow",reason="timeout"} 1
`, "fp_fast_x", "fp_metrics_source_up", "fp_metrics_source_errors_total")
}

// A HostServices that ignores its context still cannot hold the scrape.
func TestSourceIgnoringContextTimesOut(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	host := newHost(t, []capability.PluginInfo{running("stuck")},
		func(context.Context, string) (capability.MetricsPayload, error) {
			<-release
			return text("x 1\n"), nil
		})
	p := configured(t, nil, host, `{"source_timeout_seconds": 0.2}`)

	start := time.Now()
	status, _, body := scrapeDirect(t, p, "")
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("scrape took %v with a 0.2s source timeout", elapsed)
	}
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	assertMetrics(t, body, upHeader+`
fp_metrics_source_up{plugin="stuck"} 0
`+errorsHeader+`
fp_metrics_source_errors_total{plugin="stuck",reason="timeout"} 1
`, "fp_metrics_source_up", "fp_metrics_source_errors_total")
}

// Garbage from one source: it is down, the error is counted and persists
// across scrapes, it is logged once per scrape, and the rest is served.
func TestGarbagePayload(t *testing.T) {
	host := newHost(t, []capability.PluginInfo{running("bad"), running("good")}, fixed(map[string]capability.MetricsPayload{
		"bad":  text("\x00\x01 this is { not an exposition"),
		"good": text("x 1\n"),
	}))
	var logs logBuffer
	p := configured(t, newTestLogger(&logs), host, `{}`)

	for scrape := 1; scrape <= 2; scrape++ {
		status, _, body := scrapeDirect(t, p, "")
		if status != http.StatusOK {
			t.Fatalf("status %d\n%s", status, body)
		}
		assertMetrics(t, body, `
# TYPE fp_good_x untyped
fp_good_x 1
`+upHeader+`
fp_metrics_source_up{plugin="bad"} 0
fp_metrics_source_up{plugin="good"} 1
`+errorsHeader+`
fp_metrics_source_errors_total{plugin="bad",reason="decode"} `+string(rune('0'+scrape))+`
`, "fp_good_x", "fp_metrics_source_up", "fp_metrics_source_errors_total")
		if n := strings.Count(logs.String(), "plugin=bad"); n != scrape {
			t.Errorf("after %d scrapes, %d log lines about bad:\n%s", scrape, n, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "[WARN]") || !strings.Contains(logs.String(), "reason=decode") {
		t.Errorf("want a WARN with reason=decode:\n%s", logs.String())
	}
}

// Plugins that are configured but down report 0; plugins that are not
// metrics sources report nothing; a plugin that goes away between the list
// and the call is unavailable.
func TestSourcesThatAreDown(t *testing.T) {
	plugins := []capability.PluginInfo{
		self,
		running("good"),
		running("racing"),
		{Name: "down", State: "backoff", Capabilities: []capability.Capability{capability.Lifecycles, capability.Metrics}},
		{Name: "fresh", State: "starting"},
		{Name: "webonly", State: "failed", Capabilities: []capability.Capability{capability.Lifecycles, capability.HTTP}},
		{Name: "quiet", State: "running", Capabilities: []capability.Capability{capability.Lifecycles}},
		// Degraded is up: its series say why it is degraded.
		{Name: "ailing", State: "degraded", Capabilities: []capability.Capability{capability.Lifecycles, capability.Metrics}},
	}
	host := newHost(t, plugins, func(_ context.Context, name string) (capability.MetricsPayload, error) {
		switch name {
		case "good", "ailing":
			return text("x 1\n"), nil
		case "racing":
			return capability.MetricsPayload{}, errors.Join(errors.New("collect metrics of racing"), capability.ErrUnavailable)
		}
		t.Errorf("collect metrics of %s, which is not a running source", name)
		return capability.MetricsPayload{}, capability.ErrUnavailable
	})
	p := configured(t, nil, host, `{}`)

	status, _, body := scrapeDirect(t, p, "")
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	assertMetrics(t, body, upHeader+`
fp_metrics_source_up{plugin="ailing"} 1
fp_metrics_source_up{plugin="down"} 0
fp_metrics_source_up{plugin="fresh"} 0
fp_metrics_source_up{plugin="good"} 1
fp_metrics_source_up{plugin="racing"} 0
`+errorsHeader+`
fp_metrics_source_errors_total{plugin="down",reason="unavailable"} 1
fp_metrics_source_errors_total{plugin="fresh",reason="unavailable"} 1
fp_metrics_source_errors_total{plugin="racing",reason="unavailable"} 1
`, "fp_metrics_source_up", "fp_metrics_source_errors_total")

	// Only plugins that were asked have a duration.
	for _, m := range parse(t, body)["fp_metrics_source_scrape_duration_seconds"].GetMetric() {
		if name := m.GetLabel()[0].GetValue(); name != "good" && name != "racing" && name != "ailing" {
			t.Errorf("scrape duration for %s, which was not asked", name)
		}
	}
}

// A plugin that is no longer configured leaves no stale gauges behind.
func TestRemovedPluginDisappears(t *testing.T) {
	var mu sync.Mutex
	plugins := []capability.PluginInfo{running("kept"), running("gone")}
	host := &capabilitytest.Host{
		ListPluginsFunc: func(context.Context, capability.Capability) ([]capability.PluginInfo, error) {
			mu.Lock()
			defer mu.Unlock()
			return plugins, nil
		},
		CollectMetricsFunc: func(context.Context, string) (capability.MetricsPayload, error) { return text("x 1\n"), nil },
	}
	p := configured(t, nil, host, `{}`)
	scrapeDirect(t, p, "")

	mu.Lock()
	plugins = plugins[:1]
	mu.Unlock()
	_, _, body := scrapeDirect(t, p, "")
	assertMetrics(t, body, upHeader+`
fp_metrics_source_up{plugin="kept"} 1
`, "fp_metrics_source_up", "fp_gone_x")
	if m := parse(t, body)["fp_metrics_source_scrape_duration_seconds"].GetMetric(); len(m) != 1 {
		t.Errorf("want one scrape duration, got %v", m)
	}
}

// Protobuf-delimited payloads decode like text, and binary bytes survive
// the gRPC path.
func TestProtobufPayload(t *testing.T) {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total", Help: "Requests served."}, []string{"code"})
	requests.WithLabelValues("200").Add(5)
	requests.WithLabelValues("500").Add(2)
	reg.MustRegister(requests)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	format := expfmt.NewFormat(expfmt.TypeProtoDelim)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}

	host := newHost(t, []capability.PluginInfo{running("proto")}, fixed(map[string]capability.MetricsPayload{
		"proto": {Body: buf.Bytes(), Format: string(format)},
	}))
	c := capabilitytest.Start(t, New(newTestLogger(&logBuffer{})), nil, host)
	_, _, body := scrapeGRPC(t, c, "")
	assertMetrics(t, body, `
# HELP fp_proto_requests_total Requests served.
# TYPE fp_proto_requests_total counter
fp_proto_requests_total{code="200"} 5
fp_proto_requests_total{code="500"} 2
`+upHeader+`
fp_metrics_source_up{plugin="proto"} 1
`, "fp_proto_requests_total", "fp_metrics_source_up")
}

// The scraper chooses the format: OpenMetrics when it asks for it.
func TestOpenMetricsNegotiation(t *testing.T) {
	host := newHost(t, []capability.PluginInfo{running("a")}, fixed(map[string]capability.MetricsPayload{"a": text(payloadA)}))
	c := capabilitytest.Start(t, New(newTestLogger(&logBuffer{})), nil, host)

	status, header, body := scrapeGRPC(t, c, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Errorf("content type %q, want OpenMetrics", ct)
	}
	for _, want := range []string{`fp_a_jobs_total{queue="high",result="ok"} 3`, "# TYPE fp_a_jobs counter", "fp_metrics_source_up{plugin=\"a\"} 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("OpenMetrics body lacks %q:\n%s", want, body)
		}
	}
	if !strings.HasSuffix(string(body), "# EOF\n") {
		t.Errorf("OpenMetrics body does not end with # EOF:\n%s", body)
	}
}

// Histograms and summaries keep their suffixes under the new prefix.
func TestHistogramAndSummarySuffixes(t *testing.T) {
	payload := `# HELP latency_seconds Request latency.
# TYPE latency_seconds histogram
latency_seconds_bucket{le="0.1"} 2
latency_seconds_bucket{le="1"} 5
latency_seconds_bucket{le="+Inf"} 6
latency_seconds_sum 3.5
latency_seconds_count 6
# HELP rpc_seconds RPC time.
# TYPE rpc_seconds summary
rpc_seconds{quantile="0.5"} 0.2
rpc_seconds_sum 4
rpc_seconds_count 10
`
	host := newHost(t, []capability.PluginInfo{running("h")}, fixed(map[string]capability.MetricsPayload{"h": text(payload)}))
	p := configured(t, nil, host, `{}`)
	_, _, body := scrapeDirect(t, p, "")
	assertMetrics(t, body, `
# HELP fp_h_latency_seconds Request latency.
# TYPE fp_h_latency_seconds histogram
fp_h_latency_seconds_bucket{le="0.1"} 2
fp_h_latency_seconds_bucket{le="1"} 5
fp_h_latency_seconds_bucket{le="+Inf"} 6
fp_h_latency_seconds_sum 3.5
fp_h_latency_seconds_count 6
# HELP fp_h_rpc_seconds RPC time.
# TYPE fp_h_rpc_seconds summary
fp_h_rpc_seconds{quantile="0.5"} 0.2
fp_h_rpc_seconds_sum 4
fp_h_rpc_seconds_count 10
`, "fp_h_latency_seconds", "fp_h_rpc_seconds")
	for _, want := range []string{`fp_h_latency_seconds_bucket{le="0.1"} 2`, "fp_h_latency_seconds_sum 3.5", "fp_h_rpc_seconds_count 10"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("body lacks %q:\n%s", want, body)
		}
	}
}

// Names that clash after prefixing: the first plugin by name keeps the
// family, the other loses only that family, and the clash is counted.
// The aggregator's own names always win.
func TestCollisions(t *testing.T) {
	host := newHost(t,
		[]capability.PluginInfo{running("a"), running("a_b"), running("h"), running("h_lat"), running("metrics_source")},
		fixed(map[string]capability.MetricsPayload{
			"a":              text("# TYPE b_c counter\nb_c 1\n"),
			"a_b":            text("# TYPE c gauge\nc 2\n# TYPE ok gauge\nok 3\n"),
			"h":              text("# TYPE lat histogram\nlat_bucket{le=\"+Inf\"} 1\nlat_sum 1\nlat_count 1\n"),
			"h_lat":          text("# TYPE count gauge\ncount 9\n"),
			"metrics_source": text("# TYPE up gauge\nup 1\n"),
		}))
	var logs logBuffer
	p := configured(t, newTestLogger(&logs), host, `{}`)
	status, _, body := scrapeDirect(t, p, "")
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	assertMetrics(t, body, `
# TYPE fp_a_b_c counter
fp_a_b_c 1
# TYPE fp_a_b_ok gauge
fp_a_b_ok 3
# TYPE fp_h_lat histogram
fp_h_lat_bucket{le="+Inf"} 1
fp_h_lat_sum 1
fp_h_lat_count 1
`+upHeader+`
fp_metrics_source_up{plugin="a"} 1
fp_metrics_source_up{plugin="a_b"} 1
fp_metrics_source_up{plugin="h"} 1
fp_metrics_source_up{plugin="h_lat"} 1
fp_metrics_source_up{plugin="metrics_source"} 1
`+errorsHeader+`
fp_metrics_source_errors_total{plugin="a_b",reason="collision"} 1
fp_metrics_source_errors_total{plugin="h_lat",reason="collision"} 1
fp_metrics_source_errors_total{plugin="metrics_source",reason="collision"} 1
`, "fp_a_b_c", "fp_a_b_ok", "fp_h_lat", "fp_metrics_source_up", "fp_metrics_source_errors_total")
	if n := strings.Count(logs.String(), "reason=collision"); n != 3 {
		t.Errorf("want 3 collision log lines, got %d:\n%s", n, logs.String())
	}
}

// A family whose new name is not a legacy metric name (here a UTF-8 name
// from a plugin that allows them) is dropped and counted; the rest stays.
func TestInvalidNameDropped(t *testing.T) {
	format := expfmt.NewFormat(expfmt.TypeProtoDelim).WithEscapingScheme(model.NoEscaping)
	gauge := dto.MetricType_GAUGE
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, format)
	for _, name := range []string{"my.metric", "fine"} {
		mf := &dto.MetricFamily{Name: &name, Type: &gauge, Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: new(1.0)}}}}
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	host := newHost(t, []capability.PluginInfo{running("u")}, fixed(map[string]capability.MetricsPayload{
		"u": {Body: buf.Bytes(), Format: string(format)},
	}))
	p := configured(t, nil, host, `{}`)
	_, _, body := scrapeDirect(t, p, "")
	assertMetrics(t, body, `
# TYPE fp_u_fine gauge
fp_u_fine 1
`+upHeader+`
fp_metrics_source_up{plugin="u"} 1
`+errorsHeader+`
fp_metrics_source_errors_total{plugin="u",reason="invalid_name"} 1
`, "fp_u_fine", "fp_metrics_source_up", "fp_metrics_source_errors_total")
}

func TestExcludeGoRuntime(t *testing.T) {
	payload := "# TYPE go_goroutines gauge\ngo_goroutines 12\n" +
		"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n" +
		"# TYPE app_items gauge\napp_items 4\n"
	host := newHost(t, []capability.PluginInfo{running("r")}, fixed(map[string]capability.MetricsPayload{"r": text(payload)}))

	for _, exclude := range []bool{false, true} {
		config := `{"exclude_go_runtime": false}`
		if exclude {
			config = `{"exclude_go_runtime": true}`
		}
		_, _, body := scrapeDirect(t, configured(t, nil, host, config), "")
		families := parse(t, body)
		if families["fp_r_app_items"] == nil {
			t.Errorf("exclude %v: fp_r_app_items missing", exclude)
		}
		for _, name := range []string{"fp_r_go_goroutines", "fp_r_process_cpu_seconds_total"} {
			if got := families[name] != nil; got == exclude {
				t.Errorf("exclude %v: %s present = %v", exclude, name, got)
			}
		}
	}
}

// A plugin may send the same series twice (the text parser keeps both).
// Gatherers drops the second; the scrape goes on, and promhttp counts and
// logs the error on one line.
func TestDuplicateSeriesDoNotFailTheScrape(t *testing.T) {
	host := newHost(t, []capability.PluginInfo{running("dup"), running("good")}, fixed(map[string]capability.MetricsPayload{
		"dup":  text("# TYPE x gauge\nx{k=\"v\"} 1\nx{k=\"v\"} 2\n"),
		"good": text("y 1\n"),
	}))
	var logs logBuffer
	p := configured(t, newTestLogger(&logs), host, `{}`)
	status, _, body := scrapeDirect(t, p, "")
	if status != http.StatusOK {
		t.Fatalf("status %d\n%s", status, body)
	}
	var warn string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "error gathering metrics") {
			warn += line
		}
	}
	if strings.Count(warn, "\n") != 1 || !strings.Contains(warn, "[WARN]") || !strings.Contains(warn, "fp_dup_x") {
		t.Errorf("want one WARN line about fp_dup_x, got:\n%s", logs.String())
	}

	// promhttp counts the error after it has gathered, so the next
	// scrape shows it.
	_, _, body = scrapeDirect(t, p, "")
	assertMetrics(t, body, `
# TYPE fp_dup_x gauge
fp_dup_x{k="v"} 1
# TYPE fp_good_y untyped
fp_good_y 1
# HELP fp_metrics_promhttp_metric_handler_errors_total Total number of internal errors encountered by the promhttp metric handler.
# TYPE fp_metrics_promhttp_metric_handler_errors_total counter
fp_metrics_promhttp_metric_handler_errors_total{cause="encoding"} 0
fp_metrics_promhttp_metric_handler_errors_total{cause="gathering"} 1
`, "fp_dup_x", "fp_good_y", "fp_metrics_promhttp_metric_handler_errors_total")
}

// Without the list of plugins there is nothing honest to serve.
func TestListPluginsFailure(t *testing.T) {
	host := &capabilitytest.Host{
		ListPluginsFunc: func(context.Context, capability.Capability) ([]capability.PluginInfo, error) {
			return nil, errors.New("registry exploded")
		},
	}
	p := configured(t, nil, host, `{}`)
	status, _, body := scrapeDirect(t, p, "")
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "registry exploded") {
		t.Errorf("status %d, body %q; want 503 with the cause", status, body)
	}
}
