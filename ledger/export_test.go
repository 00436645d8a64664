package ledger

import (
	"context"
	"time"

	"chessd/domain"
)

// Crash stops m as a killed process would stop: nothing more is settled, renewed or
// given back; its leases and claims are left to expire.
func Crash(m *Meter, cancel func()) {
	m.crashed.Store(true)
	cancel()
	<-m.stopped
}

// SetClock makes m read the time from now: call it before m is used.
func SetClock(m *Meter, now func() time.Time) { m.now = now }

// TopUps says how many lease top-ups m made for calls that found their lease dry, and
// how many ahead of need.
func TopUps(m *Meter) (dry, ahead int64) { return m.topUps[0].Load(), m.topUps[1].Load() }

// ReadOnly is readOnly: one snapshot of the read model, taken after any swap of its tables.
var ReadOnly = readOnly

// Held is what m's leases on keyID hold in memory: units not handed to a call, and
// those of calls answered and not yet settled.
func Held(m *Meter, keyID string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, l := range m.leases {
		if l.keyID == keyID {
			n += l.avail + l.pending
		}
	}
	return n
}

// Claims is how many Idempotency-Key claims m renews.
func Claims(m *Meter) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.claims)
}

// Trusted says whether m's lease on keyID may still hand out its units: its row cannot
// have expired unrenewed yet.
func Trusted(m *Meter, keyID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.leases {
		if l.keyID == keyID {
			return !time.Now().After(l.trustedUntil)
		}
	}
	return false
}

// SettleBounds is the statement m's settles set their limits with, once one has run.
func SettleBounds(m *Meter) string { return m.bounds }

// NameConnectionCheck makes settleBounds probe the setting name instead of
// client_connection_check_interval, until the test ends.
func NameConnectionCheck(t interface{ Cleanup(func()) }, name string) {
	old := connectionCheck
	connectionCheck = name
	t.Cleanup(func() { connectionCheck = old })
}

// Lease is one of a meter's leases, for tests that take Reserve's steps one by one.
type Lease struct{ l *lease }

// LeaseFor is Reserve's first step for k: the meter's lease on k today, whether it is
// fresh (taken for k's and a's versions), and what to wait for while the key's last
// lease is given back (nil when nothing is).
func LeaseFor(m *Meter, k *domain.Key, a *domain.Account) (Lease, bool, <-chan struct{}) {
	l, fresh, given := m.leaseFor(k, a, m.now().Format(time.DateOnly))
	return Lease{l}, fresh, given
}

// ReleaseBeforeNext is what Reserve does with a lease LeaseFor found stale.
func ReleaseBeforeNext(m *Meter, l Lease) { m.releaseBeforeNext(context.Background(), l.l) }
