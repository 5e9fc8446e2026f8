package core

import "strings"

// Keys are the Redis keys and channels of one semaphore. Every key and
// channel carries the same hash tag, {name} with braces escaped, so that a
// cluster keeps them in one slot and one script may touch them all.
type Keys struct {
	List []string // in the order the Lua library expects (KEYS[1..9])
	Chan string   // channel base; grants go to Chan+":s:"+session
	Free string   // channel of freed-slot notices for unfair waiters
	Want string   // channel of demand notices (redsemsql: a Connect waits)
	// Fam: a member of a family with a total (FamilyOptions.Total): the
	// family's four keys (FamilyKeys), which its scripts get after List
	// (KEYS[10..13]); nil otherwise. The family-level calls (SetTotal,
	// Status) have only these.
	Fam []string
	// script: the keys the scripts get, List followed by Fam (List itself
	// when Fam is nil; for the family-level calls, Fam and the members'
	// sessions key).
	script []string
}

// Script returns the keys that the scripts get: List, then Fam.
func (k Keys) Script() []string {
	if k.script == nil {
		return k.List
	}
	return k.script
}

// Family keys, in the order of FamilyKeys (lua/lib_family.lua's KEYS).
const (
	FamTot    = iota // HASH the total's counters, and the weight of each lease of more than one slot
	FamLeases        // ZSET lease id (of any member) -> deadline (server ms)
	FamHeads         // ZSET member key base -> arrival number of its queue's head (fair)
	FamTotal         // STRING the total set by SetTotal; never expires
)

// FamilyKeys returns the keys of the total of the family called family
// (of one shard: a family with a total has one) under prefix:
// prefix:{tag}:f:tot, :f:leases, :f:heads and :f:total, with the family's
// own tag, so in the slot of every member.
func FamilyKeys(prefix, family string) []string {
	base := prefix + ":{" + EscapeTag(family) + "}:f:"
	return []string{base + "tot", base + "leases", base + "heads", base + "total"}
}

// withFamily returns k with the family keys fam (a member of a family with
// a total).
func (k Keys) withFamily(fam []string) Keys {
	k.Fam = fam
	k.script = append(append(make([]string, 0, len(k.List)+len(fam)), k.List...), fam...)
	return k
}

// memberBase is the prefix of a family member's own keys
// ("prefix:{tag}:m:KEY:"), as heartbeat.lua and the family's f:heads name
// a member.
func (k Keys) memberBase() string {
	return strings.TrimSuffix(k.List[KeyHolders], keySuffixes[KeyHolders])
}

// withTotalCheck returns k with the f:tot and f:total keys of fam (a
// member of a family of one shard built without a total): acquire.lua
// refuses such a client while the family counts a total (its leases would
// not be counted in it). The member still counts nothing (Fam stays nil).
func (k Keys) withTotalCheck(fam []string) Keys {
	k.script = append(append(make([]string, 0, len(k.List)+2), k.List...), fam[FamTot], fam[FamTotal])
	return k
}

// Key suffixes, in the order of the Lua library's KEYS.
var keySuffixes = [...]string{"holders", "queue", "sessions", "free", "ended", "meta", "limit", "window", "rate"}

// Index of each key in Keys.List (see lua/lib_*.lua for what each holds).
const (
	KeyHolders  = iota // ZSET lease id -> deadline (server ms)
	KeyQueue           // ZSET waiter id -> arrival number
	KeySessions        // ZSET session id -> deadline (server ms)
	KeyFree            // ZSET free slots below the high-water mark
	KeyEnded           // ZSET tombstoned id -> until (server ms)
	KeyMeta            // HASH counters ("_" fields) and one record per id
	KeyOverride        // STRING limit set by SetLimit; never expires
	KeyWindow          // ZSET grant records "token:n" -> token (server µs), under a rate
	KeyRate            // STRING rate set by SetRate, "limit/per_ms"; never expires
)

// Sentinel is the member that each of the sorted sets keeps (scored +inf)
// so that it never becomes empty; it is no holder, waiter or slot.
const Sentinel = "~"

// KeysFor returns the keys of the semaphore name under prefix.
func KeysFor(prefix, name string) Keys {
	base := prefix + ":{" + EscapeTag(name) + "}:"
	k := Keys{List: make([]string, len(keySuffixes)), Chan: base + "ch"}
	for i, s := range keySuffixes {
		k.List[i] = base + s
	}
	k.Free = k.Chan + ":free"
	k.Want = base + "want"
	return k
}

// KeysForMember returns the keys of the member key of the family called
// family (of one shard) under prefix; MemberKeys is the general form.
func KeysForMember(prefix, family, key string) Keys { return MemberKeys(prefix, family, 1, key) }

// MemberKeys returns the keys of the member key of the family called
// family, of shards shards, under prefix. With tag the member's shard's
// tag (ShardTag of ShardOf(key)), the member's own keys are
// prefix:{tag}:m:<key>:<suffix> (key with '%', '{' and '}'
// percent-encoded); its sessions key and channel base are its shard's,
// prefix:{tag}:f:sessions and prefix:{tag}:f:ch, shared by every member of
// the shard, so that one heartbeat keeps a process's session alive for all
// of them and one subscription receives all of their grants. Every key of
// a shard carries the shard's tag, so a shard lives in one cluster slot
// (a family of one shard: the family's own tag, so the whole family); none
// can equal a key of a plain semaphore, whose suffix follows the tag
// directly.
func MemberKeys(prefix, family string, shards int, key string) Keys {
	return memberKeys(prefix, ShardTag(family, ShardOf(key, shards), shards), key)
}

func memberKeys(prefix, tag, key string) Keys {
	t := prefix + ":{" + tag + "}:"
	base := memberPrefix(prefix, tag) + EscapeTag(key) + ":"
	k := Keys{List: make([]string, len(keySuffixes)), Chan: t + "f:ch"}
	for i, s := range keySuffixes {
		k.List[i] = base + s
	}
	k.List[KeySessions] = t + "f:sessions"
	k.Free = k.Chan + ":free"
	k.Want = base + "want"
	return k
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// EscapeTag makes name safe inside a {hash-tag}: braces (and the escape
// character) are percent-encoded, so every name maps to a distinct,
// non-empty tag and all of a semaphore's keys hash to one slot.
func EscapeTag(name string) string { return tagEscaper.Replace(name) }

// tagUnescaper undoes EscapeTag.
var tagUnescaper = strings.NewReplacer("%7B", "{", "%7D", "}", "%25", "%")

// memberPrefix is what the keys of every member of the family shard tagged
// tag start with, before the member's escaped key: prefix:{tag}:m:.
func memberPrefix(prefix, tag string) string { return prefix + ":{" + tag + "}:m:" }

// memberMetaPattern is the SCAN pattern of the meta keys of the members of
// the family shard tagged tag.
func memberMetaPattern(prefix, tag string) string {
	return globEscaper.Replace(memberPrefix(prefix, tag)) + "*:meta"
}

// familyMetaPattern is the SCAN pattern of the meta keys of the members of
// family name in all of its shards shards: one shard's memberMetaPattern,
// or, for several, every tag that starts with the escaped name and
// shardSep. Its '*' can match more than a shard's number: a key found
// counts only under one of the shards' memberPrefix.
func familyMetaPattern(prefix, name string, shards int) string {
	if shards <= 1 {
		return memberMetaPattern(prefix, ShardTag(name, 0, 1))
	}
	return globEscaper.Replace(prefix+":{"+EscapeTag(name)+shardSep) + "*}:m:*:meta"
}

// memberAt is where the escaped member key starts in k, a key of a family
// member (after memberPrefix), or -1.
func memberAt(prefix, k string) int {
	if !strings.HasPrefix(k, prefix+":{") {
		return -1
	}
	i := strings.Index(k[len(prefix):], "}:m:")
	if i < 0 {
		return -1
	}
	return len(prefix) + i + 4
}

// memberKeyOf is the member key (unescaped) of k, the meta key of a family
// member: a key that memberAt finds, as the meta patterns above match.
func memberKeyOf(prefix, k string) string {
	return tagUnescaper.Replace(strings.TrimSuffix(k[memberAt(prefix, k):], ":meta"))
}

// globEscaper escapes the characters that a SCAN pattern gives a meaning.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
