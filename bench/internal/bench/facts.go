package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// machineFacts describes the machine the bench runs on.
func machineFacts() map[string]string {
	m := map[string]string{
		"cpu":    "unknown",
		"cores":  strconv.Itoa(runtime.NumCPU()),
		"memory": "unknown",
		"go":     runtime.Version(),
		"os":     runtime.GOOS + "/" + runtime.GOARCH,
	}
	if v := procField("/proc/cpuinfo", "model name"); v != "" {
		m["cpu"] = v
	}
	if v := procField("/proc/meminfo", "MemTotal"); v != "" {
		if kb, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err == nil {
			m["memory"] = fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	var osName string
	if v := procField("/etc/os-release", "PRETTY_NAME"); v != "" {
		osName = strings.Trim(v, `"`)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		osName = strings.TrimSpace(osName + " kernel " + strings.TrimSpace(string(b)))
	}
	if osName != "" {
		m["os"] += ", " + osName
	}
	return m
}

// procField returns the value of the first "key: value" or "key=value"
// line of path.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		rest := strings.TrimLeft(line[len(key):], " \t")
		if strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, "=") {
			return strings.TrimSpace(rest[1:])
		}
	}
	return ""
}

var pgSettings = []string{"synchronous_commit", "shared_buffers", "max_connections", "fsync", "wal_level", "work_mem", "autovacuum", "full_page_writes"}

func postgresFacts(ctx context.Context, c *pgx.Conn) (map[string]string, error) {
	m := map[string]string{}
	var v string
	if err := c.QueryRow(ctx, `SELECT version()`).Scan(&v); err != nil {
		return nil, err
	}
	m["version"] = v
	for _, name := range pgSettings {
		if err := c.QueryRow(ctx, `SHOW `+name).Scan(&v); err != nil {
			return nil, err
		}
		m[name] = v
	}
	return m, nil
}

func redactedDSN(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "an unparsable dsn"
	}
	return fmt.Sprintf("host %s port %d database %s user %s", cfg.Host, cfg.Port, cfg.Database, cfg.User)
}
