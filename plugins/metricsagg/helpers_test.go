package metricsagg

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

// running describes a running plugin with the metrics capability.
func running(name string) capability.PluginInfo {
	return capability.PluginInfo{
		Name:         name,
		State:        "running",
		Capabilities: []capability.Capability{capability.Lifecycles, capability.Metrics},
	}
}

// self is the aggregator as the host lists it.
var self = capability.PluginInfo{
	Name:         Name,
	State:        "running",
	Capabilities: []capability.Capability{capability.Lifecycles, capability.HTTP},
}

// text is a payload in the classic text format, with the empty Format the
// contract allows for it.
func text(s string) capability.MetricsPayload {
	return capability.MetricsPayload{Body: []byte(s)}
}

// newHost answers ListPlugins with plugins and CollectMetrics from collect.
// Like the real host, it lists every plugin when asked without a
// capability and only running ones with it.
func newHost(t *testing.T, plugins []capability.PluginInfo, collect func(ctx context.Context, name string) (capability.MetricsPayload, error)) *capabilitytest.Host {
	return &capabilitytest.Host{
		ListPluginsFunc: func(_ context.Context, c capability.Capability) ([]capability.PluginInfo, error) {
			if c == "" {
				return plugins, nil
			}
			var out []capability.PluginInfo
			for _, p := range plugins {
				if p.State == "running" && slices.Contains(p.Capabilities, c) {
					out = append(out, p)
				}
			}
			return out, nil
		},
		CollectMetricsFunc: func(ctx context.Context, name string) (capability.MetricsPayload, error) {
			if name == Name {
				t.Errorf("the aggregator asked the host for its own metrics")
			}
			return collect(ctx, name)
		},
	}
}

// fixed serves payloads by plugin name; any other name is not found.
func fixed(payloads map[string]capability.MetricsPayload) func(context.Context, string) (capability.MetricsPayload, error) {
	return func(_ context.Context, name string) (capability.MetricsPayload, error) {
		p, ok := payloads[name]
		if !ok {
			return capability.MetricsPayload{}, capability.ErrNotFound
		}
		return p, nil
	}
}

// configured returns a Plugin configured directly, without gRPC.
func configured(t *testing.T, log hclog.Logger, host capability.HostServices, config string) *Plugin {
	t.Helper()
	if log == nil {
		log = hclog.NewNullLogger()
	}
	p := New(log)
	req := capability.ConfigureRequest{Config: json.RawMessage(config), Host: host}
	if err := p.Configure(context.Background(), req); err != nil {
		t.Fatalf("configure: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

// scrapeDirect calls the handler in-process.
func scrapeDirect(t *testing.T, h http.Handler, accept string) (int, http.Header, []byte) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/api/prometheus", nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.Bytes()
}

// scrapeGRPC goes through the harness: the host's HTTP proxy path.
func scrapeGRPC(t *testing.T, c *capability.Client, accept string) (int, http.Header, []byte) {
	t.Helper()
	h := http.Header{}
	if accept != "" {
		h.Set("Accept", accept)
	}
	var (
		status int
		header http.Header
		body   bytes.Buffer
	)
	err := c.ProxyHTTP(context.Background(),
		capability.ProxyRequest{Method: http.MethodGet, Path: "/api/prometheus", Header: h},
		func(s int, h http.Header) { status, header = s, h },
		func(b []byte) error { body.Write(b); return nil })
	if err != nil {
		t.Fatalf("proxy http: %v", err)
	}
	return status, header, body.Bytes()
}

// parse reads a text exposition as a scraper would.
func parse(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse scrape: %v\n%s", err, body)
	}
	return families
}

// assertMetrics compares the named families of a scrape with want, a text
// exposition, by parsing and re-encoding both the same way.
func assertMetrics(t *testing.T, body []byte, want string, names ...string) {
	t.Helper()
	got, exp := encodeFamilies(t, parse(t, body), names), encodeFamilies(t, parse(t, []byte(want)), names)
	if got != exp {
		t.Errorf("scrape differs\n--- got:\n%s--- want:\n%s", got, exp)
	}
}

// encodeFamilies writes the named families in the text format. Gatherers
// puts families and series in a canonical order first.
func encodeFamilies(t *testing.T, families map[string]*dto.MetricFamily, names []string) string {
	t.Helper()
	var selected []*dto.MetricFamily
	for _, name := range names {
		if mf, ok := families[name]; ok {
			selected = append(selected, mf)
		}
	}
	normalized, err := prometheus.Gatherers{prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return selected, nil
	})}.Gather()
	if err != nil {
		t.Fatalf("normalize families: %v", err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range normalized {
		if err := enc.Encode(mf); err != nil {
			t.Fatalf("encode %s: %v", mf.GetName(), err)
		}
	}
	return buf.String()
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newTestLogger(out *logBuffer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: Name, Output: out, Level: hclog.Debug})
}
