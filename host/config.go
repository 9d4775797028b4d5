package host

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"unicode"

	"fmt"
	"net"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/taskhost/taskhost/capability"
)

// Config is the host's configuration file.
//
//	listen: 127.0.0.1:8080
//	plugins_dir: bin/plugins
//	admin_token: ${TASKHOST_ADMIN_TOKEN}
//	plugins:
//	  tasks_worker:
//	    enabled: true
//	    sha256: ""
//	    env: [TASKHOST_DATABASE_URL]
//	    config: {broker: local}
//
// ${NAME} in any value is replaced by the environment variable NAME (empty
// when unset), so secrets stay out of the file.
type Config struct {
	// Listen is the HTTP address; default 127.0.0.1:8080. LoadConfig
	// takes $TASKHOST_LISTEN over the file's listen when it is set.
	Listen string
	// PluginsDir holds the fp-plugin-<name> binaries; default bin/plugins.
	// A relative one is relative to the host's working directory, not to
	// the config file's: `host run` and `host check-config` both resolve
	// it so (PluginsDirAbs), and have always done so for run.
	PluginsDir string
	// AdminToken guards /admin and every mutating request. It is required
	// when Listen is not a loopback address.
	AdminToken string
	// LogLevel is trace, debug, info, warn or error; default info.
	LogLevel string
	// ShutdownTimeout bounds each plugin's graceful Stop; default 30s.
	ShutdownTimeout time.Duration
	// HealthInterval is how often running plugins are health-checked;
	// default 10s.
	HealthInterval time.Duration
	// HungRestart is how long a plugin may go without answering its
	// health check before it is killed and restarted; 0 never restarts it
	// for that (it stays degraded). Default 60s.
	HungRestart time.Duration
	// RestartBudget is how many restarts within RestartWindow put a plugin
	// in the failed state; default 5 in 10 minutes.
	RestartBudget int
	RestartWindow time.Duration
	// MaxBodyBytes bounds proxied request bodies; default 8 MiB.
	MaxBodyBytes int64
	// PublicReads lets reads (GET, HEAD, OPTIONS) of plugin HTTP under
	// /plugin-pkg/ through without the admin token. Default: true when
	// Listen is a loopback address, false otherwise. /admin/ always needs
	// the token when one is set; /healthz never does.
	PublicReads bool
	// IdleTimeout closes a keep-alive connection idle this long; default
	// 60s.
	IdleTimeout time.Duration
	// BodyTimeout bounds the reading of a request body, from the start of
	// the request; default 30s. It does not bound the response.
	BodyTimeout time.Duration
	// MaxConnections caps the open HTTP connections; at the cap, a new
	// one closes one stalled in its request body, else the longest idle
	// one; default 512.
	MaxConnections int
	// MaxConnectionsPerClient caps the open HTTP connections of one
	// client address (clientKey: an IPv6 one by its /64); at the cap, a
	// new one from that address closes one of its own as MaxConnections
	// does, or is refused. Default 64, or MaxConnections if lower; at
	// most MaxConnections.
	MaxConnectionsPerClient int
	// AuthMaxFailures wrong tokens from one address within
	// AuthLockout lock that address out for AuthLockout; default 10 in
	// 300s.
	AuthMaxFailures int
	AuthLockout     time.Duration
	// Plugins in file order.
	Plugins []PluginConfig
	// UnsetEnv names the variables the file refers to (${NAME}) that are
	// not set: their values are empty. The host warns about them.
	UnsetEnv []string
}

// PluginConfig is one entry under plugins:.
type PluginConfig struct {
	Name    string
	Enabled bool
	// SHA256 pins the binary (hex); empty means no check.
	SHA256 string
	// Env lists host environment variables passed to the plugin. Plugins
	// do not inherit the host's environment otherwise.
	Env []string
	// Config is the free-form config block as JSON ("{}" when absent).
	Config json.RawMessage
}

// Plugin returns the named plugin's config.
func (c *Config) Plugin(name string) (PluginConfig, bool) {
	for _, p := range c.Plugins {
		if p.Name == name {
			return p, true
		}
	}
	return PluginConfig{}, false
}

// ConfigError is a problem in the config file. Key is the dotted path of
// the offending setting.
type ConfigError struct {
	File    string
	Key     string
	Line    int
	Problem string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// Defaults.
const (
	DefaultListen     = "127.0.0.1:8080"
	DefaultPluginsDir = "bin/plugins"
	// DefaultMaxConnectionsPerClient leaves room for browsers (six
	// connections each) and API clients behind one NAT, while one
	// address holds at most an eighth of the default max_connections.
	DefaultMaxConnectionsPerClient = 64
)

// ListenEnv names the environment variable that, when set and not
// empty, replaces the config file's listen (as `make run LISTEN=...`
// does), so one file serves on another port without being edited.
const ListenEnv = "TASKHOST_LISTEN"

// PluginsDirAbs is PluginsDir as an absolute path: a relative one is
// joined to the working directory. Messages about missing plugins name
// it, so a user who ran from another directory sees where the host
// looked.
func (c *Config) PluginsDirAbs() string { return absDir(c.PluginsDir) }

// reservedNames cannot be plugin names.
var reservedNames = map[string]bool{"host": true, "admin": true}

// LoadConfig reads and validates the config file at path. A non-empty
// $TASKHOST_LISTEN (ListenEnv) replaces the file's listen, and is
// validated as listen is.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	p := configParser{file: path, listen: os.Getenv(ListenEnv)}
	return p.parse(data)
}

// ParseConfig parses and validates config file contents; file names the
// source in errors.
func ParseConfig(file string, data []byte) (*Config, error) {
	p := configParser{file: file}
	return p.parse(data)
}

type configParser struct {
	file string
	// listen, when not empty, replaces the file's listen ($TASKHOST_LISTEN).
	listen string
	unset  map[*yaml.Node][]string // a value -> the unset variables it refers to
}

// unsetNote is what an error about value n adds when n refers to unset
// variables; subject names the value ("the value", "admin_token").
func (p *configParser) unsetNote(n *yaml.Node, subject string) string {
	names := p.unset[n]
	switch len(names) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf(" (%s refers to ${%s}, which is not set)", subject, names[0])
	}
	return fmt.Sprintf(" (%s refers to ${%s}, which are not set)", subject, strings.Join(names, "}, ${"))
}

func (p *configParser) errf(key string, n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	problem := fmt.Sprintf(format, args...) + p.unsetNote(n, "the value")
	return &ConfigError{File: p.file, Key: key, Line: line, Problem: problem}
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandEnv replaces ${NAME} in every scalar value (not in keys),
// recording the unset variables by line.
func (p *configParser) expandEnv(n *yaml.Node) {
	switch n.Kind {
	case yaml.ScalarNode:
		if strings.Contains(n.Value, "${") {
			n.Value = envRef.ReplaceAllStringFunc(n.Value, func(m string) string {
				name := m[2 : len(m)-1]
				v, ok := os.LookupEnv(name)
				if !ok && !slices.Contains(p.unset[n], name) {
					if p.unset == nil {
						p.unset = map[*yaml.Node][]string{}
					}
					p.unset[n] = append(p.unset[n], name)
				}
				return v
			})
		}
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			p.expandEnv(n.Content[i])
		}
	default:
		for _, c := range n.Content {
			p.expandEnv(c)
		}
	}
}

func (p *configParser) parse(data []byte) (*Config, error) {
	cfg := &Config{
		Listen:          DefaultListen,
		PluginsDir:      DefaultPluginsDir,
		LogLevel:        "info",
		ShutdownTimeout: 30 * time.Second,
		HealthInterval:  10 * time.Second,
		HungRestart:     60 * time.Second,
		RestartBudget:   5,
		RestartWindow:   10 * time.Minute,
		MaxBodyBytes:    8 << 20,
		IdleTimeout:     60 * time.Second,
		BodyTimeout:     30 * time.Second,
		MaxConnections:  512,
		AuthMaxFailures: 10,
		AuthLockout:     5 * time.Minute,
	}
	publicReadsSet, perClientSet := false, false
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, &ConfigError{File: p.file, Problem: "not valid YAML: " + err.Error()}
	}
	for {
		// Further documents are refused, but for empty ones (a trailing
		// "---").
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil || !emptyDocument(&more) {
			return nil, &ConfigError{File: p.file, Problem: "more than one YAML document (a line of ---): put every setting in one"}
		}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &ConfigError{File: p.file, Problem: "the file is empty; see README.md for an example"}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, p.errf("", root, "the top level must be a mapping of settings")
	}
	p.expandEnv(root)
	for _, names := range p.unset {
		for _, name := range names {
			if !slices.Contains(cfg.UnsetEnv, name) {
				cfg.UnsetEnv = append(cfg.UnsetEnv, name)
			}
		}
	}
	slices.Sort(cfg.UnsetEnv)
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if seen[k.Value] {
			return nil, p.errf(k.Value, k, "set twice")
		}
		seen[k.Value] = true
		var err error
		switch k.Value {
		case "listen":
			err = p.str(k.Value, v, &cfg.Listen)
		case "plugins_dir":
			err = p.str(k.Value, v, &cfg.PluginsDir)
		case "admin_token":
			err = p.str(k.Value, v, &cfg.AdminToken)
		case "log_level":
			err = p.str(k.Value, v, &cfg.LogLevel)
		case "shutdown_timeout_seconds":
			err = p.seconds(k.Value, v, &cfg.ShutdownTimeout, 1, 3600)
		case "health_interval_seconds":
			err = p.seconds(k.Value, v, &cfg.HealthInterval, 1, 3600)
		case "hung_restart_seconds":
			err = p.seconds(k.Value, v, &cfg.HungRestart, 0, 86400)
		case "restart_window_seconds":
			err = p.seconds(k.Value, v, &cfg.RestartWindow, 1, 86400)
		case "restart_budget":
			err = p.intRange(k.Value, v, &cfg.RestartBudget, 1, 1000)
		case "max_body_bytes":
			var n int
			err = p.intRange(k.Value, v, &n, 1024, 64<<20-(1<<20))
			cfg.MaxBodyBytes = int64(n)
		case "public_reads":
			err = p.boolean(k.Value, v, &cfg.PublicReads)
			publicReadsSet = true
		case "idle_timeout_seconds":
			err = p.seconds(k.Value, v, &cfg.IdleTimeout, 1, 3600)
		case "body_timeout_seconds":
			err = p.seconds(k.Value, v, &cfg.BodyTimeout, 1, 3600)
		case "max_connections":
			err = p.intRange(k.Value, v, &cfg.MaxConnections, 16, 1000000)
		case "max_connections_per_client":
			err = p.intRange(k.Value, v, &cfg.MaxConnectionsPerClient, 1, 1000000)
			perClientSet = true
		case "auth_max_failures":
			err = p.intRange(k.Value, v, &cfg.AuthMaxFailures, 1, 1000000)
		case "auth_lockout_seconds":
			err = p.seconds(k.Value, v, &cfg.AuthLockout, 1, 86400)
		case "plugins":
			err = p.plugins(v, cfg)
		default:
			err = p.errf(k.Value, k, "unknown setting; known settings are %s", strings.Join(knownTopKeys, ", "))
		}
		if err != nil {
			return nil, err
		}
	}
	if p.listen != "" {
		cfg.Listen = p.listen
	}
	if !publicReadsSet {
		host, _, _ := net.SplitHostPort(cfg.Listen)
		cfg.PublicReads = IsLoopback(host)
	}
	if !perClientSet {
		cfg.MaxConnectionsPerClient = min(DefaultMaxConnectionsPerClient, cfg.MaxConnections)
	} else if cfg.MaxConnectionsPerClient > cfg.MaxConnections {
		return nil, p.errf("max_connections_per_client", findKey(root, "max_connections_per_client"),
			"%d is above max_connections (%d): one address cannot hold more connections than the host; set it at most to max_connections",
			cfg.MaxConnectionsPerClient, cfg.MaxConnections)
	}
	if err := p.validate(cfg, root); err != nil {
		return nil, err
	}
	return cfg, nil
}

var knownTopKeys = []string{"listen", "plugins_dir", "admin_token", "log_level", "shutdown_timeout_seconds",
	"health_interval_seconds", "hung_restart_seconds", "restart_budget", "restart_window_seconds", "max_body_bytes",
	"public_reads", "idle_timeout_seconds", "body_timeout_seconds", "max_connections", "max_connections_per_client", "auth_max_failures",
	"auth_lockout_seconds", "plugins"}

func (p *configParser) str(key string, v *yaml.Node, dst *string) error {
	// Any scalar is taken as its text: an unquoted hash or token made of
	// digits is still a string here.
	if v.Kind != yaml.ScalarNode {
		return p.errf(key, v, "expected a string, got %s", describeNode(v))
	}
	if v.Tag == "!!null" {
		*dst = ""
		return nil
	}
	*dst = v.Value
	return nil
}

func (p *configParser) boolean(key string, v *yaml.Node, dst *bool) error {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return p.errf(key, v, "expected true or false, got %s", describeNode(v))
	}
	return v.Decode(dst)
}

func (p *configParser) intRange(key string, v *yaml.Node, dst *int, lo, hi int) error {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return p.errf(key, v, "expected a whole number, got %s", describeNode(v))
	}
	var n int
	if err := v.Decode(&n); err != nil {
		return p.errf(key, v, "expected a whole number: %v", err)
	}
	if n < lo || n > hi {
		return p.errf(key, v, "%d is out of range; use a value from %d to %d", n, lo, hi)
	}
	*dst = n
	return nil
}

func (p *configParser) seconds(key string, v *yaml.Node, dst *time.Duration, lo, hi int) error {
	var n int
	if err := p.intRange(key, v, &n, lo, hi); err != nil {
		return err
	}
	*dst = time.Duration(n) * time.Second
	return nil
}

func describeNode(v *yaml.Node) string {
	switch v.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	switch v.Tag {
	case "!!null":
		return "nothing (null)"
	case "!!str":
		return fmt.Sprintf("the string %q", v.Value)
	}
	return fmt.Sprintf("%q", v.Value)
}

func (p *configParser) plugins(v *yaml.Node, cfg *Config) error {
	if v.Tag == "!!null" {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return p.errf("plugins", v, "expected a mapping of plugin name to settings, got %s", describeNode(v))
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, pv := v.Content[i], v.Content[i+1]
		name := k.Value
		key := "plugins." + name
		if !capability.ValidName(name) {
			return p.errf(key, k, "invalid plugin name: use lower-case letters, digits and _, starting with a letter, at most 41 characters (it becomes the URL segment and the metric prefix fp_<name>_)")
		}
		if reservedNames[name] {
			return p.errf(key, k, "%q is reserved for the host", name)
		}
		if _, dup := cfg.Plugin(name); dup {
			return p.errf(key, k, "configured twice")
		}
		pc := PluginConfig{Name: name, Config: json.RawMessage("{}")}
		if pv.Kind != yaml.MappingNode && pv.Tag != "!!null" {
			return p.errf(key, pv, "expected a mapping with enabled, sha256, env and config, got %s", describeNode(pv))
		}
		for j := 0; j+1 < len(pv.Content); j += 2 {
			sk, sv := pv.Content[j], pv.Content[j+1]
			skey := key + "." + sk.Value
			var err error
			switch sk.Value {
			case "enabled":
				err = p.boolean(skey, sv, &pc.Enabled)
			case "sha256":
				if err = p.str(skey, sv, &pc.SHA256); err == nil && pc.SHA256 != "" {
					pc.SHA256 = strings.ToLower(strings.TrimSpace(pc.SHA256))
					if b, herr := hex.DecodeString(pc.SHA256); herr != nil || len(b) != 32 {
						err = p.errf(skey, sv, "expected 64 hex digits (the output of sha256sum), got %q", sv.Value)
					}
				}
			case "env":
				err = p.envList(skey, sv, &pc.Env)
			case "config":
				err = p.pluginConfig(skey, sv, &pc.Config)
			default:
				err = p.errf(skey, sk, "unknown setting; a plugin takes enabled, sha256, env and config")
			}
			if err != nil {
				return err
			}
		}
		cfg.Plugins = append(cfg.Plugins, pc)
	}
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (p *configParser) envList(key string, v *yaml.Node, dst *[]string) error {
	if v.Kind != yaml.SequenceNode {
		return p.errf(key, v, "expected a list of environment variable names, got %s", describeNode(v))
	}
	for _, e := range v.Content {
		if e.Kind != yaml.ScalarNode || !envName.MatchString(e.Value) {
			return p.errf(key, e, "%s is not an environment variable name", describeNode(e))
		}
		*dst = append(*dst, e.Value)
	}
	return nil
}

func (p *configParser) pluginConfig(key string, v *yaml.Node, dst *json.RawMessage) error {
	if v.Tag == "!!null" {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return p.errf(key, v, "expected a mapping (the plugin's own settings), got %s", describeNode(v))
	}
	var m map[string]any
	if err := v.Decode(&m); err != nil {
		return p.errf(key, v, "cannot read: %v", err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return p.errf(key, v, "cannot be handed to the plugin as JSON: %v (keys must be strings)", err)
	}
	*dst = b
	return nil
}

// emptyDocument reports whether n is a YAML document with nothing in it.
func emptyDocument(n *yaml.Node) bool {
	if n.Kind == 0 || len(n.Content) == 0 {
		return true
	}
	c := n.Content[0]
	return c.Kind == yaml.ScalarNode && c.Tag == "!!null" && (c.Value == "" || c.Value == "~" || c.Value == "null")
}

func (p *configParser) validate(cfg *Config, root *yaml.Node) error {
	// An error about an overriding $TASKHOST_LISTEN names the variable,
	// not the file's line, which is not what is wrong.
	listenNode, from := findKey(root, "listen"), ""
	if p.listen != "" {
		listenNode, from = nil, " (from $"+ListenEnv+", which replaces the file's listen)"
	}
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return p.errf("listen", listenNode, "%q%s is not host:port (e.g. 127.0.0.1:8080): %v", cfg.Listen, from, err)
	}
	if port == "" {
		return p.errf("listen", listenNode, "%q%s: the port is empty", cfg.Listen, from)
	}
	if n, err := strconv.Atoi(port); err == nil {
		if n < 0 || n > 65535 {
			return p.errf("listen", listenNode, "%q%s: the port must be a number from 0 to 65535", cfg.Listen, from)
		}
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		return p.errf("listen", listenNode, "%q%s: the port is neither a number from 0 to 65535 nor a service name", cfg.Listen, from)
	}
	if !IsLoopback(host) && cfg.AdminToken == "" {
		return p.errf("admin_token", listenNode,
			"required because listen (%s%s) is not a loopback address: set admin_token (e.g. admin_token: ${TASKHOST_ADMIN_TOKEN}) or listen on 127.0.0.1%s",
			cfg.Listen, from, p.unsetNote(findKey(root, "admin_token"), "admin_token"))
	}
	if strings.ContainsFunc(cfg.AdminToken, unicode.IsSpace) {
		return p.errf("admin_token", findKey(root, "admin_token"), "holds white space; use at least 16 random letters and digits (it is sent as Authorization: Bearer <admin_token>)")
	}
	if cfg.AdminToken != "" && len(cfg.AdminToken) < 16 {
		return p.errf("admin_token", findKey(root, "admin_token"), "too short (%d characters); use at least 16 random characters", len(cfg.AdminToken))
	}
	if !cfg.PublicReads && cfg.AdminToken == "" {
		return p.errf("public_reads", findKey(root, "public_reads"),
			"false needs admin_token: without a token on a loopback address every local client is the admin, so there is nothing to guard reads with")
	}
	if cfg.PluginsDir == "" {
		return p.errf("plugins_dir", findKey(root, "plugins_dir"), "empty; name the directory holding the fp-plugin-<name> binaries")
	}
	switch strings.ToLower(cfg.LogLevel) {
	case "trace", "debug", "info", "warn", "error":
	default:
		return p.errf("log_level", findKey(root, "log_level"), "%q is not one of trace, debug, info, warn, error", cfg.LogLevel)
	}
	// A name equal to another plus "_..." makes their metric prefixes
	// ambiguous: fp_a_b_c could be plugin a's b_c or plugin a_b's c.
	names := make([]string, 0, len(cfg.Plugins))
	for _, pc := range cfg.Plugins {
		names = append(names, pc.Name)
	}
	if a, b, ok := prefixCollision(names); ok {
		return p.errf("plugins."+b, findKey(findKey(root, "plugins"), b),
			"collides with plugin %q: fp_%s_... metric names could come from either; rename one", a, b)
	}
	return nil
}

// prefixCollision finds two names where one is the other plus "_...".
func prefixCollision(names []string) (string, string, bool) {
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	for i, a := range sorted {
		for _, b := range sorted[i+1:] {
			if strings.HasPrefix(b, a+"_") {
				return a, b, true
			}
		}
	}
	return "", "", false
}

// findKey returns the value node of key in mapping n, or nil.
func findKey(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// IsLoopback reports whether a listen host only accepts local connections.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
