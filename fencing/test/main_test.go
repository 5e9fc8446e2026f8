package fencing_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", tests only
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// These are the fencing package's tests, in a module of their own so that
// the PostgreSQL driver the SQL guard's tests need (pgx) stays out of the
// root module's requirements and so out of its users' module graphs; the
// examples stay in fencing/.
func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }

// defaultPGURL is the PostgreSQL that this machine kind and CI run.
const defaultPGURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// pgDB returns a connection pool to PostgreSQL (env PGURL, else
// defaultPGURL), closed when the test ends. When none answers it skips the
// test with a loud message, except in CI (env CI=true), where it fails.
func pgDB(t *testing.T) *sql.DB {
	t.Helper()
	url := envPGURL()
	if url == "" {
		url = defaultPGURL
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatalf("fencing: PGURL %q: %v", url, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		msg := fmt.Sprintf("!!! PostgreSQL unreachable at %s: %v: SQL guard NOT TESTED "+
			"(start one on 127.0.0.1:5432 with user postgres and db test, e.g. bash .ci/postgres.sh, or set PGURL)", url, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return db
}

func envPGURL() string { return os.Getenv("PGURL") }
