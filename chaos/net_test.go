package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The network: every name the suite creates starts with prefix, and every
// address is in subnet, which is used only between the namespaces and
// veth pairs of the suite on this machine. Each namespace has one veth
// pair to the root namespace (a /30 of subnet); nothing is routed or
// forwarded: the database namespace talks to the proxy (in the test
// process, root namespace) and each host namespace to its own proxy
// listener and the test's HTTP calls, all over directly connected links.
const (
	prefix = "chx-"
	subnet = "10.200.73" // .0/24
	pgPort = 5432
	pxPort = 6432 // the proxy's listeners, one per host namespace
	hPort  = 8080 // each host's HTTP address in its namespace
)

// link is one namespace and its veth pair to the root namespace.
type link struct {
	ns     string // namespace name
	root   string // veth end in the root namespace
	inner  string // veth end in the namespace
	rootIP string // address of the root end
	nsIP   string // address of the namespace end
}

// newLink describes namespace name at /30 number n of the subnet.
func newLink(name string, n int) link {
	return link{
		ns: prefix + name, root: prefix + name + "-r", inner: prefix + name + "-n",
		rootIP: fmt.Sprintf("%s.%d", subnet, 4*n+1), nsIP: fmt.Sprintf("%s.%d", subnet, 4*n+2),
	}
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// create makes the namespace and its veth pair, up, with their addresses.
func (l link) create(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { l.destroy() })
	steps := [][]string{
		{"ip", "netns", "add", l.ns},
		{"ip", "link", "add", l.root, "type", "veth", "peer", "name", l.inner},
		{"ip", "link", "set", l.inner, "netns", l.ns},
		{"ip", "addr", "add", l.rootIP + "/30", "dev", l.root},
		{"ip", "link", "set", l.root, "up"},
		{"ip", "-n", l.ns, "addr", "add", l.nsIP + "/30", "dev", l.inner},
		{"ip", "-n", l.ns, "link", "set", l.inner, "up"},
		{"ip", "-n", l.ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			t.Fatalf("building the network: %v", err)
		}
	}
}

// cut takes the link down (a partition: packets are dropped both ways,
// connections stay open and resume when it is healed).
func (l link) cut(t *testing.T) {
	t.Helper()
	if err := run("ip", "link", "set", l.root, "down"); err != nil {
		t.Fatal(err)
	}
}

func (l link) heal(t *testing.T) {
	t.Helper()
	if err := run("ip", "link", "set", l.root, "up"); err != nil {
		t.Fatal(err)
	}
}

// destroy kills what runs in the namespace and removes it and its veth.
func (l link) destroy() {
	killNetns(l.ns)
	_ = run("ip", "link", "del", l.root)
	_ = run("ip", "netns", "del", l.ns)
}

// killNetns SIGKILLs every process in namespace ns.
func killNetns(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for range 50 {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		if strings.TrimSpace(string(out)) == "" {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tmpPrefix names the suite's temporary directories.
const tmpPrefix = "taskhost-chaos-"

// cleanupLeftovers removes what an earlier run left behind: namespaces
// (and the processes in them), veths and temporary directories whose names
// start with the suite's prefixes.
func cleanupLeftovers(logf func(string, ...any)) (n int) {
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && strings.HasPrefix(f[0], prefix) {
				logf("chaos: removing leftover namespace %s", f[0])
				n++
				killNetns(f[0])
				_ = run("ip", "netns", "del", f[0])
			}
		}
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if strings.HasPrefix(name, prefix) {
				logf("chaos: removing leftover link %s", name)
				n++
				_ = run("ip", "link", "del", name)
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tmpPrefix+"*"))
	for _, d := range dirs {
		if keep {
			continue
		}
		logf("chaos: removing leftover directory %s", d)
		n++
		_ = os.RemoveAll(d)
	}
	return n
}

// checkSubnetFree fails when the subnet is already in use on this machine
// outside the suite (an address or a route in it).
func checkSubnetFree(t *testing.T) {
	t.Helper()
	for _, args := range [][]string{{"ip", "-o", "addr", "show"}, {"ip", "route", "show"}} {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if strings.Contains(string(out), subnet+".") {
			t.Fatalf("%s.0/24 is in use on this machine (%s):\n%s\nthe suite uses it for its own namespaces only; free it first", subnet, strings.Join(args, " "), out)
		}
	}
}
