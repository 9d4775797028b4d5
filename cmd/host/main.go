// Command host runs the taskhost plugin host, and talks to a running one.
//
//	host -config taskhost.yaml          run the host (the default command)
//	host check-config -config FILE      validate a config file and exit
//	host migrate [-dsn DSN]             migrate the PostgreSQL broker's tables
//	host bench [-broker KIND] [flags]   measure the broker and the worker pool
//	host tasks|schedules|topics|reclaim|plugins ...
//	                                    talk to a running host (client.go)
//	host version                        print the version
//
// migrate and bench are the task system's, and run in binaries of their
// own (taskscmd.go): migrate in the tasks_worker plugin's, bench in
// taskhost-bench beside this one, built from the bench module (bench/).
// So the host links no broker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
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
	cl := &cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	os.Exit(cl.run(os.Args[1:]))
}

// cli is the command line with its standard streams.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

func (cl *cli) run(args []string) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	if cmd == "run" && len(args) > 0 && isHelp(args[0]) {
		cmd = "help"
	}
	switch {
	case cmd == "run":
		return cl.runHost(args)
	case cmd == "check-config":
		return cl.checkConfig(args)
	case cmd == "migrate":
		return cl.migrate(args)
	case cmd == "bench":
		return cl.bench(args)
	case clientGroups[cmd]:
		return cl.clientCmd(append([]string{cmd}, args...))
	case cmd == "version":
		fmt.Fprintln(cl.stdout, version)
		return 0
	case cmd == "help":
		cl.usage(cl.stdout)
		return 0
	}
	fmt.Fprintf(cl.stderr, "host: unknown command %q\n\n", cmd)
	cl.usage(cl.stderr)
	return 2
}

// usage lists every command and its flags.
func (cl *cli) usage(w io.Writer) {
	fmt.Fprint(w, `usage: host [COMMAND] [FLAGS]   (flags may come before or after the arguments)

running a host:
  host [run] [-config FILE]      run the host and its enabled plugins
  host check-config [-config FILE]
                                 validate a config file, each enabled plugin's block included
      -config FILE               config file (default $TASKHOST_CONFIG, else taskhost.yaml;
                                 examples/taskhost.yaml is the one `+"`make run`"+` uses)
  host migrate [-config FILE] [-dsn DSN] [-schema S]
                                 bring the PostgreSQL broker's tables up to date
  host bench [-broker memory|local|postgres] [-jobs N] [-workers N] ...
                                 measure the broker and the worker pool (host bench -h lists its flags)
  host version                   print the version
  host help                      this text

talking to a running host:
`)
	for i := range clientCommands {
		cmd := &clientCommands[i]
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		addCommonFlags(fs, cmd.noTimeout)
		cmd.setup(fs)
		cl.commandUsage(w, cmd, fs, false)
	}
	fmt.Fprint(w, `
  flags of every command talking to a host:
`)
	fs := flag.NewFlagSet("common", flag.ContinueOnError)
	addCommonFlags(fs, false)
	printFlags(w, fs, nil)
	fmt.Fprint(w, `
exit status: 0 done; 1 the command failed (the host refused, could not be reached, a batch
stopped at a bad line, a waited task ended failed, dead or cancelled); 2 a mistake in the command line.
`)
}

// commonFlagNames are the flags addCommonFlags defines.
var commonFlagNames = map[string]bool{"config": true, "addr": true, "token": true, "json": true, "timeout": true}

// commandUsage prints a client command's line and its own flags, and the
// common ones when withCommon.
func (cl *cli) commandUsage(w io.Writer, cmd *clientCommand, fs *flag.FlagSet, withCommon bool) {
	line := "  host " + cmd.name
	if cmd.args != "" {
		line += " " + cmd.args
	}
	own := 0
	fs.VisitAll(func(f *flag.Flag) {
		if !commonFlagNames[f.Name] {
			own++
		}
	})
	if own > 0 {
		line += " [FLAGS]"
	}
	fmt.Fprintf(w, "%s\n      %s\n", line, cmd.about)
	printFlags(w, fs, func(name string) bool { return withCommon || !commonFlagNames[name] })
}

// groupUsage prints the commands of one group, such as tasks.
func (cl *cli) groupUsage(w io.Writer, group string) {
	fmt.Fprintf(w, "host %s commands (flags may come before or after the arguments):\n", group)
	for i := range clientCommands {
		cmd := &clientCommands[i]
		if strings.Fields(cmd.name)[0] != group {
			continue
		}
		fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
		addCommonFlags(fs, cmd.noTimeout)
		cmd.setup(fs)
		cl.commandUsage(w, cmd, fs, false)
	}
	fmt.Fprintln(w, "  every one also takes -config FILE, -addr URL, -token TOKEN, -json and -timeout D (host help)")
}

// printFlags prints the flags of fs that keep selects (all when nil).
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if keep != nil && !keep(f.Name) {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		head := "-" + f.Name
		if name != "" {
			head += " " + name
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" && f.Name != "token" && f.Name != "timeout" {
			def = fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "      %-22s %s%s\n", head, usage, def)
	})
}

func configFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("TASKHOST_CONFIG")
	if def == "" {
		def = "taskhost.yaml"
	}
	return fs.String("config", def, "config `FILE` (env TASKHOST_CONFIG)")
}

// loadConfig loads the config at path, or says on standard error why it
// cannot, with where a config comes from when there is no such file.
func (cl *cli) loadConfig(path string) (*host.Config, error) {
	cfg, err := host.LoadConfig(path)
	if err == nil {
		return cfg, nil
	}
	fmt.Fprintf(cl.stderr, "host: %v\n", err)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(cl.stderr, `host: no config file %s: name one with -config FILE or $TASKHOST_CONFIG (default taskhost.yaml in
      the current directory). To try taskhost, run `+"`make run`"+` in the source tree: it builds everything and
      starts the host with examples/taskhost.yaml; or copy that file and edit it. host help lists the commands.
`, path)
	}
	return nil, err
}

// httpDrain bounds how long shutdown waits for open HTTP requests.
const httpDrain = 10 * time.Second

func (cl *cli) checkConfig(args []string) int {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.SetOutput(cl.stderr)
	path := configFlag(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := cl.loadConfig(*path)
	if err != nil {
		return 1
	}
	if len(cfg.UnsetEnv) > 0 {
		fmt.Fprintf(cl.stdout, "%s: note: refers to environment variables that are not set (their values are empty): %s\n", *path, strings.Join(cfg.UnsetEnv, ", "))
	}
	failed := false
	for _, c := range host.CheckPluginConfigs(context.Background(), cfg) {
		switch {
		case c.Err != nil:
			failed = true
			fmt.Fprintf(cl.stderr, "host: %s: %v\n", *path, c.Err)
		case c.Checked:
			fmt.Fprintf(cl.stdout, "%s: plugins.%s.config: ok\n", *path, c.Plugin)
		default:
			fmt.Fprintf(cl.stdout, "%s: plugins.%s.config: %s\n", *path, c.Plugin, c.Note)
		}
	}
	if failed {
		return 1
	}
	fmt.Fprintf(cl.stdout, "%s: ok (%d plugins configured)\n", *path, len(cfg.Plugins))
	return 0
}

func (cl *cli) runHost(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(cl.stderr)
	path := configFlag(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := cl.loadConfig(*path)
	if err != nil {
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
