// Package memo is a concurrent map bounded in size, for what a process remembers of
// what anyone may send it (secrets seen, keys' states, parsed positions).
package memo

import (
	"sync"
	"sync/atomic"
)

// Map is a sync.Map bounded in size: once Max new entries have been stored since it
// was last emptied, it forgets them all. Simpler than tracking recency, and a
// forgotten entry costs one load from where it came. Max must be set before use.
type Map struct {
	m   sync.Map
	n   atomic.Int64 // new entries stored since the last emptying (deletions not counted)
	Max int64
}

func (c *Map) Load(k any) (any, bool) { return c.m.Load(k) }

func (c *Map) Delete(k any) { c.m.Delete(k) }

// Store adds or replaces k's entry; replacing one does not count toward Max.
func (c *Map) Store(k, v any) {
	if _, ok := c.m.Load(k); !ok && c.n.Add(1) > c.Max {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(k, v)
}

// Len counts the entries (for tests: it walks the map).
func (c *Map) Len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}
