package fencing_test

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// The package's tests are in fencing/test, a module of their own (the SQL
// guard's need a PostgreSQL driver, which this module must not require);
// here are the examples.
func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }

// redisClient returns a client of the package's shared Redis for examples,
// which have no *testing.T.
func redisClient() *redis.Client {
	s, err := redistest.SharedServer()
	if err != nil {
		panic(redistest.HowToGetRedis + ": " + err.Error())
	}
	return redis.NewClient(s.Options())
}
