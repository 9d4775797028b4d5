package capability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// Handshake is shared by the host and every plugin. The cookie is a guard
// against running a plugin binary by hand, not a security measure. It must
// never change: changing it breaks every installed plugin.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "FP_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "7d0c2f5e-taskhost-plugin-3b9a41c6e8f24d17",
}

// pluginKey is the one go-plugin key of the taskhost plugin set. The
// services behind it are registered per capability.
const pluginKey = "taskhost"

// maxMessageBytes bounds one gRPC message in either direction. The host's
// HTTP proxy limits request bodies well below it.
const maxMessageBytes = 64 << 20

// PluginSet is the go-plugin plugin set for impl. The host passes nil.
func PluginSet(impl Lifecycle) plugin.PluginSet {
	return plugin.PluginSet{pluginKey: &grpcPlugin{impl: impl}}
}

// VersionedPlugins is the versioned plugin set for impl (nil on the host).
func VersionedPlugins(impl Lifecycle) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{ProtocolVersion: PluginSet(impl)}
}

// GRPCServerOptions are the options every gRPC server of the contract uses.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes)}
}

// NewLogger returns the logger a plugin should use: JSON lines on the
// process's real stderr, which the host parses and re-logs at their level.
// Create it before Serve: Serve replaces os.Stderr with a pipe.
func NewLogger(name string) hclog.Logger {
	level := hclog.LevelFromString(os.Getenv("TASKHOST_LOG_LEVEL"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		JSONFormat: true,
		Output:     os.Stderr,
		Level:      level,
	})
}

// ServeOption changes how Serve runs.
type ServeOption func(*serveOptions)

type serveOptions struct {
	logger      hclog.Logger
	stopTimeout time.Duration
}

// WithLogger sets the logger go-plugin uses; default NewLogger("plugin").
func WithLogger(l hclog.Logger) ServeOption { return func(o *serveOptions) { o.logger = l } }

// WithOrphanStopTimeout bounds Stop when the host has died; default 30s.
func WithOrphanStopTimeout(d time.Duration) ServeOption {
	return func(o *serveOptions) { o.stopTimeout = d }
}

// Serve runs impl as a plugin and never returns. It registers only the
// services impl implements. If the host process dies (the plugin's parent
// changes), Serve calls impl.Stop and exits, so a SIGKILLed host leaves no
// plugin running.
func Serve(impl Lifecycle, opts ...ServeOption) {
	if len(os.Args) == 2 && os.Args[1] == CheckConfigArg {
		os.Exit(checkConfig(impl, os.Stdin, os.Stdout))
	}
	o := serveOptions{stopTimeout: 30 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	if o.logger == nil {
		o.logger = NewLogger("plugin")
	}
	log.SetOutput(o.logger.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true}))
	log.SetFlags(0)

	go watchParent(o.logger, impl, o.stopTimeout)

	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: VersionedPlugins(impl),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, GRPCServerOptions()...)...)
		},
		Logger: o.logger,
	})
	os.Exit(0)
}

// watchParent exits the process when its parent (the host) goes away.
// Pdeathsig is avoided on purpose: it fires when the creating thread exits,
// not the process.
func watchParent(logger hclog.Logger, impl Lifecycle, stopTimeout time.Duration) {
	parent := os.Getppid()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for range t.C {
		if os.Getppid() == parent {
			continue
		}
		logger.Warn("host process is gone, stopping", "old_parent", parent)
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		if err := impl.Stop(ctx); err != nil {
			logger.Error("stop after host death", "error", err)
		}
		cancel()
		os.Exit(0)
	}
}

// checkConfig answers `<binary> check-config`: it reads the config block
// from in, checks it with the plugin's ConfigChecker and returns the exit
// status, writing the error to out as JSON when the block is invalid.
func checkConfig(impl Lifecycle, in io.Reader, out io.Writer) int {
	cc, ok := impl.(ConfigChecker)
	if !ok {
		return CheckConfigUnsupported
	}
	raw, err := io.ReadAll(io.LimitReader(in, 64<<20))
	if err != nil {
		raw = nil
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	err = cc.CheckConfig(raw)
	if err == nil {
		return CheckConfigOK
	}
	res := struct {
		Key     string `json:"key"`
		Problem string `json:"problem"`
	}{Problem: err.Error()}
	var ice *InvalidConfigError
	if errors.As(err, &ice) {
		res.Key, res.Problem = ice.Key, ice.Problem
	}
	_ = json.NewEncoder(out).Encode(res)
	return CheckConfigInvalid
}
