package metricsagg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/taskhost/taskhost/capability"
)

// Name is the plugin's name: its config key, its URL segment and the
// fp_metrics_ prefix of its own series.
const Name = "metrics"

// Version is the plugin's version, reported by Describe.
const Version = "0.1.0"

const (
	defaultSourceTimeout = 3 * time.Second
	maxSourceTimeout     = 30 * time.Second
)

// config is the plugin's parsed `config` block.
type config struct {
	// sourceTimeout bounds each plugin's CollectMetrics call and decode.
	sourceTimeout time.Duration
	// excludeGoRuntime drops the sources' go_* and process_* families.
	excludeGoRuntime bool
}

// Plugin is the metrics aggregator. It implements capability.Lifecycle and
// capability.HTTPHandler. Create it with New.
type Plugin struct {
	log    hclog.Logger
	router http.Handler

	// reg is the aggregator's own long-lived registry. It holds what must
	// outlive one scrape: fp_metrics_source_errors_total and promhttp's
	// own error counter. Per-scrape series live in a registry built for
	// each request, so a plugin that is gone leaves no stale gauge behind.
	reg          *prometheus.Registry
	handlerReg   *prometheus.Registry // promhttp's own counter, served prefixed
	sourceErrors *prometheus.CounterVec

	mu      sync.Mutex
	host    capability.HostServices // nil until Configure
	cfg     config
	stopped bool
}

var (
	_ capability.Lifecycle   = (*Plugin)(nil)
	_ capability.HTTPHandler = (*Plugin)(nil)
)

// New returns an unconfigured aggregator that logs to log.
func New(log hclog.Logger) *Plugin {
	p := &Plugin{
		log:        log,
		reg:        prometheus.NewRegistry(),
		handlerReg: prometheus.NewRegistry(),
		sourceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricSourceErrors,
			Help: "Failed or partial collections of a plugin's metrics, by reason.",
		}, []string{"plugin", "reason"}),
		cfg: config{sourceTimeout: defaultSourceTimeout},
	}
	p.reg.MustRegister(p.sourceErrors)

	r := chi.NewRouter()
	r.Use(middleware.GetHead) // HEAD answers as GET does, without the body
	r.Get("/api/prometheus", p.serveMetrics)
	p.router = r
	return p
}

// Describe implements capability.Lifecycle.
func (p *Plugin) Describe(context.Context) (capability.Description, error) {
	return capability.Description{Name: Name, Version: Version}, nil
}

// Configure implements capability.Lifecycle. The host calls it again after
// every restart of the plugin process and may call it more than once per
// process; each call replaces the host services and the settings. An
// invalid config leaves the previous one in place.
func (p *Plugin) Configure(_ context.Context, req capability.ConfigureRequest) error {
	cfg, err := parseConfig(req.Config)
	if err != nil {
		return err
	}
	if req.Host == nil {
		return errors.New("configure metrics: no host services")
	}
	p.mu.Lock()
	p.host, p.cfg, p.stopped = req.Host, cfg, false
	p.mu.Unlock()
	p.log.Info("configured", "source_timeout", cfg.sourceTimeout.String(), "exclude_go_runtime", cfg.excludeGoRuntime)
	return nil
}

// CheckHealth implements capability.Lifecycle: the aggregator has no state
// of its own to lose, so it is healthy as soon as it can reach the host.
// The health of each source is reported as fp_metrics_source_up instead.
func (p *Plugin) CheckHealth(context.Context) (capability.Health, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.stopped:
		return capability.Health{Status: capability.HealthError, Message: "stopped"}, nil
	case p.host == nil:
		return capability.Health{Status: capability.HealthError, Message: "not configured"}, nil
	}
	return capability.Health{Status: capability.HealthOK}, nil
}

// Stop implements capability.Lifecycle. It refuses new scrapes; a scrape in
// flight is already bounded by the source timeout, so there is nothing to
// drain. Stop is idempotent and safe before Configure.
func (p *Plugin) Stop(context.Context) error {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	return nil
}

// ServeHTTP implements capability.HTTPHandler. The path starts at the
// plugin's root: the host serves it under /plugin-pkg/metrics/.
func (p *Plugin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.router.ServeHTTP(w, r)
}

// current returns the host and settings to use for one scrape, or ok false
// when the plugin cannot serve one.
func (p *Plugin) current() (host capability.HostServices, cfg config, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.host, p.cfg, p.host != nil && !p.stopped
}

// parseConfig reads the plugin's config block. Every problem is an
// *capability.InvalidConfigError naming the setting, so the host can show
// it instead of restarting the plugin in a loop.
func parseConfig(raw json.RawMessage) (config, error) {
	cfg := config{sourceTimeout: defaultSourceTimeout}
	if len(bytes.TrimSpace(raw)) == 0 {
		return cfg, nil
	}
	// Decoding into a map first, rather than with DisallowUnknownFields,
	// lets the error name the offending key.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return config{}, &capability.InvalidConfigError{Problem: "config must be a JSON object: " + err.Error()}
	}
	// Sorted, so a config with several problems always reports the same one.
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		val := fields[key]
		switch key {
		case "source_timeout_seconds":
			var secs float64
			if err := json.Unmarshal(val, &secs); err != nil {
				return config{}, &capability.InvalidConfigError{Key: key, Problem: "must be a number of seconds"}
			}
			d := time.Duration(secs * float64(time.Second))
			if d <= 0 || d > maxSourceTimeout {
				return config{}, &capability.InvalidConfigError{
					Key:     key,
					Problem: fmt.Sprintf("must be more than 0 and at most %g, got %g", maxSourceTimeout.Seconds(), secs),
				}
			}
			cfg.sourceTimeout = d
		case "exclude_go_runtime":
			if err := json.Unmarshal(val, &cfg.excludeGoRuntime); err != nil {
				return config{}, &capability.InvalidConfigError{Key: key, Problem: "must be true or false"}
			}
		default:
			return config{}, &capability.InvalidConfigError{Key: key, Problem: "unknown setting"}
		}
	}
	return cfg, nil
}
