package projections

// SetRebuildChunk makes rebuilds read and write n events at a time, until the
// returned function puts the size back.
func SetRebuildChunk(n int) (restore func()) {
	old := rebuildChunk
	rebuildChunk = n
	return func() { rebuildChunk = old }
}
