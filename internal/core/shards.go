package core

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
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
