package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// installFixture copies the fixture plugin into dir as fp-plugin-<name>.
func installFixture(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(binDir, "fixture"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fp-plugin-"+name)
	if err := os.WriteFile(path, b, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func trustConfig(dir string, names ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: LISTEN\nplugins_dir: %s\nrestart_budget: 5\nhealth_interval_seconds: 1\nplugins:\n", dir)
	for _, n := range names {
		fmt.Fprintf(&b, "  %s:\n    enabled: true\n", n)
	}
	return b.String()
}

// expectRefused waits until plugin name is failed with an error that
// contains every one of want, and checks that the error is in /admin/ and
// in the host's log.
func (h *hostProc) expectRefused(t *testing.T, name string, want ...string) {
	t.Helper()
	st := h.waitState(t, name, "failed", 30*time.Second)
	for _, w := range want {
		if !strings.Contains(st.LastError, w) {
			t.Errorf("%s: last error %q, want it to contain %q", name, st.LastError, w)
		}
	}
	_, page := get(t, h.base+"/admin/")
	if !strings.Contains(page, template_escape(st.LastError)) {
		t.Errorf("/admin/ does not show %s's error %q", name, st.LastError)
	}
	waitFor(t, 60*time.Second, name+"'s error is in the host log", func() bool {
		return strings.Contains(h.log.String(), want[0])
	})
}

// TestPluginBinariesAnotherUserControlsAreRefused: binaries that others
// can write to or own, and links that leave the plugins directory, are
// refused with how to fix it; the host serves the others.
func TestPluginBinariesAnotherUserControlsAreRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, to give a file to another user: run the tests as root (sudo make test), as CI does")
	}
	dir := t.TempDir()
	installFixture(t, dir, "echo", 0o755)
	groupw := installFixture(t, dir, "groupw", 0o775)
	worldw := installFixture(t, dir, "worldw", 0o757)
	alien := installFixture(t, dir, "alien", 0o755)
	if err := os.Chown(alien, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	outsideTarget := installFixture(t, elsewhere, "outside", 0o755)
	if err := os.Symlink(outsideTarget, filepath.Join(dir, "fp-plugin-outside")); err != nil {
		t.Fatal(err)
	}
	// A link to a file in the directory itself is fine (a version switch).
	installFixture(t, dir, "inside_v12", 0o755)
	if err := os.Symlink("fp-plugin-inside_v12", filepath.Join(dir, "fp-plugin-inside")); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, trustConfig(dir, "echo", "groupw", "worldw", "alien", "outside", "inside"))
	h.waitState(t, "echo", "running", 30*time.Second)
	h.waitState(t, "inside", "running", 30*time.Second)
	h.expectRefused(t, "groupw", "writable by its group or others", "chmod go-w "+groupw)
	h.expectRefused(t, "worldw", "writable by its group or others", "chmod go-w "+worldw)
	h.expectRefused(t, "alien", "owned by uid 65534", "chown root "+alien)
	h.expectRefused(t, "outside", "outside the plugins directory", outsideTarget)
	if code, _ := get(t, h.base+"/plugin-pkg/echo/echo"); code != 200 {
		t.Errorf("echo beside the refused plugins: %d", code)
	}
}

// TestPluginsDirOthersCanWriteToIsRefused: a plugins directory that is
// writable by others, or sits in a directory that is (but for a root-owned
// sticky one like /tmp), refuses every plugin in it, with how to fix it.
func TestPluginsDirOthersCanWriteToIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, to give a directory to another user: run the tests as root (sudo make test), as CI does")
	}
	t.Run("world-writable directory", func(t *testing.T) {
		dir := t.TempDir()
		installFixture(t, dir, "echo", 0o755)
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		h := startHost(t, trustConfig(dir, "echo"))
		h.expectRefused(t, "echo", "chmod go-w "+dir)
	})
	t.Run("directory owned by another user", func(t *testing.T) {
		dir := t.TempDir()
		installFixture(t, dir, "echo", 0o755)
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		h := startHost(t, trustConfig(dir, "echo"))
		h.expectRefused(t, "echo", "owned by uid 65534", "chown root "+dir)
	})
	t.Run("in a world-writable directory", func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "plugins")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		installFixture(t, dir, "echo", 0o755)
		if err := os.Chmod(parent, 0o777); err != nil {
			t.Fatal(err)
		}
		h := startHost(t, trustConfig(dir, "echo"))
		h.expectRefused(t, "echo", "chmod go-w "+parent)
	})
	t.Run("in a directory owned by another user", func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "plugins")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		installFixture(t, dir, "echo", 0o755)
		if err := os.Chown(parent, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		h := startHost(t, trustConfig(dir, "echo"))
		h.expectRefused(t, "echo", "inside "+parent+", which is owned by uid 65534", "move plugins_dir")
	})
	t.Run("in a root-owned sticky directory, like /tmp", func(t *testing.T) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "plugins")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		installFixture(t, dir, "echo", 0o755)
		if err := os.Chmod(parent, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
		h := startHost(t, trustConfig(dir, "echo"))
		h.waitState(t, "echo", "running", 30*time.Second)
	})
}

// TestPluginTrustIsCheckedAtEveryRestart: the binary of a running plugin
// is given to another user, who could now replace it; the plugin is
// killed, and the automatic restart refuses the binary.
func TestPluginTrustIsCheckedAtEveryRestart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root, to give a file to another user: run the tests as root (sudo make test), as CI does")
	}
	dir := t.TempDir()
	bin := installFixture(t, dir, "echo", 0o755)
	h := startHost(t, trustConfig(dir, "echo"))
	before := h.waitState(t, "echo", "running", 30*time.Second)
	if err := os.Chown(bin, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.expectRefused(t, "echo", "owned by uid 65534", "chown root "+bin)
}
