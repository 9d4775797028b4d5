package tasksworker

// The series of the plugin boundary: what provider plugins send that
// tasks_worker refuses or drops, and the handlers that run on past their
// timeout or cancel.

import (
	"github.com/prometheus/client_golang/prometheus"
)

// providerMetrics are the series of the attempts run in provider plugins.
type providerMetrics struct {
	refused *prometheus.CounterVec
	dropped *prometheus.CounterVec
}

// newProviderMetrics registers the boundary's series in reg. overrunning
// reads how many handlers run on past their timeout or cancel now.
func newProviderMetrics(reg *prometheus.Registry, overrunning func() int) *providerMetrics {
	m := &providerMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_provider_events_refused_total",
			Help: "Events provider plugins sent that no attempt of theirs could take (an attempt never given or already ended, an empty event), refused and logged with nothing changed, since this process started, by plugin. Any increase: a plugin that breaks the protocol.",
		}, []string{"plugin"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fastpluggy_tasks_provider_log_lines_dropped_total",
			Help: "Log lines of provider plugins' attempts dropped past what one attempt keeps (1,000 lines, 1 MiB), since this process started, by plugin; each report says how many of its own were dropped.",
		}, []string{"plugin"}),
	}
	reg.MustRegister(m.refused, m.dropped, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fastpluggy_tasks_overrunning",
		Help: "Attempts whose handler runs on past its timeout or a cancel request, in this process or in a provider plugin it runs tasks in: each keeps its place in its topic's concurrency limit until its code returns. Above 0 for long: a task that ignores cancellation (each is logged at WARN).",
	}, func() float64 { return float64(overrunning()) }))
	return m
}

// Refused counts one event refused from plugin.
func (m *providerMetrics) Refused(plugin string) { m.refused.WithLabelValues(plugin).Inc() }

// Dropped counts n log lines of plugin dropped.
func (m *providerMetrics) Dropped(plugin string, n int) {
	m.dropped.WithLabelValues(plugin).Add(float64(n))
}
