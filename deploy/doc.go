// Package deploy holds no code: it holds the deployment files for the
// Prometheus surface of taskhost and the tests that keep them honest. The
// alert rules are in prometheus/fastpluggy-tasks.rules.yml with their
// promtool unit tests next to them, and the Grafana dashboard is
// grafana/fastpluggy-tasks.json. Both select series by the names the
// metrics aggregator serves at /plugin-pkg/metrics/api/prometheus, which
// carry the fp_<plugin>_ prefix. A selector that matches nothing reports
// healthy forever, so the tests run promtool on the rules (they fail, not
// skip, without it) and fail when the rules, their tests or the dashboard
// name a series that is not in the list of public names, or when a public
// name is no longer emitted by the Go code. docs/observability.md describes
// every series.
package deploy
