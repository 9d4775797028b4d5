package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/taskhost/taskhost/capability"
)

// PluginCheck is what checking one plugin's config block found.
type PluginCheck struct {
	Plugin string
	// Checked: the plugin checked its block, and Err says what it found
	// wrong (nil when nothing). Not checked: Note says why.
	Checked bool
	Err     error
	Note    string
}

// checkConfigTimeout bounds one plugin's offline config check.
const checkConfigTimeout = 10 * time.Second

// CheckPluginConfigs asks each enabled plugin's binary to check its config
// block without starting (capability.ConfigChecker), as `host
// check-config` does. A plugin whose binary is missing from the plugins
// directory (resolved as `host run` resolves it: a relative one against
// the working directory) fails the check, naming the directory looked in;
// one that cannot check its config offline is reported as not checked.
func CheckPluginConfigs(ctx context.Context, cfg *Config) []PluginCheck {
	var out []PluginCheck
	for _, pc := range cfg.Plugins {
		if !pc.Enabled {
			continue
		}
		out = append(out, checkPluginConfig(ctx, cfg, pc))
	}
	return out
}

func checkPluginConfig(ctx context.Context, cfg *Config, pc PluginConfig) PluginCheck {
	res := PluginCheck{Plugin: pc.Name}
	path := filepath.Join(cfg.PluginsDir, BinaryPrefix+pc.Name)
	if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode().Perm()&0o111 == 0 {
		// The host would not start it either: a failure, not a note, so
		// a config whose plugins_dir points at the wrong place fails the
		// check instead of saying ok.
		res.Checked = true
		res.Err = fmt.Errorf("plugins.%s: no executable %s in the plugins directory %s%s; build the plugins (make build), or set plugins_dir to where they are",
			pc.Name, BinaryPrefix+pc.Name, cfg.PluginsDirAbs(), relativeNote(cfg.PluginsDir))
		return res
	}
	// Never run a binary the host would refuse to start (one that others
	// could have changed, or that misses its pin): it would get the
	// plugin's environment and config. What runs is the file checked,
	// through its open descriptor, as when the host starts it.
	f, err := OpenPluginBinary(cfg.PluginsDir, pc.Name, pc.SHA256)
	var refused *permanentError
	switch {
	case errors.As(err, &refused):
		res.Checked = true
		res.Err = fmt.Errorf("%w; not run", refused.err)
		return res
	case err != nil:
		res.Note = fmt.Sprintf("not checked: %v", err)
		return res
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, checkConfigTimeout)
	defer cancel()
	cmd := pluginCommand(ctx, f, path)
	cmd.Env = pluginEnv(cfg, pc)
	cmd.Stdin = bytes.NewReader(pc.Config)
	cmd.Args = append(cmd.Args, capability.CheckConfigArg)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		res.Note = fmt.Sprintf("not checked: %s %s did not answer within %s", path, capability.CheckConfigArg, checkConfigTimeout)
		return res
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		res.Note = fmt.Sprintf("not checked: running %s %s: %v", path, capability.CheckConfigArg, err)
		return res
	}
	switch code {
	case capability.CheckConfigOK:
		res.Checked = true
	case capability.CheckConfigInvalid:
		res.Checked = true
		var ans struct {
			Key     string `json:"key"`
			Problem string `json:"problem"`
		}
		if json.Unmarshal(stdout.Bytes(), &ans) != nil || ans.Problem == "" {
			ans.Problem = strings.TrimSpace(stdout.String() + " " + stderr.String())
		}
		where := "plugins." + pc.Name + ".config"
		if ans.Key != "" {
			where += "." + ans.Key
		}
		res.Err = fmt.Errorf("%s: %s", where, ans.Problem)
	case capability.CheckConfigUnsupported:
		res.Note = "not checked: the plugin checks its config only when it starts"
	default:
		res.Note = fmt.Sprintf("not checked: %s %s exited with status %d (a plugin built before config checks, or not a taskhost plugin)", path, capability.CheckConfigArg, code)
	}
	return res
}

// relativeNote says how a relative plugins_dir was resolved, for a user
// who ran the host from another directory than the one it was meant for.
func relativeNote(dir string) string {
	if filepath.IsAbs(dir) {
		return ""
	}
	return fmt.Sprintf(" (plugins_dir %s is relative to the working directory, not to the config file)", dir)
}
