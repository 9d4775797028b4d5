// Package metricsagg is the "metrics" plugin: the one place Prometheus
// scrapes. At each request to GET /api/prometheus it asks the host which
// plugins exist, collects every running metrics source through the host in
// parallel (each under its own timeout), decodes the expositions, renames
// every family to fp_<plugin>_<name> and merges them, with its own per-source
// health series (fp_metrics_source_up, ..._scrape_duration_seconds,
// ..._errors_total), through prometheus.Gatherers. A source that is slow,
// down or sends garbage costs only its own series: the scrape still answers
// 200 with everything else, and the failure shows up as fp_metrics_source_up
// 0, in fp_metrics_source_errors_total and, unless the host already reports
// the plugin as down, in a WARN log line. The plugin is not a
// MetricsProvider itself, so the host never asks it to collect itself; its
// own series come from its own registry.
//
// Prefixing applies to every family, go_* and process_* included, so stock
// Go dashboards will not match fp_<plugin>_go_goroutines; set
// exclude_go_runtime to leave those families out instead.
package metricsagg
