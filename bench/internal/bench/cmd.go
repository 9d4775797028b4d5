package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/taskhost/taskhost/broker"
	"github.com/taskhost/taskhost/capability"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// benchTask is the no-op task the pools run.
const benchTask = "bench.noop"

type benchConfig struct {
	kind         string
	dsn          string
	schema       string
	dataDir      string
	keep         bool
	jobs         int
	workers      int
	limit        int
	rate         float64
	duration     time.Duration
	runs         int
	claimLatency bool
	claimSamples int
	poolOnly     bool // no task reports: the pool alone
	submitters   int
	submitBatch  int
	timeout      time.Duration
	verbose      bool
	cpuProfile   string
	memProfile   string
	acrossHosts  bool
	idlePools    int
	idleFor      time.Duration
	realHost     bool
	hostBin      string
	hostTask     string // -real-host: the task submitted
	hostPlugin   string // -real-host: a plugin enabled besides tasks_worker
	resume       bool   // -real-host: time from a paused topic's resume
	hostSteady   bool   // -real-host: also a steady stream through the host
	readers      bool   // -real-host: an operator's reads run during the runs
}

func benchDefaultDSN() string {
	for _, env := range []string{tasksworker.DSNEnv, "TEST_DATABASE_URL"} {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Main runs `host bench` with args (what follows "bench") and returns its
// exit status: 0 done, 1 failed, 2 a usage error.
func Main(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c benchConfig
	fs.StringVar(&c.kind, "broker", "postgres", "broker to measure: memory, local, postgres or rabbitmq (over a postgres state store; $TASKHOST_AMQP_URL, default the local RabbitMQ)")
	fs.StringVar(&c.dsn, "dsn", benchDefaultDSN(), "PostgreSQL address (default $"+tasksworker.DSNEnv+", then $TEST_DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema for the bench's tables (default a fresh tw_bench_<random>); it is dropped at the end unless -keep")
	fs.StringVar(&c.dataDir, "data-dir", "", "directory for the local broker's database file (default a temporary directory)")
	fs.BoolVar(&c.keep, "keep", false, "keep the schema (postgres) or the database file (local) at the end")
	fs.IntVar(&c.jobs, "jobs", 50000, "messages per bulk submit and burn-down")
	fs.IntVar(&c.workers, "workers", 100, "worker pool concurrency (handlers)")
	fs.IntVar(&c.limit, "limit", -1, "the topics' concurrency limit (default -workers; 0 is unlimited)")
	fs.Float64Var(&c.rate, "rate", 500, "steady stream: submits per second")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "steady stream: how long it submits")
	fs.IntVar(&c.runs, "runs", 3, "repetitions of each phase (every run is printed, and the median)")
	fs.BoolVar(&c.claimLatency, "claim-latency", false, "postgres: also time Claim with 1,000 and 1,000,000 queued messages (seeding takes about 20 s)")
	fs.IntVar(&c.claimSamples, "claim-samples", 1000, "claims timed per run of the claim-latency phase")
	fs.IntVar(&c.submitters, "submitters", 8, "goroutines submitting in the bulk submit phase")
	fs.BoolVar(&c.poolOnly, "pool-only", false, "measure the pool alone, without the task report the tasks_worker plugin stores per attempt (by default the bench stores them as the plugin does, and the burn-down ends when the last report is stored)")
	fs.Bool("reports", false, "deprecated and changes nothing: reports are stored by default now (-pool-only turns them off)")
	fs.IntVar(&c.submitBatch, "submit-batch", 1000, "messages per SubmitMany call (0 or 1: Submit one by one)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up on a phase after this long")
	fs.BoolVar(&c.verbose, "v", false, "log the pool's and broker's warnings to stderr")
	fs.BoolVar(&c.acrossHosts, "across-hosts", false, "postgres: instead of the main phases, the steady stream submitted by one broker and run by another broker's pool, as on two hosts (listening, then polling)")
	fs.IntVar(&c.idlePools, "idle-pools", 0, "postgres: instead of the main phases, run this many idle brokers+pools and count the database's transactions/s (polling, then listening); give -dsn a database of its own")
	fs.DurationVar(&c.idleFor, "idle-for", 30*time.Second, "how long -idle-pools counts")
	fs.BoolVar(&c.realHost, "real-host", false, "postgres: instead of the main phases, start the real host and tasks_worker plugin processes on the bench's schema, submit -jobs tasks through POST tasks/batch (NDJSON) and time them from the first submit until the database has them all done, with their reports")
	fs.StringVar(&c.hostTask, "task", realHostTask, "-real-host: the task submitted, with the payload {\"n\": i}: tasks_worker's demo.echo, or a provider plugin's task (see -plugin), such as example.noop")
	fs.StringVar(&c.hostPlugin, "plugin", "", "-real-host: a plugin the host runs besides tasks_worker, from plugins/ beside the host binary (such as example, for -task example.noop)")
	fs.BoolVar(&c.hostSteady, "steady", false, "-real-host: after the runs, a steady stream through the host: -rate POST tasks a second for -duration, each task's latency from its creation to its outcome as the database records them (p50, p95, p99)")
	fs.BoolVar(&c.readers, "readers", false, "-real-host: while the runs go, an operator's reads run as a browser and Prometheus would: the task UI's dashboard every 5 s and the metrics plugin's scrape every 15 s (the metrics plugin runs too); their latencies are printed")
	fs.BoolVar(&c.resume, "resume", false, "-real-host: submit each run's tasks on a paused topic, then time from the topic's resume until the last is done with its report (the burn-down alone, without the submit)")
	fs.StringVar(&c.hostBin, "host-bin", "", "-real-host: the `path` of the host binary, with the tasks_worker plugin in plugins/ beside it (default: the build this bench runs from, laid out as make build does: bin/host and bin/plugins)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process to this file")
	fs.StringVar(&c.memProfile, "memprofile", "", "write the bench process's allocation profile (every allocation since it started) to this file when it ends")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: host bench [flags]\n\nMeasures the broker and the worker pool with their default settings.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if c.limit < 0 {
		c.limit = c.workers
	}
	switch {
	case c.jobs < 1 || c.workers < 1 || c.runs < 1 || c.rate <= 0 || c.duration <= 0 || c.submitters < 1 || c.claimSamples < 1:
		fmt.Fprintln(os.Stderr, "host bench: -jobs, -workers, -runs, -rate, -duration, -submitters and -claim-samples must be positive")
		return 2
	case c.submitBatch < 0 || c.submitBatch > broker.MaxSubmitBatch:
		fmt.Fprintf(os.Stderr, "host bench: -submit-batch must be from 0 to %d\n", broker.MaxSubmitBatch)
		return 2
	case (c.acrossHosts || c.idlePools > 0 || c.realHost) && c.kind != "postgres":
		fmt.Fprintln(os.Stderr, "host bench: -across-hosts, -idle-pools and -real-host need -broker postgres")
		return 2
	case c.realHost && (c.acrossHosts || c.idlePools > 0):
		fmt.Fprintln(os.Stderr, "host bench: -real-host runs instead of -across-hosts and -idle-pools: give one of them")
		return 2
	case !c.realHost && (c.hostTask != realHostTask || c.hostPlugin != "" || c.resume || c.hostSteady || c.readers):
		fmt.Fprintln(os.Stderr, "host bench: -task, -plugin, -resume and -steady go with -real-host")
		return 2
	case c.hostPlugin != "" && !capability.ValidName(c.hostPlugin):
		fmt.Fprintf(os.Stderr, "host bench: -plugin %q is not a plugin name (lower-case letters, digits and _)\n", c.hostPlugin)
		return 2
	case c.poolOnly && c.realHost:
		fmt.Fprintln(os.Stderr, "host bench: -pool-only does not apply to -real-host, whose plugin always stores its reports")
		return 2
	case c.idlePools < 0 || c.idleFor <= 0:
		fmt.Fprintln(os.Stderr, "host bench: -idle-pools must not be negative and -idle-for must be positive")
		return 2
	case c.claimLatency && c.kind != "postgres":
		fmt.Fprintln(os.Stderr, "host bench: -claim-latency needs -broker postgres")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "host bench: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "host bench: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	if c.memProfile != "" {
		defer writeAllocProfile(c.memProfile)
	}
	if err := runBench(ctx, c, os.Stdout); err != nil {
		if ctx.Err() != nil {
			err = errors.New("interrupted")
		}
		fmt.Fprintf(os.Stderr, "host bench: %v\n", err)
		if errors.Is(err, errUnknownBroker) {
			return 2
		}
		return 1
	}
	return 0
}

// writeAllocProfile writes the process's allocation profile to path; a
// failure is reported, not fatal: the bench's figures are already out.
func writeAllocProfile(path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "host bench: the allocation profile: %v\n", err)
	}
}
