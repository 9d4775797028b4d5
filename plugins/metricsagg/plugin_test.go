package metricsagg

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/capability/capabilitytest"
)

func TestDescribeAndCapabilities(t *testing.T) {
	c := capabilitytest.Start(t, New(hclog.NewNullLogger()), nil, nil)
	d, err := c.Describe(context.Background())
	if err != nil {
		t.Fatalf("describe: %v", err)
	}
	if d.Name != "metrics" || d.Version == "" {
		t.Errorf("describe = %+v, want name metrics and a version", d)
	}
	// Serving MetricsProvider would make the host list the aggregator as
	// a source of itself.
	want := []capability.Capability{capability.Lifecycles, capability.HTTP, capability.HTTPBodyStream}
	if !slices.Equal(d.Capabilities, want) {
		t.Errorf("capabilities = %v, want %v", d.Capabilities, want)
	}
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		config  string
		timeout time.Duration
		exclude bool
	}{
		{``, defaultSourceTimeout, false},
		{`null`, defaultSourceTimeout, false},
		{`{}`, defaultSourceTimeout, false},
		{`{"source_timeout_seconds": 0.25}`, 250 * time.Millisecond, false},
		{`{"source_timeout_seconds": 30, "exclude_go_runtime": true}`, 30 * time.Second, true},
	} {
		cfg, err := parseConfig(json.RawMessage(tc.config))
		if err != nil {
			t.Errorf("parseConfig(%s): %v", tc.config, err)
			continue
		}
		if cfg.sourceTimeout != tc.timeout || cfg.excludeGoRuntime != tc.exclude {
			t.Errorf("parseConfig(%s) = %+v, want timeout %v exclude %v", tc.config, cfg, tc.timeout, tc.exclude)
		}
	}
}

func TestInvalidConfigNamesTheKey(t *testing.T) {
	for _, tc := range []struct{ config, key string }{
		{`{"source_timeout_seconds": 0}`, "source_timeout_seconds"},
		{`{"source_timeout_seconds": -1}`, "source_timeout_seconds"},
		{`{"source_timeout_seconds": 30.5}`, "source_timeout_seconds"},
		{`{"source_timeout_seconds": 1e-12}`, "source_timeout_seconds"},
		{`{"source_timeout_seconds": "3"}`, "source_timeout_seconds"},
		{`{"source_timeout_seconds": null}`, "source_timeout_seconds"},
		{`{"exclude_go_runtime": "yes"}`, "exclude_go_runtime"},
		{`{"scrape_interval": 5}`, "scrape_interval"},
		{`{"exclude_go_runtime": true, "bogus": 1}`, "bogus"},
		{`[1, 2]`, ""},
	} {
		p := New(hclog.NewNullLogger())
		err := p.Configure(context.Background(), capability.ConfigureRequest{
			Config: json.RawMessage(tc.config), Host: &capabilitytest.Host{},
		})
		var invalid *capability.InvalidConfigError
		if !errors.As(err, &invalid) {
			t.Errorf("Configure(%s) = %v, want an InvalidConfigError", tc.config, err)
			continue
		}
		if invalid.Key != tc.key {
			t.Errorf("Configure(%s): key %q, want %q (%v)", tc.config, invalid.Key, tc.key, err)
		}
		if h, _ := p.CheckHealth(context.Background()); h.Status != capability.HealthError {
			t.Errorf("Configure(%s) failed but health is %v", tc.config, h.Status)
		}
	}
}

// The key reaches the host over gRPC as part of the message.
func TestInvalidConfigOverGRPC(t *testing.T) {
	c := capabilitytest.Connect(t, New(hclog.NewNullLogger()))
	err := c.Configure(context.Background(), capability.ConfigureRequest{
		Config: json.RawMessage(`{"source_timeout_seconds": 31}`), Host: &capabilitytest.Host{},
	})
	var invalid *capability.InvalidConfigError
	if !errors.As(err, &invalid) || !strings.Contains(invalid.Error(), "source_timeout_seconds") {
		t.Fatalf("configure = %v, want an InvalidConfigError naming source_timeout_seconds", err)
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	p := New(hclog.NewNullLogger())

	if h, err := p.CheckHealth(ctx); err != nil || h.Status != capability.HealthError {
		t.Errorf("health before configure = %+v, %v; want error status", h, err)
	}
	if code, _, _ := scrapeDirect(t, p, ""); code != http.StatusServiceUnavailable {
		t.Errorf("scrape before configure: status %d, want 503", code)
	}
	if err := p.Stop(ctx); err != nil {
		t.Errorf("stop before configure: %v", err)
	}

	first := newHost(t, []capability.PluginInfo{running("first")}, fixed(map[string]capability.MetricsPayload{"first": text("x 1\n")}))
	second := newHost(t, []capability.PluginInfo{running("second")}, fixed(map[string]capability.MetricsPayload{"second": text("x 2\n")}))
	for _, host := range []capability.HostServices{first, second} {
		if err := p.Configure(ctx, capability.ConfigureRequest{Config: json.RawMessage(`{}`), Host: host}); err != nil {
			t.Fatalf("configure: %v", err)
		}
		if h, err := p.CheckHealth(ctx); err != nil || h.Status != capability.HealthOK {
			t.Errorf("health after configure = %+v, %v; want ok", h, err)
		}
	}
	// A second Configure replaces the host.
	code, _, body := scrapeDirect(t, p, "")
	fams := parse(t, body)
	if code != http.StatusOK || fams["fp_second_x"] == nil || fams["fp_first_x"] != nil {
		t.Errorf("scrape after reconfigure: status %d\n%s", code, body)
	}

	for range 2 {
		if err := p.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	if h, _ := p.CheckHealth(ctx); h.Status != capability.HealthError {
		t.Errorf("health after stop = %v, want error", h.Status)
	}
}

// TestHeadAnswersAsGet: a HEAD of the scrape endpoint (uptime probes
// send them) answers 200 with the same headers and no body.
func TestHeadAnswersAsGet(t *testing.T) {
	p := configured(t, nil, newHost(t, []capability.PluginInfo{self}, nil), `{}`)
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/api/prometheus", nil))
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("HEAD /api/prometheus: %d %v, want 200 with the text format's Content-Type", rec.Code, rec.Header())
	}
}
