package redsemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/redsemsql"
	"github.com/redsem/redsem/unfair"
)

// The legacy database takes 20 connections in all: every instance of the
// service wraps its connector with the same semaphore, so their pools
// together never open more. This example needs PostgreSQL and Redis, so it
// is compiled but not run by go test (the package's tests run the same code
// against both).
func ExampleNewConnector() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	sem, err := unfair.New(client, "legacy-db", 20, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()

	cfg, err := pgx.ParseConfig("postgres://app@legacy-db:5432/orders")
	if err != nil {
		log.Fatal(err)
	}
	db := sql.OpenDB(redsemsql.NewConnector(stdlib.GetConnector(*cfg), sem))
	defer db.Close()
	// Open at most 5 here. Idle connections keep their slots for this
	// process's next queries, and give them back (closing) when a Connect
	// of any process waits for one.
	db.SetMaxOpenConns(5)
	db.SetMaxIdleConns(2)
	db.SetConnMaxIdleTime(time.Minute)

	// A query waits for a slot (within its context) when it needs a new
	// connection.
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	if err := db.QueryRowContext(qctx, "SELECT count(*) FROM orders").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
}
