// Command host runs the taskhost plugin host.
//
//	host -config taskhost.yaml          run the host (the default command)
//	host check-config -config FILE      validate a config file and exit
//	host migrate [-dsn DSN]             migrate the PostgreSQL broker's tables
//	host bench [-broker KIND] [flags]   measure the broker and the worker pool
//	host version                        print the version
//
// migrate and bench are the task system's: the tasks_worker plugin's
// binary runs them (see tasksCmd), so the host links no broker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/taskhost/taskhost/host"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runHost(args)
	case "check-config":
		return checkConfig(args)
	case "migrate":
		return tasksCmd(cmd, args, true)
	case "bench":
		return tasksCmd(cmd, args, false)
	case "tasks", "reclaim", "schedules", "plugins":
		return clientCmd(cmd, args)
	case "version":
		fmt.Println(version)
		return 0
	case "help":
		usage()
		return 0
	}
	fmt.Fprintf(os.Stderr, "host: unknown command %q\n\n", cmd)
	usage()
	return 2
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  host [run] -config FILE        run the host and its enabled plugins
  host check-config -config FILE validate a config file
  host migrate [-config FILE] [-dsn DSN] [-schema S]
                                 bring the PostgreSQL broker's tables up to date
  host bench [-broker memory|local|postgres] [-jobs N] [-workers N] ...
                                 measure the broker and the worker pool (-h lists the flags)
  host version                   print the version

talking to a running host (-addr, default from -config's listen; -token or $TASKHOST_ADMIN_TOKEN):
  host tasks submit -task NAME [-topic T] [-payload JSON] [-delay SECONDS]
  host tasks get ID
  host tasks list [-state S] [-topic T] [-task NAME] [-limit N]
  host reclaim                   run one orphan-reclaim pass now and print what it did
  host schedules list
  host plugins                   every plugin with its state
  (add -json to any of them for the raw answer)
`)
}

func configFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("TASKHOST_CONFIG")
	if def == "" {
		def = "taskhost.yaml"
	}
	return fs.String("config", def, "config file (env TASKHOST_CONFIG)")
}

// httpDrain bounds how long shutdown waits for open HTTP requests.
const httpDrain = 10 * time.Second

func checkConfig(args []string) int {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	path := configFlag(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := host.LoadConfig(*path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "host: %v\n", err)
		return 1
	}
	if len(cfg.UnsetEnv) > 0 {
		fmt.Printf("%s: note: refers to environment variables that are not set (their values are empty): %s\n", *path, strings.Join(cfg.UnsetEnv, ", "))
	}
	failed := false
	for _, c := range host.CheckPluginConfigs(context.Background(), cfg) {
		switch {
		case c.Err != nil:
			failed = true
			fmt.Fprintf(os.Stderr, "host: %s: %v\n", *path, c.Err)
		case c.Checked:
			fmt.Printf("%s: plugins.%s.config: ok\n", *path, c.Plugin)
		default:
			fmt.Printf("%s: plugins.%s.config: %s\n", *path, c.Plugin, c.Note)
		}
	}
	if failed {
		return 1
	}
	fmt.Printf("%s: ok (%d plugins configured)\n", *path, len(cfg.Plugins))
	return 0
}

func runHost(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := configFlag(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := host.LoadConfig(*path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "host: %v\n", err)
		return 1
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:   "host",
		Level:  hclog.LevelFromString(cfg.LogLevel),
		Output: os.Stderr,
	})
	if os.Geteuid() == 0 {
		log.Warn("running as root: plugins run as root too; prefer a dedicated user")
	}
	if len(cfg.UnsetEnv) > 0 {
		log.Info("the config refers to environment variables that are not set; their values are empty", "variables", strings.Join(cfg.UnsetEnv, ", "))
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("cannot listen; is another host running, or set listen: to a free address", "listen", cfg.Listen, "error", err)
		return 1
	}
	h := host.New(cfg, log, version)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := h.Start(ctx); err != nil {
		log.Error("start", "error", err)
		return 1
	}
	hs := host.NewServer(h, log)
	srv := hs.HTTPServer() // timeouts and the connection cap: see host.Server.HTTPServer
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(hs.Listener(ln)) }()
	base := "http://" + ln.Addr().String()
	log.Info("taskhost is up", "admin", base+"/admin/", "metrics", base+"/plugin-pkg/metrics/api/prometheus", "config", *path)

	code := 0
	select {
	case <-ctx.Done():
		log.Info("signal received, stopping plugins")
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server failed", "error", err)
			code = 1
		}
	}
	stop()
	// HTTP first (proxied requests still reach their plugins), for at most
	// httpDrain, so a long request cannot eat the plugins' stop time.
	httpCtx, cancelHTTP := context.WithTimeout(context.Background(), httpDrain)
	defer cancelHTTP()
	if err := srv.Shutdown(httpCtx); err != nil {
		log.Warn("HTTP requests still open at shutdown were cut", "error", err)
		_ = srv.Close()
	}
	// Plugins stop in two waves (host.Stop), each may use the timeout.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*cfg.ShutdownTimeout+10*time.Second)
	defer cancel()
	if err := h.Stop(shutdownCtx); err != nil {
		log.Error("stop", "error", err)
		code = 1
	}
	log.Info("stopped")
	return code
}
