package host

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/taskhost/taskhost/capability"
)

// BinaryPrefix starts the file name of every plugin binary.
const BinaryPrefix = "fp-plugin-"

// Discovered is the result of scanning the plugins directory.
type Discovered struct {
	// Binaries maps a plugin name to its binary's path.
	Binaries map[string]string
	// Warnings are files that were passed over, and why.
	Warnings []string
}

// Discover scans dir (a relative one from the working directory, see
// Config.PluginsDir), non-recursively, for executable regular files named
// fp-plugin-<name>, or symbolic links to such files in dir. A missing
// directory is not an error: the host runs with no plugins and says so.
// Neither is a directory or binary others could change (see trust.go):
// it is passed over with a warning saying how to fix it, and its plugins
// fail to start with the same message.
func Discover(dir string) (Discovered, error) {
	d := Discovered{Binaries: map[string]string{}}
	realDir, err := checkPluginsDir(dir)
	if os.IsNotExist(err) {
		d.Warnings = append(d.Warnings, fmt.Sprintf("plugins directory %s does not exist%s; build the plugins with `make build`, or set plugins_dir", absDir(dir), relativeNote(dir)))
		return d, nil
	}
	if err != nil {
		d.Warnings = append(d.Warnings, err.Error()+"; no plugin in it is started")
		return d, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return d, fmt.Errorf("scan plugins directory: %w", err)
	}
	for _, e := range entries {
		fname := e.Name()
		if !strings.HasPrefix(fname, BinaryPrefix) {
			continue
		}
		path := filepath.Join(dir, fname)
		name := strings.TrimPrefix(fname, BinaryPrefix)
		if !capability.ValidName(name) {
			d.Warnings = append(d.Warnings, fmt.Sprintf("%s: %q is not a valid plugin name (lower-case letters, digits and _, starting with a letter)", path, name))
			continue
		}
		file, err := resolveBinary(path, realDir)
		if err != nil {
			d.Warnings = append(d.Warnings, err.Error())
			continue
		}
		info, err := os.Lstat(file)
		if err == nil {
			err = checkBinary(path, info)
		}
		if err != nil {
			d.Warnings = append(d.Warnings, err.Error())
			continue
		}
		d.Binaries[name] = path
	}
	return d, nil
}

// Names returns the discovered plugin names, sorted.
func (d Discovered) Names() []string {
	out := make([]string, 0, len(d.Binaries))
	for n := range d.Binaries {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// absDir is dir made absolute against the working directory, or dir
// itself when that fails.
func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}
