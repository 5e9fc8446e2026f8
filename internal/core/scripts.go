package core

import (
	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/lua"
)

// scripts holds the one *redis.Script of each lua.Script: built once, never
// reassigned, and reachable only inside the module.
var scripts = func() map[lua.Script]*redis.Script {
	m := make(map[lua.Script]*redis.Script)
	for _, s := range lua.Scripts() {
		m[s] = redis.NewScript(s.Source())
	}
	return m
}()

// Script returns the runnable script for s (EVALSHA with a fallback to EVAL
// when the server's script cache was emptied). The engine calls the
// semaphore scripts only through runOn; package fencing and the tests use
// this for the rest.
func Script(s lua.Script) *redis.Script { return scripts[s] }
