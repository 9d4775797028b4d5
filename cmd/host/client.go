package main

// The commands that talk to a running host (`host tasks ...`, `host
// schedules ...`, `host topics ...`, `host reclaim`, `host plugins`), on
// the client package.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/taskhost/taskhost/client"
	"github.com/taskhost/taskhost/host"
)

// env is what a client command runs with.
type env struct {
	c      *client.Client
	json   bool // -json: print the answer as JSON
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// clientCommand is one command on a running host.
type clientCommand struct {
	name  string // "tasks submit"
	args  string // its positional arguments, for the usage
	nargs int    // how many positional arguments it takes
	// optArgs: the positional arguments may also be left out (the
	// command's run checks what it was given).
	optArgs bool
	about   string
	// setup defines the command's own flags on fs and returns its run.
	setup func(fs *flag.FlagSet) func(ctx context.Context, e *env, args []string) error
	// noTimeout: -timeout defaults to none (a long upload, a wait).
	noTimeout bool
}

// usageError is a mistake in the command line: exit 2.
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

// clientCommands are the commands in the order the usage lists them.
var clientCommands = []clientCommand{
	{name: "tasks submit", about: "submit one task, or stream NDJSON of tasks with -file (one {\"task\", \"topic\", \"payload\", \"delay_seconds\", \"max_attempts\"} a line)", setup: tasksSubmit, noTimeout: true},
	{name: "tasks get", args: "ID", nargs: 1, about: "show a task", setup: tasksGet},
	{name: "tasks wait", args: "ID", nargs: 1, about: "wait until a task is done, failed, dead or cancelled, and show it (exit 1 unless done)", setup: tasksWait, noTimeout: true},
	{name: "tasks list", about: "list tasks, newest first", setup: tasksList},
	{name: "tasks cancel", args: "[ID]", nargs: 1, optArgs: true, about: "cancel a task (a running one is asked to stop), or with -topic and/or -task and no ID the queued tasks they select", setup: tasksCancel},
	{name: "schedules list", about: "list the schedules", setup: schedulesList},
	{name: "schedules get", args: "NAME", nargs: 1, about: "show a schedule", setup: schedulesGet},
	{name: "schedules enable", args: "NAME", nargs: 1, about: "enable a schedule", setup: schedulesEnable(true)},
	{name: "schedules disable", args: "NAME", nargs: 1, about: "disable a schedule", setup: schedulesEnable(false)},
	{name: "schedules delete", args: "NAME", nargs: 1, about: "delete a schedule", setup: schedulesDelete},
	{name: "topics list", about: "list the topics with their counts", setup: topicsList},
	{name: "topics pause", args: "NAME", nargs: 1, about: "pause a topic: its tasks wait until it is resumed", setup: topicsPause(true)},
	{name: "topics resume", args: "NAME", nargs: 1, about: "resume a paused topic", setup: topicsPause(false)},
	{name: "reclaim", about: "run one orphan-reclaim pass now and print what it did", setup: reclaim},
	{name: "plugins", about: "list the host's plugins with their state", setup: pluginsList},
}

// clientGroups are the first words of the client commands.
var clientGroups = map[string]bool{"tasks": true, "schedules": true, "topics": true, "reclaim": true, "plugins": true}

// commonFlags are the flags every client command takes.
type commonFlags struct {
	config, addr, token *string
	json                *bool
	timeout             *time.Duration
}

func addCommonFlags(fs *flag.FlagSet, noTimeout bool) commonFlags {
	def := 2 * time.Minute
	if noTimeout {
		def = 0
	}
	return commonFlags{
		config:  configFlag(fs),
		addr:    fs.String("addr", "", "host address `URL`, such as http://127.0.0.1:8080 (default: $TASKHOST_LISTEN, else the listen of -config's file, else 127.0.0.1:8080)"),
		token:   fs.String("token", os.Getenv("TASKHOST_ADMIN_TOKEN"), "admin `TOKEN` (default $TASKHOST_ADMIN_TOKEN, else -config's admin_token)"),
		json:    fs.Bool("json", false, "print the answer as JSON"),
		timeout: fs.Duration("timeout", def, "give up after `D`, such as 30s; 0: never (default 2m; never for tasks submit and tasks wait)"),
	}
}

// client is the client the flags ask for. What -addr and -token leave
// out comes from the config file; a file named explicitly (-config, or
// $TASKHOST_CONFIG) that cannot be read or is invalid is an error, as is
// an invalid default file: only a missing default file (taskhost.yaml) is
// no config at all, and then the address is $TASKHOST_LISTEN, else
// 127.0.0.1:8080, with no token.
func (f commonFlags) client(fs *flag.FlagSet) (*client.Client, error) {
	base, token := *f.addr, *f.token
	if base == "" || token == "" {
		cfg, err := host.LoadConfig(*f.config)
		if err != nil && (configExplicit(fs) || !errors.Is(err, iofs.ErrNotExist)) {
			return nil, configError{err}
		}
		if base == "" {
			switch {
			case err == nil:
				base = cfg.Listen // $TASKHOST_LISTEN already replaced it
			case os.Getenv(host.ListenEnv) != "":
				base = os.Getenv(host.ListenEnv)
			default:
				base = host.DefaultListen
			}
		}
		if token == "" && err == nil {
			token = cfg.AdminToken
		}
	}
	return client.New(base, client.WithToken(token)), nil
}

// configExplicit reports whether the config file was named, by -config
// on the command line or by $TASKHOST_CONFIG, rather than being the
// default taskhost.yaml.
func configExplicit(fs *flag.FlagSet) bool {
	set := os.Getenv("TASKHOST_CONFIG") != ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "config" {
			set = true
		}
	})
	return set
}

// configError: the config file a client command would read its address
// and token from cannot be used. err names the file.
type configError struct{ err error }

func (c configError) Error() string {
	return fmt.Sprintf("%v (name a valid config file with -config FILE or $TASKHOST_CONFIG, or give both -addr and -token)", c.err)
}

func (c configError) Unwrap() error { return c.err }

// findClientCommand is the command named by the start of args, and the
// rest of args.
func findClientCommand(args []string) (*clientCommand, []string) {
	for i := range clientCommands {
		words := strings.Fields(clientCommands[i].name)
		if len(args) >= len(words) && strings.Join(args[:len(words)], " ") == clientCommands[i].name {
			return &clientCommands[i], args[len(words):]
		}
	}
	return nil, args
}

// clientCmd runs `host <group> [sub] args...`.
func (cl *cli) clientCmd(args []string) int {
	cmd, rest := findClientCommand(args)
	if cmd == nil {
		group := args[0]
		if len(args) > 1 && isHelp(args[1]) {
			cl.groupUsage(cl.stdout, group)
			return 0
		}
		if len(args) == 1 {
			fmt.Fprintf(cl.stderr, "host %s: say which command\n\n", group)
		} else {
			fmt.Fprintf(cl.stderr, "host %s: unknown command %q\n\n", group, args[1])
		}
		cl.groupUsage(cl.stderr, group)
		return 2
	}
	fs := flag.NewFlagSet("host "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	common := addCommonFlags(fs, cmd.noTimeout)
	run := cmd.setup(fs)
	pos, err := parseInterleaved(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		cl.commandUsage(cl.stdout, cmd, fs, true)
		return 0
	}
	if err == nil && len(pos) != cmd.nargs && !(cmd.optArgs && len(pos) == 0) {
		err = fmt.Errorf("takes %d argument(s) (%s), got %d: %q", cmd.nargs, orNone(cmd.args), len(pos), pos)
	}
	if err != nil {
		fmt.Fprintf(cl.stderr, "host %s: %v\n", cmd.name, err)
		cl.commandUsage(cl.stderr, cmd, fs, true)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *common.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *common.timeout)
		defer cancel()
	}
	c, err := common.client(fs)
	if err != nil {
		fmt.Fprintf(cl.stderr, "host %s: %v\n", cmd.name, err)
		return 2
	}
	e := &env{c: c, json: *common.json, stdin: cl.stdin, stdout: cl.stdout, stderr: cl.stderr}
	err = run(ctx, e, pos)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(cl.stderr, "host %s: %v\n", cmd.name, err)
		cl.commandUsage(cl.stderr, cmd, fs, true)
		return 2
	case errors.Is(err, errExit1):
		return 1
	}
	fmt.Fprintf(cl.stderr, "host %s: %v\n", cmd.name, err)
	return 1
}

// errExit1: the command printed why it fails.
var errExit1 = errors.New("exit 1")

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func isHelp(a string) bool {
	return a == "-h" || a == "-help" || a == "--help" || a == "--h" || a == "help"
}

// parseInterleaved parses fs's flags wherever they are among the
// positional arguments (`host tasks get 17 -json`), and returns the
// positional ones. After "--" everything is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printJSON prints v indented.
func (e *env) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "%s\n", b)
	return err
}

func (e *env) table() *tabwriter.Writer { return tabwriter.NewWriter(e.stdout, 0, 2, 2, ' ', 0) }

func tasksGet(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		t, err := e.c.Get(ctx, args[0])
		if err != nil {
			return err
		}
		return e.printTask(t)
	}
}

func (e *env) printTask(t client.Task) error {
	if e.json {
		return e.printJSON(t)
	}
	w := e.table()
	row := func(k string, v any) {
		s := fmt.Sprint(v)
		if s != "" && s != "<nil>" {
			fmt.Fprintf(w, "%s\t%s\n", k, s)
		}
	}
	row("id", t.ID)
	row("task", t.Task)
	row("topic", t.Topic)
	row("state", t.State)
	row("attempts", fmt.Sprintf("%d of %d", t.Attempts, t.MaxAttempts))
	row("created_at", t.CreatedAt.Format(time.RFC3339Nano))
	if t.ClaimedBy != nil {
		row("claimed_by", *t.ClaimedBy)
	}
	if t.CancelRequestedAt != nil {
		row("cancel_requested_at", t.CancelRequestedAt.Format(time.RFC3339Nano))
	}
	if t.FinishedAt != nil {
		row("finished_at", t.FinishedAt.Format(time.RFC3339Nano))
	}
	if t.Error != nil {
		row("error", *t.Error)
	}
	if len(t.Result) > 0 {
		row("result", string(t.Result))
	}
	return w.Flush()
}

func tasksWait(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		t, err := e.c.Wait(ctx, args[0])
		if err != nil {
			if t.State != "" {
				return fmt.Errorf("%w; task %s is still %s", err, args[0], t.State)
			}
			return err
		}
		if err := e.printTask(t); err != nil {
			return err
		}
		if t.State != client.StateDone {
			fmt.Fprintf(e.stderr, "host tasks wait: task %s ended %s\n", t.ID, t.State)
			return errExit1
		}
		return nil
	}
}

// maxListLimit is the most tasks the API lists at once (broker.MaxListLimit;
// the host links no broker).
const maxListLimit = 1000

func tasksList(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	var f client.Filter
	fs.StringVar(&f.State, "state", "", "only tasks in `STATE`: queued, running, done, failed, dead or cancelled")
	fs.StringVar(&f.Topic, "topic", "", "only tasks of `TOPIC`")
	fs.StringVar(&f.Task, "task", "", "only tasks named `NAME`")
	fs.IntVar(&f.Limit, "limit", 20, fmt.Sprintf("`N` tasks, 1 to %d", maxListLimit))
	fs.StringVar(&f.Before, "before", "", "the tasks older than task `ID` (the next page)")
	return func(ctx context.Context, e *env, _ []string) error {
		if f.Limit < 1 || f.Limit > maxListLimit {
			return usageError{fmt.Sprintf("-limit must be from 1 to %d, got %d", maxListLimit, f.Limit)}
		}
		p, err := e.c.List(ctx, f)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(p)
		}
		w := e.table()
		fmt.Fprintln(w, "ID\tTASK\tTOPIC\tSTATE\tATTEMPTS\tCREATED")
		for _, t := range p.Tasks {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", t.ID, t.Task, t.Topic, t.State, t.Attempts, t.CreatedAt.Format(time.RFC3339))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if p.NextBefore != "" {
			fmt.Fprintf(e.stderr, "more: add -before %s\n", p.NextBefore)
		}
		return nil
	}
}

func schedulesList(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, _ []string) error {
		list, err := e.c.Schedules(ctx)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(list)
		}
		w := e.table()
		fmt.Fprintln(w, "NAME\tTASK\tTIMING\tENABLED\tLAST ATTEMPT\tLAST SUCCESS\tNEXT RUN")
		for _, s := range list {
			timing := s.Cron
			if timing == "" {
				timing = fmt.Sprintf("every %ds", s.IntervalSeconds)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%s\t%s\t%s\n", s.Name, s.Task, timing, s.Enabled,
				timeOrDash(s.LastAttempt), timeOrDash(s.LastSuccess), timeOrDash(s.NextRun))
		}
		return w.Flush()
	}
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}

func (e *env) printSchedule(s client.Schedule) error {
	if e.json {
		return e.printJSON(s)
	}
	w := e.table()
	fmt.Fprintf(w, "name\t%s\ntask\t%s\ntopic\t%s\npayload\t%s\ntiming\t%s\nenabled\t%v\nmissed_policy\t%s\nsource\t%s\n",
		s.Name, s.Task, s.Topic, s.Payload, s.Timing, s.Enabled, s.MissedPolicy, s.Source)
	fmt.Fprintf(w, "last_attempt\t%s\nlast_success\t%s\nnext_run\t%s\n", timeOrDash(s.LastAttempt), timeOrDash(s.LastSuccess), timeOrDash(s.NextRun))
	if s.Waiting != nil {
		fmt.Fprintf(w, "waiting\tsince %s: %s\n", timeOrDash(s.Waiting.Since), s.Waiting.Why)
	}
	return w.Flush()
}

func schedulesGet(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		s, err := e.c.GetSchedule(ctx, args[0])
		if err != nil {
			return err
		}
		return e.printSchedule(s)
	}
}

func schedulesEnable(on bool) func(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(*flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			s, err := e.c.GetSchedule(ctx, args[0])
			if err != nil {
				return err
			}
			s, err = e.c.UpdateSchedule(ctx, client.ScheduleSpec{
				Name: s.Name, Task: s.Task, Topic: s.Topic, Payload: s.Payload, IntervalSeconds: s.IntervalSeconds,
				Cron: s.Cron, Enabled: &on, MissedPolicy: s.MissedPolicy,
			})
			if err != nil {
				return err
			}
			return e.printSchedule(s)
		}
	}
}

func schedulesDelete(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		if err := e.c.DeleteSchedule(ctx, args[0]); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "deleted schedule %s\n", args[0])
		return nil
	}
}

func topicsList(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, _ []string) error {
		list, err := e.c.Topics(ctx)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(list)
		}
		w := e.table()
		fmt.Fprintln(w, "TOPIC\tQUEUED\tRUNNING\tDEAD LETTER\tSUBSCRIBERS\tLIMIT\tPAUSED")
		for _, t := range list {
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%v\n", t.Name, t.Queued, t.Running, t.DeadLetter, t.Subscribers, t.ConcurrencyLimit, t.Paused)
		}
		return w.Flush()
	}
}

func topicsPause(paused bool) func(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(*flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			if err := e.c.SetTopic(ctx, args[0], client.TopicPatch{Paused: &paused}); err != nil {
				return err
			}
			what := "resumed"
			if paused {
				what = "paused"
			}
			fmt.Fprintf(e.stdout, "topic %s %s\n", args[0], what)
			return nil
		}
	}
}

func reclaim(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, _ []string) error {
		res, err := e.c.Reclaim(ctx)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(res)
		}
		fmt.Fprintln(e.stdout, res.Message)
		return nil
	}
}

func pluginsList(*flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, _ []string) error {
		list, err := e.c.Plugins(ctx)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(map[string]any{"plugins": list})
		}
		w := e.table()
		fmt.Fprintln(w, "PLUGIN\tSTATE\tVERSION\tPID\tRESTARTS\tLAST ERROR")
		for _, p := range list {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", p.Name, p.State, p.Version, p.PID, p.Restarts, p.LastError)
		}
		return w.Flush()
	}
}
