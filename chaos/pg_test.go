package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/taskhost/taskhost/internal/hostproc"
)

// pgCluster is a PostgreSQL cluster of the suite's, initdb'd into a
// temporary directory and run as the postgres user in the database
// namespace, listening on the namespace's address only.
type pgCluster struct {
	bin, data, sock, logPath string
	l                        link
	cmd                      *exec.Cmd
	exited                   chan struct{}
}

func startPG(t *testing.T, dir string, l link) *pgCluster {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		t.Fatal(err)
	}
	p := &pgCluster{bin: bin, data: filepath.Join(dir, "pgdata"), sock: filepath.Join(dir, "pgsock"), logPath: filepath.Join(dir, "postgres.log"), l: l}
	for _, d := range []string{p.data, p.sock} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, pgUID(t), pgGID(t)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups",
		filepath.Join(bin, "initdb"), "-D", p.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// Trust the suite's own subnet (and the socket), nothing else.
	hba := fmt.Sprintf("local all all trust\nhost all all %s.0/24 trust\n", subnet)
	if err := os.WriteFile(filepath.Join(p.data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stop() })
	p.start(t)
	return p
}

func pgUID(t *testing.T) int { return lookupID(t, "-u") }
func pgGID(t *testing.T) int { return lookupID(t, "-g") }

func lookupID(t *testing.T, flag string) int {
	out, err := exec.Command("id", flag, "postgres").Output()
	if err != nil {
		t.Fatalf("no postgres user (the PostgreSQL package creates it): %v", err)
	}
	n, err := strconv.Atoi(string(out[:len(out)-1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// start runs the postmaster in the database namespace and waits until it
// answers.
func (p *pgCluster) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command("ip", "netns", "exec", p.l.ns,
		"setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups",
		filepath.Join(p.bin, "postgres"), "-D", p.data,
		"-c", "listen_addresses="+p.l.nsIP, "-c", fmt.Sprintf("port=%d", pgPort),
		"-c", "unix_socket_directories="+p.sock, "-c", "max_connections=300",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=64MB", "-c", "log_min_messages=warning")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	p.exited = make(chan struct{})
	go func(c *exec.Cmd, ch chan struct{}) { _ = c.Wait(); close(ch) }(p.cmd, p.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := p.connect("postgres")
		if err == nil {
			c.Close(context.Background())
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL does not answer on %s:%d after 30s: %v\n%s", p.l.nsIP, pgPort, err, tail(p.logPath, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop shuts the cluster down fast (SIGINT: connections are cut, nothing
// is lost) and waits for it; at most 30 s, then SIGKILL.
func (p *pgCluster) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	hostproc.Terminate(p.cmd, p.exited, syscall.SIGINT, 30*time.Second)
}

// dsn is the address of database db, directly (from the root namespace).
func (p *pgCluster) dsn(db string) string {
	return fmt.Sprintf("postgres://postgres@%s:%d/%s?sslmode=disable&connect_timeout=5", p.l.nsIP, pgPort, db)
}

func (p *pgCluster) connect(db string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pgx.Connect(ctx, p.dsn(db))
}
