package redsemhttp_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/redsemhttp"
	"github.com/redsem/redsem/unfair"
)

// redisAddr is the address of the test's throw-away Redis; in your code it
// is your Redis.
func redisAddr() string { return redistest.SharedAddr() }

// An outbound API limiter: the provider allows 5 calls in flight per API
// key, and every instance of the service builds the same semaphore, so the
// 5 hold across all of them.
func ExampleTransport() {
	// The provider (here a test server) counts the calls in flight.
	var inFlight, most atomic.Int64
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond) // the provider's work
		inFlight.Add(-1)
		_, _ = io.WriteString(w, "ok")
	}))
	defer provider.Close()

	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()
	sem, err := unfair.New(client, "example:provider-api", 5, unfair.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()
	api := &http.Client{Transport: &redsemhttp.Transport{
		Semaphore: func(*http.Request) (redsem.Semaphore, error) { return sem, nil },
	}}

	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := api.Get(provider.URL)
			if err != nil {
				log.Print(err)
				return
			}
			defer resp.Body.Close() // releases the slot
			if b, _ := io.ReadAll(resp.Body); string(b) == "ok" {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	fmt.Println("calls answered:", ok.Load())
	fmt.Println("at most 5 in flight:", most.Load() <= 5)
	// Output:
	// calls answered: 20
	// at most 5 in flight: true
}

// A per-tenant limit: each tenant may have one request running at a time,
// across every instance of the service; a request that waits longer than
// 100ms is answered 503 with Retry-After, and other tenants are not held up.
// A fair.Family makes each tenant's semaphore on first use, shares one
// subscription and heartbeat among them, and forgets tenants nobody uses.
func ExampleMiddleware() {
	client := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer client.Close()
	tenants, err := fair.NewFamily(client, "example:reports-per-tenant", 1, fair.FamilyOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer tenants.Close()
	perTenant := func(r *http.Request) (redsem.Semaphore, error) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "" {
			return nil, errors.New("no X-Tenant header") // answered 500 by ErrorHandler
		}
		return tenants.Get(tenant)
	}

	inside := make(chan struct{})
	finish := make(chan struct{})
	report := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			inside <- struct{}{}
			<-finish
		}
		_, _ = io.WriteString(w, "report for "+r.Header.Get("X-Tenant"))
	})
	mw := redsemhttp.Middleware(redsemhttp.Options{Semaphore: perTenant, MaxWait: 100 * time.Millisecond})
	srv := httptest.NewServer(mw(report))
	defer srv.Close()

	get := func(tenant, query string) string {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/report"+query, nil)
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Sprintf("%d, retry after %ss", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	slow := make(chan string)
	go func() { slow <- get("acme", "?slow=1") }()
	<-inside // acme's only slot is taken
	fmt.Println("acme again:", get("acme", ""))
	fmt.Println("globex:", get("globex", ""))
	close(finish)
	fmt.Println("acme's slow one:", <-slow)
	// Output:
	// acme again: 503, retry after 1s
	// globex: report for globex
	// acme's slow one: report for acme
}
