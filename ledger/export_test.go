package ledger

// Crash stops m as a killed process would stop: nothing more is settled, renewed or
// given back; its leases and claims are left to expire.
func Crash(m *Meter, cancel func()) {
	m.crashed.Store(true)
	cancel()
	<-m.stopped
}
