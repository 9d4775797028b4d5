package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/taskhost/taskhost/broker/postgres"
	"github.com/taskhost/taskhost/host"
	"github.com/taskhost/taskhost/plugins/tasksworker"
)

// migrateCmd runs the PostgreSQL broker's migrations. The DSN comes from
// -dsn, else the tasks_worker plugin's config, else TASKHOST_DATABASE_URL.
func migrateCmd(args []string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	path := configFlag(fs)
	dsn := fs.String("dsn", "", "PostgreSQL address (default: the tasks_worker config's dsn, then $"+tasksworker.DSNEnv+")")
	schema := fs.String("schema", "", "schema holding the tables (default: the config's schema, then public)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dsn == "" {
		if cfg, err := host.LoadConfig(*path); err == nil {
			if pc, ok := cfg.Plugin("tasks_worker"); ok {
				var tw struct {
					DSN    string `json:"dsn"`
					Schema string `json:"schema"`
				}
				_ = json.Unmarshal(pc.Config, &tw)
				*dsn = tw.DSN
				if *schema == "" {
					*schema = tw.Schema
				}
			}
		}
	}
	if *dsn == "" {
		*dsn = os.Getenv(tasksworker.DSNEnv)
	}
	if *dsn == "" {
		fmt.Fprintf(os.Stderr, "host migrate: no database: pass -dsn, set dsn in the tasks_worker config, or set %s\n", tasksworker.DSNEnv)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := postgres.Migrate(ctx, *dsn, *schema); err != nil {
		fmt.Fprintf(os.Stderr, "host migrate: %v\n", err)
		return 1
	}
	s := *schema
	if s == "" {
		s = "public"
	}
	fmt.Printf("migrated: schema %s is up to date\n", s)
	return 0
}
