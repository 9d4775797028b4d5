package host

import (
	"bytes"
	"fmt"

	"github.com/prometheus/common/expfmt"

	"github.com/taskhost/taskhost/capability"
)

// HostMetricsSource is the name under which the host offers its own
// series to the metrics plugin, which serves them as fp_host_<name>. No
// plugin can take it: "host" is a reserved plugin name.
const HostMetricsSource = "host"

// setHTTPStats makes s's counters the host's own series.
func (h *Host) setHTTPStats(s *Server) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.httpStats = s
}

// hostMetrics renders the host's own series in the Prometheus text
// format: the HTTP side's guards at work.
func (h *Host) hostMetrics() capability.MetricsPayload {
	h.mu.Lock()
	s := h.httpStats
	h.mu.Unlock()
	var b bytes.Buffer
	series := func(name, typ, help string, v int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", name, help, name, typ, name, v)
	}
	var failures, refused, lockouts, open, evicted, evictedStalled, connsRefused int64
	if s != nil {
		failures, refused, lockouts = s.guard.failures.Load(), s.guard.refused.Load(), s.guard.lockouts.Load()
		open, evicted, evictedStalled = int64(s.conns.Open()), s.conns.evicted.Load(), s.conns.evictedStalled.Load()
		connsRefused = s.conns.refused.Load()
	}
	series("http_auth_failures_total", "counter", "Wrong admin tokens (bearer, session cookie or login form) received.", failures)
	series("http_auth_lockouts_total", "counter", "Times an address was locked out after auth_max_failures wrong tokens.", lockouts)
	series("http_auth_locked_out_refusals_total", "counter", "Credentials refused with 429, unchecked, from a locked-out address.", refused)
	series("http_connections_open", "gauge", "HTTP connections open (at most max_connections).", open)
	series("http_connections_evicted_total", "counter", "Idle HTTP connections closed to make room at max_connections or max_connections_per_client.", evicted)
	series("http_connections_stalled_evicted_total", "counter", "HTTP connections stalled in a request body closed to make room at max_connections or max_connections_per_client.", evictedStalled)
	series("http_connections_refused_total", "counter", "New HTTP connections refused with 503 because their address was at max_connections_per_client.", connsRefused)
	return capability.MetricsPayload{Body: b.Bytes(), Format: string(expfmt.NewFormat(expfmt.TypeTextPlain))}
}
