package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/taskhost/taskhost/host"
)

// apiClient talks to a running host's HTTP API.
type apiClient struct {
	base  string
	token string
	raw   bool
	http  *http.Client
}

// clientFlags are the flags every client command takes.
func clientFlags(fs *flag.FlagSet) func() (*apiClient, error) {
	path := configFlag(fs)
	addr := fs.String("addr", "", "host address, e.g. http://127.0.0.1:8080 (default: the config's listen)")
	token := fs.String("token", os.Getenv("TASKHOST_ADMIN_TOKEN"), "admin token (env TASKHOST_ADMIN_TOKEN)")
	raw := fs.Bool("json", false, "print the raw JSON answer")
	return func() (*apiClient, error) {
		base := *addr
		if base == "" {
			base = "http://" + host.DefaultListen
			if cfg, err := host.LoadConfig(*path); err == nil {
				base = "http://" + cfg.Listen
				if *token == "" {
					*token = cfg.AdminToken
				}
			}
		}
		if !strings.Contains(base, "://") {
			base = "http://" + base
		}
		return &apiClient{base: strings.TrimRight(base, "/"), token: *token, raw: *raw, http: &http.Client{Timeout: 2 * time.Minute}}, nil
	}
}

// do sends a request and decodes a JSON answer into out. A non-2xx answer
// becomes an error carrying the server's message.
func (c *apiClient) do(method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// A bearer header also tells the admin endpoints this is not a
	// browser form (no CSRF token needed); without a configured token the
	// host ignores its value.
	tok := c.token
	if tok == "" {
		tok = "none"
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the host at %s (is it running? set -addr): %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s (HTTP %d)", e.Error, resp.StatusCode)
		}
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if c.raw {
		var pretty bytes.Buffer
		if json.Indent(&pretty, data, "", "  ") == nil {
			fmt.Println(pretty.String())
		} else {
			fmt.Println(string(data))
		}
		return errPrinted
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// errPrinted means the raw answer was printed; nothing more to do.
var errPrinted = fmt.Errorf("printed")

func clientCmd(cmd string, args []string) int {
	sub := ""
	if cmd == "tasks" || cmd == "schedules" {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(os.Stderr, "host %s: say what to do: %s\n", cmd, map[string]string{"tasks": "submit, get or list", "schedules": "list"}[cmd])
			return 2
		}
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet(strings.TrimSpace(cmd+" "+sub), flag.ContinueOnError)
	client := clientFlags(fs)
	var run func(c *apiClient) error
	switch cmd + " " + sub {
	case "tasks submit":
		task := fs.String("task", "", "task name (required)")
		topic := fs.String("topic", "", "topic (default: the task's own)")
		payload := fs.String("payload", "{}", "payload, a JSON value")
		delay := fs.Float64("delay", 0, "seconds before it may run")
		run = func(c *apiClient) error {
			if *task == "" {
				return fmt.Errorf("-task is required")
			}
			if !json.Valid([]byte(*payload)) {
				return fmt.Errorf("-payload is not valid JSON: %s", *payload)
			}
			var out struct {
				ID string `json:"id"`
			}
			body := map[string]any{"task": *task, "payload": json.RawMessage(*payload), "delay_seconds": *delay}
			if *topic != "" {
				body["topic"] = *topic
			}
			if err := c.do("POST", "/plugin-pkg/tasks_worker/api/tasks", body, &out); err != nil {
				return err
			}
			fmt.Println(out.ID)
			return nil
		}
	case "tasks get":
		run = func(c *apiClient) error {
			if fs.NArg() != 1 {
				return fmt.Errorf("usage: host tasks get ID")
			}
			var t map[string]any
			if err := c.do("GET", "/plugin-pkg/tasks_worker/api/tasks/"+url.PathEscape(fs.Arg(0)), nil, &t); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 2, 2, ' ', 0)
			for _, k := range []string{"id", "task", "topic", "state", "attempts", "created_at", "claimed_by", "finished_at", "error"} {
				if v, ok := t[k]; ok && v != nil && v != "" {
					fmt.Fprintf(w, "%s\t%v\n", k, v)
				}
			}
			if r, ok := t["result"]; ok && r != nil {
				b, _ := json.Marshal(r)
				fmt.Fprintf(w, "result\t%s\n", b)
			}
			return w.Flush()
		}
	case "tasks list":
		state := fs.String("state", "", "queued, running, done, failed or dead")
		topic := fs.String("topic", "", "topic")
		task := fs.String("task", "", "task name")
		limit := fs.Int("limit", 20, "how many")
		run = func(c *apiClient) error {
			q := url.Values{}
			for k, v := range map[string]string{"state": *state, "topic": *topic, "task": *task} {
				if v != "" {
					q.Set(k, v)
				}
			}
			q.Set("limit", fmt.Sprint(*limit))
			var out struct {
				Tasks []map[string]any `json:"tasks"`
			}
			if err := c.do("GET", "/plugin-pkg/tasks_worker/api/tasks?"+q.Encode(), nil, &out); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 2, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tTASK\tTOPIC\tSTATE\tATTEMPTS\tCREATED")
			for _, t := range out.Tasks {
				fmt.Fprintf(w, "%v\t%v\t%v\t%v\t%v\t%v\n", t["id"], t["task"], t["topic"], t["state"], t["attempts"], t["created_at"])
			}
			return w.Flush()
		}
	case "reclaim ":
		run = func(c *apiClient) error {
			var out struct {
				Message string          `json:"message"`
				Result  json.RawMessage `json:"result"`
			}
			if err := c.do("POST", "/admin/plugins/tasks_worker/actions/reclaim_orphaned_messages", map[string]string{}, &out); err != nil {
				return err
			}
			fmt.Println(out.Message)
			return nil
		}
	case "schedules list":
		run = func(c *apiClient) error {
			var out struct {
				Schedules []map[string]any `json:"schedules"`
			}
			if err := c.do("GET", "/plugin-pkg/tasks_worker/api/schedules", nil, &out); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 2, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tTASK\tTIMING\tENABLED\tLAST ATTEMPT\tLAST SUCCESS\tNEXT RUN")
			for _, s := range out.Schedules {
				timing := fmt.Sprint(s["cron"])
				if s["cron"] == nil || s["cron"] == "" {
					timing = fmt.Sprintf("every %vs", s["interval_seconds"])
				}
				fmt.Fprintf(w, "%v\t%v\t%s\t%v\t%v\t%v\t%v\n", s["name"], s["task"], timing, s["enabled"],
					orDash(s["last_attempt"]), orDash(s["last_success"]), orDash(s["expected_next_run"]))
			}
			return w.Flush()
		}
	case "plugins ":
		run = func(c *apiClient) error {
			var out struct {
				Plugins []host.Status `json:"plugins"`
			}
			if err := c.do("GET", "/admin/api/plugins", nil, &out); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 2, 2, ' ', 0)
			fmt.Fprintln(w, "PLUGIN\tSTATE\tVERSION\tPID\tRESTARTS\tLAST ERROR")
			for _, p := range out.Plugins {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", p.Name, p.State, p.Version, p.PID, p.Restarts, p.LastError)
			}
			return w.Flush()
		}
	default:
		fmt.Fprintf(os.Stderr, "host %s: unknown command %q\n", cmd, sub)
		usage()
		return 2
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c, err := client()
	if err == nil {
		err = run(c)
	}
	if err == errPrinted {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "host %s: %v\n", strings.TrimSpace(cmd+" "+sub), err)
		return 1
	}
	return 0
}

func orDash(v any) string {
	if v == nil || v == "" {
		return "-"
	}
	return fmt.Sprint(v)
}
