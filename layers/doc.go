// Package layers holds no code: its test enforces the layering of the module, bottom
// to top (docs/ARCHITECTURE.md, "Layers"):
//
//	domain (no I/O) < postgres, engine, ratelimit < eventstore < commands, ledger
//	< projections < auth, analysis < httpapi, executor < cmd
//
// A package imports only packages of its own layer or below; when a change needs an
// arrow back up, the code moves instead. cmd/ only wires: it, like httpapi, holds no
// SQL and reads and writes tables through the packages that own them.
package layers
