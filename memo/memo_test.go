package memo

import "testing"

// A Map holds at most Max entries; replacing one counts nothing, and past Max it
// starts afresh with the entry stored.
func TestMapBounded(t *testing.T) {
	m := Map{Max: 3}
	for i := range 3 {
		m.Store(i, i)
	}
	m.Store(0, "again") // a replacement: still three
	if n := m.Len(); n != 3 {
		t.Fatalf("%d entries after three and a replacement, want 3", n)
	}
	m.Store(3, 3)
	if v, ok := m.Load(3); !ok || v != 3 || m.Len() != 1 {
		t.Fatalf("past Max: %d entries, the new one %v %v; want it alone", m.Len(), v, ok)
	}
}
