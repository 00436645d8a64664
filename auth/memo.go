package auth

import (
	"sync"
	"sync/atomic"
)

// memo is a sync.Map bounded in size: once max new entries have been stored since it
// was last emptied, it forgets them all. Simpler than tracking recency, and a
// forgotten entry costs one load from the database. Anyone may add entries (a key
// created, used once and revoked, over and over), so nothing kept per secret or
// stream may grow without bound.
type memo struct {
	m   sync.Map
	n   atomic.Int64 // new entries stored since the last emptying (deletions not counted)
	max int64
}

func (c *memo) Load(k any) (any, bool) { return c.m.Load(k) }

func (c *memo) Delete(k any) { c.m.Delete(k) }

// Store adds or replaces k's entry; replacing one does not count toward max.
func (c *memo) Store(k, v any) {
	if _, ok := c.m.Load(k); !ok && c.n.Add(1) > c.max {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(k, v)
}

// Len counts the entries (for tests: it walks the map).
func (c *memo) Len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}
