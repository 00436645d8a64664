// Package gctune holds the garbage collector's target of chessd's processes, so that
// the server, the worker, a rebuild and the bench that measures them run alike.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the garbage collector's target (GOGC) a chessd process runs at unless the
// operator set GOGC. Collecting a quarter as often as Go's default (100) cut the
// server's own CPU per depth-10 job position by about 15 %, which the engines get back
// on a machine whose cores they fill, its CPU per cached call by 15-20 %, and a
// rebuild's by about 15 %, for a peak of about 100 MB rather than 55 under load
// (docs/BENCHMARKS.md, sessions 14, 15 and 18).
const Percent = 400

// Apply sets the target to Percent unless GOGC is set (an operator's setting wins),
// and returns what puts the former target back.
func Apply() (restore func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	old := debug.SetGCPercent(Percent)
	return func() { debug.SetGCPercent(old) }
}
