package core

import (
	"strings"
	"testing"
)

// The checksum is CRC-16/XMODEM, the one Redis Cluster uses (its check
// value, and slots that CLUSTER KEYSLOT gives; TestClusterShards compares
// Slot with a real cluster for every shard tag it uses).
func TestCRC16(t *testing.T) {
	if got := CRC16("123456789"); got != 0x31C3 {
		t.Fatalf("CRC16 check value %#x, want 0x31c3", got)
	}
	for key, slot := range map[string]int{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443, "foo{}{bar}": 8363} {
		if got := Slot(key); got != slot {
			t.Errorf("Slot(%q) = %d, want %d", key, got, slot)
		}
	}
}

// The shard of a key is part of the key layout: pinned, so that a change
// of the hash (which would split every family between versions) fails here.
// The values are FNV-1a 32 computed apart (Python, from the algorithm).
func TestShardOfStable(t *testing.T) {
	for _, c := range []struct {
		key    string
		shards int
		want   int
	}{{"tenant-1", 16, 11}, {"tenant-2", 16, 14}, {"", 16, 5}, {"a", 1, 0}, {"a", 3, 1}, {"ключ", 1024, 481}} {
		if got := ShardOf(c.key, c.shards); got != c.want {
			t.Errorf("ShardOf(%q, %d) = %d, want %d", c.key, c.shards, got, c.want)
		}
	}
}

// Every shard tag hashes into its own 1/shards of the slots (so shards
// cover a cluster's masters evenly), tags are distinct and never another
// name's tag, and one shard keeps the layout of families before shards.
func TestShardTags(t *testing.T) {
	for _, fam := range []string{"fam", "a{b}%c", "%s1.0"} {
		if got := ShardTag(fam, 0, 1); got != EscapeTag(fam) {
			t.Errorf("one shard: tag %q, want the family's %q", got, EscapeTag(fam))
		}
		for _, shards := range []int{2, 3, 16, 100, MaxShards} {
			seen := map[string]bool{}
			for i := 0; i < shards; i++ {
				tag := ShardTag(fam, i, shards)
				s := Slot("{" + tag + "}")
				if lo, hi := i*clusterSlots/shards, (i+1)*clusterSlots/shards; s < lo || s >= hi {
					t.Fatalf("%q shard %d of %d: tag %q in slot %d, not in [%d, %d)", fam, i, shards, tag, s, lo, hi)
				}
				if seen[tag] || !strings.HasPrefix(tag, EscapeTag(fam)+"%s") {
					t.Fatalf("%q shard %d of %d: tag %q repeated or not under the family's name", fam, i, shards, tag)
				}
				seen[tag] = true
			}
		}
	}
	// No escaped name contains "%s": a shard tag is nobody else's tag.
	if strings.Contains(EscapeTag("%s%S%%s{}"), "%s") {
		t.Fatal("an escaped name contains the shard separator")
	}
}

func TestMemberKeysShards(t *testing.T) {
	one := KeysForMember("p", "fam", "k")
	if one.List[KeyHolders] != "p:{fam}:m:k:holders" || one.List[KeySessions] != "p:{fam}:f:sessions" || one.Chan != "p:{fam}:f:ch" {
		t.Fatalf("one shard: %v %q", one.List, one.Chan)
	}
	k := MemberKeys("p", "fam", 16, "k")
	tag := "p:{" + ShardTag("fam", ShardOf("k", 16), 16) + "}:"
	if k.List[KeyHolders] != tag+"m:k:holders" || k.List[KeySessions] != tag+"f:sessions" || k.Chan != tag+"f:ch" || k.Free != tag+"f:ch:free" {
		t.Fatalf("16 shards: %v %q %q", k.List, k.Chan, k.Free)
	}
	for _, key := range append(append([]string(nil), k.List...), k.Chan, k.Free, k.Want) {
		if Slot(key) != Slot(k.List[0]) {
			t.Errorf("%q not in the member's slot", key)
		}
	}
}
