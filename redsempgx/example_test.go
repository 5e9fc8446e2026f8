package redsempgx_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/redsempgx"
)

// The orders database takes 20 connections in all: every instance of the
// service makes its pgxpool with the same semaphore, so their pools
// together never open more, and a busy instance gives slots back to one
// that waits. This example needs PostgreSQL and Redis, so it is compiled
// but not run by go test (the package's tests run the same code against
// both).
func ExampleNewPool() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	sem, err := fair.New(client, "orders-db", 20, fair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()

	cfg, err := pgxpool.ParseConfig("postgres://app@orders-db:5432/orders?sslmode=require")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 5 // about the limit divided by the instances busy at once
	pool, err := redsempgx.NewPool(ctx, cfg, sem, redsempgx.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
}
