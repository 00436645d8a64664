package projections

// SetRebuildChunk makes rebuilds read and write n events at a time, until the
// returned function puts the size back.
func SetRebuildChunk(n int) (restore func()) {
	old := rebuildChunk
	rebuildChunk = n
	return func() { rebuildChunk = old }
}

// BeforeSwap has a rebuild call f once its shadow's tables are loaded and indexed,
// before it stops the appends to swap them in, until the returned function removes it.
func BeforeSwap(f func()) (restore func()) {
	old := beforeSwap
	beforeSwap = f
	return func() { beforeSwap = old }
}
