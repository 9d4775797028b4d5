// Package e2e holds the whole-system tests: they build the real host
// (cmd/host), the real plugins (tasks_worker, metrics, example) and the
// test plugins (host/testdata/fixture, capability/internal/testdata/
// oldprovider) once for the package, run the host as a process on a
// free loopback port with the plugins it starts, and talk to it over HTTP
// (a browser, for the tasks UI), kill its plugins with real signals and
// look at PostgreSQL and RabbitMQ behind it. The package has no code of
// its own: everything is in its _test.go files. The host's own tests, the
// ones that run its code in the test's process, are in host/.
//
// Run them with the rest of the suite (make test), or alone:
//
//	go test -count=1 ./e2e/
//	go test -count=1 -run TestHostEndToEnd ./e2e/
//
// They need what make test/setup (scripts/test-setup.sh) installs or
// starts: PostgreSQL at TEST_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable), RabbitMQ at
// TASKHOST_TEST_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/),
// promtool and prometheus (Debian's prometheus package), rabbitmq-server
// (one test runs a private node of its own) and chromium; and root, for the
// tests of the plugin trust that give files to another user. A test whose
// dependency is missing fails saying what to install, it never skips.
//
// The names and types of the scraped series are checked against
// testdata/metrics.golden; after a deliberate change of the metric surface,
// go test ./e2e/ -run TestMetricSurfaceIsGolden -update rewrites it.
package e2e
