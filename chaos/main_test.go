package chaos

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// Gate is the variable that asks for the suite; `make chaos` sets it.
const Gate = "TASKHOST_CHAOS"

const howToRun = "run it with `sudo make chaos` (as root, with iproute2's `ip`, the PostgreSQL server binaries under /usr/lib/postgresql/*/bin, and `make build` done)"

var (
	repoRoot   string
	hostBin    string
	pluginsDir string
	// keep (CHAOS_KEEP=1) keeps the temporary directory, with the logs.
	keep = os.Getenv("CHAOS_KEEP") == "1"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(Gate) != "1" {
		if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
			if re, err := regexp.Compile(f.Value.String()); err == nil && re.MatchString("TestChaos") {
				// Asked by name without the gate: say how, and fail.
				fmt.Fprintf(os.Stderr, "FAIL: the chaos suite was asked for (-run %s) without %s=1; %s\n", f.Value.String(), Gate, howToRun)
				os.Exit(2)
			}
		}
		// Not asked: `go test ./...` compiles the package and runs nothing.
		fmt.Printf("chaos suite not run: it needs %s=1; %s\n", Gate, howToRun)
		os.Exit(0)
	}
	if err := prerequisites(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the chaos suite cannot run: %v\n%s\n", err, howToRun)
		os.Exit(2)
	}
	// Leftovers of an earlier run that was killed before its cleanups.
	cleanupLeftovers(func(format string, args ...any) { fmt.Printf(format+"\n", args...) })
	code := m.Run()
	// The tests' cleanups remove everything they made: what is left now
	// is a failure of theirs.
	if n := cleanupLeftovers(func(format string, args ...any) { fmt.Printf(format+"\n", args...) }); n > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the run left %d namespaces, links or directories behind (removed now)\n", n)
		code = 1
	}
	os.Exit(code)
}

// prerequisites says what is missing for the suite to run, if anything.
func prerequisites() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("it must run as root (it creates network namespaces and veth pairs); running as uid %d", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("`ip` (iproute2) not found: apt-get install -y iproute2")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		return fmt.Errorf("`setpriv` not found: apt-get install -y util-linux")
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		return fmt.Errorf("`ip netns list` failed: %v: %s", err, out)
	}
	if _, err := pgBinDir(); err != nil {
		return err
	}
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	repoRoot = filepath.Dir(wd)
	hostBin = filepath.Join(repoRoot, "bin", "host")
	pluginsDir = filepath.Join(repoRoot, "bin", "plugins")
	for _, p := range []string{hostBin, filepath.Join(pluginsDir, "fp-plugin-tasks_worker")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is missing: run `make build` first", p)
		}
	}
	return nil
}

// pgBinDir is the newest /usr/lib/postgresql/*/bin with initdb and postgres.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			if _, err := os.Stat(filepath.Join(dirs[i], "postgres")); err == nil {
				return dirs[i], nil
			}
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: apt-get install -y postgresql")
}
