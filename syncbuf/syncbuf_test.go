package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once lose nothing and tear nothing (run with -race too).
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("line\n")) //nolint:errcheck // never fails
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("line\n", 800) {
		t.Fatalf("%d bytes written, want %d", len(got), 800*5)
	}
}
