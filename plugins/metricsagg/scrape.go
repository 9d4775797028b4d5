package metricsagg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/taskhost/taskhost/capability"
)

// The aggregator's own series. They already carry the fp_metrics_ prefix
// and are never prefixed again.
const (
	metricSourceUp       = "fp_metrics_source_up"
	metricSourceDuration = "fp_metrics_source_scrape_duration_seconds"
	metricSourceErrors   = "fp_metrics_source_errors_total"
)

// Reasons for fp_metrics_source_errors_total.
const (
	reasonTimeout     = "timeout"      // CollectMetrics ran out of time
	reasonUnavailable = "unavailable"  // the plugin is not running
	reasonDecode      = "decode"       // the payload is not a valid exposition
	reasonCollision   = "collision"    // a renamed family clashes with one already taken
	reasonInvalidName = "invalid_name" // a renamed family is not a legacy metric name
	reasonCanceled    = "canceled"     // the scrape itself was abandoned
	reasonError       = "error"        // anything else the host reported
)

// serving reports whether a plugin in PluginInfo.State state is up and
// can be asked: running, or degraded (up, its health check says
// otherwise). A degraded plugin's series are what says why: tasks_worker's
// heartbeat age, say, while its broker refuses writes.
func serving(state string) bool { return state == "running" || state == "degraded" }

// source is one plugin the aggregator reports on in a scrape.
type source struct {
	name    string
	running bool
	state   string
}

// sourceResult is what one source gave in one scrape.
type sourceResult struct {
	source
	// families are the source's families, renamed; nil when it failed.
	families []*dto.MetricFamily
	// duration is how long collect and decode took; zero when the
	// plugin was not asked because it is not running.
	duration time.Duration
	// reason says why the source failed ("" when it is up) and err how.
	reason string
	err    error
	// dropped lists, by reason, the families left out of a source that is
	// up (collisions and invalid names).
	dropped map[string][]string
}

func (r *sourceResult) drop(reason, family string) {
	if r.dropped == nil {
		r.dropped = map[string][]string{}
	}
	r.dropped[reason] = append(r.dropped[reason], family)
}

// serveMetrics serves GET /api/prometheus: collect every source now, then
// let promhttp encode the merge in the format the scraper asked for.
func (p *Plugin) serveMetrics(w http.ResponseWriter, r *http.Request) {
	host, cfg, ok := p.current()
	if !ok {
		http.Error(w, "metrics plugin is not configured or is stopping", http.StatusServiceUnavailable)
		return
	}
	gatherers, err := p.scrape(r.Context(), host, cfg)
	if err != nil {
		p.log.Error("scrape failed", "error", err)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	// The handler is built per request because its gatherers are this
	// request's. That is cheap, and promhttp reuses its error counter
	// once it is registered in p.reg.
	promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{
		ErrorLog: errorLog{p.log},
		// One bad family must not turn the whole scrape into a 500.
		ErrorHandling:     promhttp.ContinueOnError,
		Registry:          p.handlerReg,
		EnableOpenMetrics: true,
		// Gathering is in memory by now; this only guards encoding.
		Timeout: cfg.sourceTimeout,
	}).ServeHTTP(w, r)
}

// scrape collects every metrics source and returns the gatherers to serve:
// the aggregator's own registries first, so its series win any clash, then
// one per source.
func (p *Plugin) scrape(ctx context.Context, host capability.HostServices, cfg config) (prometheus.Gatherers, error) {
	sources, err := listSources(ctx, host, cfg.sourceTimeout)
	if err != nil {
		return nil, err
	}

	results := make([]sourceResult, len(sources))
	var wg sync.WaitGroup
	for i, src := range sources {
		if !src.running {
			results[i] = sourceResult{
				source: src,
				reason: reasonUnavailable,
				err:    fmt.Errorf("plugin is %s: %w", src.state, capability.ErrUnavailable),
			}
			continue
		}
		// No concurrency limit: there are only as many sources as
		// configured plugins, and a limit would stack their timeouts.
		wg.Go(func() {
			start := time.Now()
			results[i] = collect(ctx, host, src, cfg)
			results[i].duration = time.Since(start)
		})
	}
	wg.Wait()
	dropCollisions(results)

	perScrape := prometheus.NewRegistry()
	up := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricSourceUp,
		Help: "1 if the plugin's metrics were collected and decoded in this scrape, else 0.",
	}, []string{"plugin"})
	duration := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricSourceDuration,
		Help: "Seconds it took to collect and decode the plugin's metrics in this scrape.",
	}, []string{"plugin"})
	perScrape.MustRegister(up, duration)

	gatherers := prometheus.Gatherers{p.reg, perScrape, prefixed(p.handlerReg, Name)}
	for _, res := range results {
		p.report(res)
		if res.reason != "" {
			up.WithLabelValues(res.name).Set(0)
		} else {
			up.WithLabelValues(res.name).Set(1)
		}
		if res.running {
			duration.WithLabelValues(res.name).Set(res.duration.Seconds())
		}
		if len(res.families) > 0 {
			families := res.families
			gatherers = append(gatherers, prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
				return families, nil
			}))
		}
	}
	return gatherers, nil
}

// listSources asks the host for every configured plugin and keeps those
// the aggregator reports on, sorted by name so that collisions are always
// settled the same way.
//
// ListPlugins is called without a capability filter because the filtered
// list holds only running plugins, and a metrics source that is down must
// still show up, as fp_metrics_source_up 0, rather than vanish.
func listSources(ctx context.Context, host capability.HostServices, timeout time.Duration) ([]source, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	plugins, err := host.ListPlugins(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list plugins: %w", err)
	}
	var sources []source
	for _, info := range plugins {
		if info.Name == Name {
			// The aggregator's own series come from its registries;
			// asking the host for them would recurse.
			continue
		}
		running := serving(info.State)
		hasMetrics := slices.Contains(info.Capabilities, capability.Metrics)
		// A plugin that never started may never have described itself,
		// so unknown capabilities count as a source while it is down:
		// better a 0 than a hole.
		if hasMetrics || (!running && len(info.Capabilities) == 0) {
			sources = append(sources, source{name: info.Name, running: running, state: info.State})
		}
	}
	slices.SortFunc(sources, func(a, b source) int { return strings.Compare(a.name, b.name) })
	return sources, nil
}

// collect asks one running plugin for its exposition within the source
// timeout, then decodes and renames it.
func collect(ctx context.Context, host capability.HostServices, src source, cfg config) sourceResult {
	res := sourceResult{source: src}
	ctx, cancel := context.WithTimeout(ctx, cfg.sourceTimeout)
	defer cancel()
	payload, err := collectWithin(ctx, host, src.name)
	if err != nil {
		res.reason, res.err = failureReason(err), err
		return res
	}
	families, err := decode(payload)
	if err != nil {
		res.reason, res.err = reasonDecode, err
		return res
	}
	res.families = rename(&res, families, cfg.excludeGoRuntime)
	return res
}

// collectWithin calls CollectMetrics but returns when ctx is done even if
// the call does not, so a HostServices that ignores its context cannot
// hold the scrape. The abandoned call finishes in the background.
func collectWithin(ctx context.Context, host capability.HostServices, plugin string) (capability.MetricsPayload, error) {
	type result struct {
		payload capability.MetricsPayload
		err     error
	}
	done := make(chan result, 1) // buffered: the sender never blocks
	go func() {
		payload, err := host.CollectMetrics(ctx, plugin)
		done <- result{payload, err}
	}()
	select {
	case r := <-done:
		return r.payload, r.err
	case <-ctx.Done():
		return capability.MetricsPayload{}, fmt.Errorf("collect metrics of %s: %w", plugin, context.Cause(ctx))
	}
}

// failureReason maps a CollectMetrics error to an errors_total reason.
func failureReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return reasonTimeout
	case errors.Is(err, context.Canceled):
		return reasonCanceled
	case errors.Is(err, capability.ErrUnavailable), errors.Is(err, capability.ErrNotFound):
		// NotFound: the plugin went away between ListPlugins and now.
		return reasonUnavailable
	}
	return reasonError
}

// decode reads every family of a payload. payload.Format is an expfmt
// content type; empty means the classic text format. A payload that does
// not decode completely is rejected whole, as Prometheus rejects a target
// whose exposition does not parse: half a source would look healthy.
func decode(payload capability.MetricsPayload) ([]*dto.MetricFamily, error) {
	format := expfmt.Format(payload.Format)
	if format == "" {
		format = expfmt.NewFormat(expfmt.TypeTextPlain)
	}
	dec := expfmt.NewDecoder(bytes.NewReader(payload.Body), format)
	var families []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return families, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode %q payload: %w", format, err)
		}
		families = append(families, mf)
	}
}

// rename moves each family under fp_<plugin>_ and sorts its labels, as
// Gatherers expects. Histogram and summary suffixes follow, since a family
// stores its base name. Families whose new name is not a valid legacy
// metric name (Gatherers would not notice) are dropped and noted in res.
func rename(res *sourceResult, families []*dto.MetricFamily, excludeGoRuntime bool) []*dto.MetricFamily {
	prefix := "fp_" + res.name + "_"
	kept := families[:0]
	for _, mf := range families {
		name := mf.GetName()
		if excludeGoRuntime && (strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_")) {
			continue
		}
		newName := prefix + name
		if !model.LegacyValidation.IsValidMetricName(newName) {
			res.drop(reasonInvalidName, name)
			continue
		}
		mf.Name = &newName
		for _, m := range mf.GetMetric() {
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		}
		kept = append(kept, mf)
	}
	// The text decoder returns families in map order; sorting makes the
	// collision check below deterministic within a source too.
	slices.SortFunc(kept, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return kept
}

// dropCollisions removes every family that would be exposed under a name
// already taken, by the aggregator or by an earlier source. Prefixes are
// ambiguous (plugin a's b_c and plugin a_b's c are both fp_a_b_c), and a
// histogram's _bucket, _sum and _count can clash with another family.
// Gatherers would also drop such a family, but could not say whose it
// was. results must be sorted by plugin name, so the same one wins every
// scrape.
func dropCollisions(results []sourceResult) {
	taken := map[string]bool{metricSourceUp: true, metricSourceDuration: true, metricSourceErrors: true}
	for i := range results {
		res := &results[i]
		kept := res.families[:0]
		for _, mf := range res.families {
			names := exposedNames(mf)
			if slices.ContainsFunc(names, func(n string) bool { return taken[n] }) {
				res.drop(reasonCollision, mf.GetName())
				continue
			}
			for _, n := range names {
				taken[n] = true
			}
			kept = append(kept, mf)
		}
		res.families = kept
	}
}

// exposedNames lists the sample names a family is written as.
func exposedNames(mf *dto.MetricFamily) []string {
	n := mf.GetName()
	switch mf.GetType() {
	case dto.MetricType_SUMMARY:
		return []string{n, n + "_sum", n + "_count"}
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		return []string{n, n + "_bucket", n + "_sum", n + "_count"}
	}
	return []string{n}
}

// report counts and logs what went wrong with one source, with at most one
// log line per source per scrape.
func (p *Plugin) report(res sourceResult) {
	if res.reason != "" {
		p.sourceErrors.WithLabelValues(res.name, res.reason).Inc()
		if !res.running {
			// The host already logs why a plugin is down; repeating it
			// at every scrape would only add noise.
			p.log.Debug("metrics source is not running", "plugin", res.name, "state", res.state)
			return
		}
		p.log.Warn("metrics source failed", "plugin", res.name, "reason", res.reason, "error", res.err)
		return
	}
	if len(res.dropped) == 0 {
		return
	}
	reasons := slices.Sorted(maps.Keys(res.dropped))
	args := []any{"plugin", res.name, "reason", strings.Join(reasons, ",")}
	for _, r := range reasons {
		p.sourceErrors.WithLabelValues(res.name, r).Inc()
		args = append(args, r, res.dropped[r])
	}
	p.log.Warn("metrics source families dropped", args...)
}

// errorLog adapts hclog to promhttp.Logger. promhttp passes a message and
// often a prometheus.MultiError, which would print as several lines; this
// makes it one WARN record with the errors as a list.
type errorLog struct{ log hclog.Logger }

func (l errorLog) Println(v ...any) {
	var msg, errs []string
	for _, x := range v {
		err, ok := x.(error)
		if !ok {
			msg = append(msg, strings.TrimSuffix(fmt.Sprint(x), ":"))
			continue
		}
		var multi prometheus.MultiError
		if !errors.As(err, &multi) {
			multi = prometheus.MultiError{err}
		}
		for _, e := range multi {
			errs = append(errs, e.Error())
		}
	}
	l.log.Warn(strings.Join(msg, " "), "errors", errs)
}

// prefixed serves g's families under fp_<plugin>_, like every other series
// of the scrape. promhttp registers its own error counter by a fixed name;
// this keeps it inside our prefix.
func prefixed(g prometheus.Gatherer, plugin string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, err := g.Gather()
		for _, mf := range families {
			name := "fp_" + plugin + "_" + mf.GetName()
			mf.Name = &name
		}
		return families, err
	})
}
