// Package host loads, runs and supervises taskhost plugins and serves their
// HTTP, the admin UI and the host services they call back into.
//
// One config file (see Config) names the plugins to run. Each enabled
// plugin gets a Supervisor that starts its binary with go-plugin (gRPC,
// AutoMTLS), checks its name and optional SHA-256 pin, configures it,
// watches for the process to exit, polls its health and restarts it with
// exponential backoff until a crash-loop budget is spent; then the plugin is
// failed until an operator restarts it from /admin.
//
// The HTTP side (Server) proxies /plugin-pkg/<plugin>/* to a plugin's
// HTTPHandler capability, renders /admin with one button per action a
// plugin lists, and answers /healthz. Plugins reach each other only through
// the host's HostServices, so the host stays the one source of truth about
// what runs and is healthy.
package host
