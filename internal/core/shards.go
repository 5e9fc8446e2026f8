package core

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/core/wire"
)

// A family's members are spread over shards: each shard is one hash tag
// (so one cluster slot) with its own sessions key and channels, and a
// member lives in the shard ShardOf(key, shards). Shard 0 of a one-shard
// family has the family's own tag, so a family of one shard keeps the key
// layout of families made before shards existed.
const (
	// MaxShards bounds FamilyOptions.Shards.
	MaxShards = 1024
	// DefaultShards is the shard count of a family whose options leave
	// Shards zero, on every client (a *redis.ClusterClient too): the
	// layout of families made before shards existed, whose processes
	// write no shard record and never read one. A default must never
	// change what a key means: a default of more than one shard would make
	// a process of this version and one of an older version two holders
	// of the same key. More shards only when the user sets Shards.
	DefaultShards = 1
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
	// shardSep stands between a family's escaped name and a shard's
	// number in the tags of a family of several shards (ShardTag). No
	// escaped name contains it.
	shardSep = "%s"
)

// ShardOf is the shard of member key in a family of shards shards: FNV-1a
// (32 bits) of the key's bytes, modulo shards. It is part of the key
// layout: every process (and version) must compute the same.
func ShardOf(key string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(shards))
}

// ShardTag returns the hash tag (the text between the braces) of shard
// shard of family in a family of shards shards. One shard: the family's
// escaped name, as before shards existed. More: the escaped name, "%s",
// the shard's number, "." and the smallest n >= 0 that puts the tag's slot
// in the shard's own 1/shards of the 16384 slots (so that shards cover a
// cluster's slot ranges evenly, whatever the family's name). No escaped
// name contains "%s" (shardSep: '%' is escaped as "%25"), so no shard tag
// equals another family's or semaphore's tag.
func ShardTag(family string, shard, shards int) string {
	esc := EscapeTag(family)
	if shards <= 1 {
		return esc
	}
	lo := shard * clusterSlots / shards
	hi := (shard + 1) * clusterSlots / shards
	base := esc + shardSep + strconv.Itoa(shard) + "."
	for n := 0; ; n++ {
		tag := base + strconv.Itoa(n)
		if s := int(CRC16(tag) % clusterSlots); s >= lo && s < hi {
			return tag
		}
	}
}

// ShardsKey is the key that records how many shards family has: written
// by the first process that uses the family (SET NX, no expiry), checked
// by every other. It carries the family's own tag.
func ShardsKey(prefix, family string) string {
	return prefix + ":{" + EscapeTag(family) + "}:f:shards"
}

// ReadShards returns the shard count recorded for family, and false when
// none is (a family that no process of a version with shards used: one
// shard).
func ReadShards(ctx context.Context, client redis.UniversalClient, prefix, family string) (int, bool, error) {
	v, err := client.Get(ctx, ShardsKey(prefix, family)).Result()
	if err == redis.Nil {
		return 1, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxShards {
		return 0, false, fmt.Errorf("redsem: family %q: shard record %q is not a shard count", family, v)
	}
	return n, true, nil
}

// CRC16 is the CRC-16/XMODEM checksum that Redis Cluster hashes keys with.
func CRC16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Slot is the cluster hash slot of key (its hash tag's, if it has one).
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(CRC16(key) % clusterSlots)
}

// ---- the family's shard record ----

// A family's processes must spread its members over the same shards; the
// first to use the family records its count in Redis (ShardsKey), the
// others compare theirs (family.go).

// compareShards is checkShards for calls that change a member's limit or
// rate (SetLimit, SetRate, and so the CLI's): it reads the record and
// refuses a count other than ours, but writes none (a tool must not fix
// the layout of a family that no client used yet).
func (f *Family) compareShards(ctx context.Context) error {
	if f.shardsOK.Load() {
		return nil
	}
	var n int
	var ok bool
	sent := time.Now()
	err := wire.BoundedErr(ctx, func() (err error) {
		n, ok, err = ReadShards(ctx, f.root.cfg.Client, f.root.cfg.Prefix, f.root.cfg.Name)
		return err
	})
	f.root.rep.answered(sent, err)
	if err != nil {
		return err
	}
	if ok && n != len(f.shards) {
		return f.shardsMismatch(strconv.Itoa(n))
	}
	return nil
}

// shardsMismatch is the error of a client whose shard count is not the
// one recorded in Redis.
func (f *Family) shardsMismatch(recorded string) error {
	built := strconv.Itoa(len(f.shards))
	if f.defaulted {
		built += " (Shards zero: the default, " + strconv.Itoa(DefaultShards) + " on every client)"
	}
	return cfgErr("FamilyOptions.Shards", "family %q spreads its members over %s shards (recorded in Redis by its first user, key %s); "+
		"this client was built with %s: give every client of the family the same Shards", f.root.cfg.Name, recorded,
		ShardsKey(f.root.cfg.Prefix, f.root.cfg.Name), built)
}

// checkShards makes sure that every process of the family spreads its
// members over the same shards (else one key would be two semaphores,
// each with the whole limit): the first to use the family records its
// shard count (SET NX, no expiry), the others compare theirs, once per
// Family. A mismatch is a *redsem.ConfigError; a failure to reach Redis
// is returned raw (the acquire rides it out) and the check runs again at
// the next call.
//
// Processes of a version before shards write no record and never read
// one; they use the one-shard layout, which is why the default is one
// shard (DefaultShards): a default client records "1" where they run, and
// a client built with more shards then gets the mismatch error instead of
// splitting the family. Only a client built with Shards > 1 that records
// first can split a family with such processes; that is documented (set
// Shards only once every process of the family has this version).
func (f *Family) checkShards(ctx context.Context) error {
	if f.shardsOK.Load() {
		return nil
	}
	key := ShardsKey(f.root.cfg.Prefix, f.root.cfg.Name)
	want := strconv.Itoa(len(f.shards))
	var got string
	sent := time.Now()
	err := wire.BoundedErr(ctx, func() error {
		pipe := f.root.cfg.Client.Pipeline()
		pipe.SetNX(ctx, key, want, 0)
		get := pipe.Get(ctx, key)
		_, err := pipe.Exec(ctx)
		got = get.Val()
		return err
	})
	f.root.rep.answered(sent, err)
	if err != nil {
		return err
	}
	if got != want {
		return f.shardsMismatch(got)
	}
	f.shardsOK.Store(true)
	return nil
}
