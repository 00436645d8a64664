package ledger

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Keyless calls are charged nothing, but each client address has a daily allowance of
// calls (decisions.md). A server takes an address's allowance in blocks
// (meter_keyless: at most a quarter of what is left, so that other servers find some)
// and hands calls out of the block in memory; a call that produced no answer gives its
// call back to the block, and an idle block's unused calls go back to the database.
// A server that dies loses at most a block per address for the day: the client gets
// fewer free calls, never more than its allowance.

// keylessBlock is one server's block of an address's calls for one day.
type keylessBlock struct {
	fill     sync.Mutex // one top-up at a time
	avail    int        // the rest under Meter.mu
	filling  int        // top-ups in flight: the block is in use
	ahead    bool       // a top-up ahead of need is in flight
	scarce   bool       // the last top-up got less than it asked: none ahead of need
	lastUsed time.Time
	released bool
}

type keylessKey struct {
	addr netip.Addr
	day  string
}

// keylessWant is how many calls a block is topped up for at most.
const keylessWant = 64

// ReserveKeyless takes one call of addr's allowance for today; a refusal is a *Refusal
// (OutcomeKeyless). The returned function gives the call back when it produced no
// answer.
func (m *Meter) ReserveKeyless(ctx context.Context, addr netip.Addr, perDay int) (func(answered bool), error) {
	k := keylessKey{addr, m.now().Format(time.DateOnly)}
	for {
		m.mu.Lock()
		b, ok := m.keyless[k]
		if !ok {
			b = &keylessBlock{lastUsed: time.Now()}
			m.keyless[k] = b
		}
		if b.avail > 0 && !b.released {
			b.avail--
			b.lastUsed = time.Now()
			if !b.ahead && !b.scarce && !m.closing && b.avail < keylessWant/2 {
				b.ahead = true
				m.aheads.Add(1)
				go m.fillKeylessAhead(k, b, perDay)
			}
			m.mu.Unlock()
			return m.giveBack(b), nil
		}
		m.mu.Unlock()
		filled, err := m.fillKeyless(ctx, k, b, perDay, false)
		if err != nil {
			return nil, err
		}
		if !filled {
			return nil, refusal(OutcomeKeyless)
		}
	}
}

// fillKeylessAhead tops a block that runs low up in the background, so that its
// address's calls do not wait for the round trip; a refusal is the next dry call's.
func (m *Meter) fillKeylessAhead(k keylessKey, b *keylessBlock, perDay int) {
	defer m.aheads.Done()
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.LeaseTTL/3)
	defer cancel()
	if _, err := m.fillKeyless(ctx, k, b, perDay, true); err != nil {
		m.logger.Debug("keyless top-up ahead of need", "err", err)
	}
	m.mu.Lock()
	b.ahead = false
	m.mu.Unlock()
}

// fillKeyless tops b up from the database, to at most keylessWant calls: when it is
// empty, or ahead of need when it is half empty. False when the allowance is used up.
func (m *Meter) fillKeyless(ctx context.Context, k keylessKey, b *keylessBlock, perDay int, ahead bool) (bool, error) {
	b.fill.Lock()
	defer b.fill.Unlock()
	m.mu.Lock()
	avail, released := b.avail, b.released
	enough := avail > 0
	if ahead {
		enough = avail >= keylessWant/2
	}
	if !enough && !released {
		b.filling++ // housekeeping leaves a block being filled alone
	}
	m.mu.Unlock()
	if enough || released {
		return true, nil // filled meanwhile, or replaced: try again
	}
	var granted int
	err := m.pool.QueryRow(ctx, `SELECT meter_keyless($1, $2, $3, $4)`, k.addr, k.day, keylessWant-avail, perDay).Scan(&granted)
	m.mu.Lock()
	b.filling--
	b.avail += granted
	// near the allowance's end, calls taken ahead could sit here while another server refuses
	b.scarce = err == nil && granted < keylessWant-avail
	b.lastUsed = time.Now()
	m.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("keyless allowance: %w", err)
	}
	return granted > 0, nil
}

func (m *Meter) giveBack(b *keylessBlock) func(answered bool) {
	return func(answered bool) {
		if answered {
			return
		}
		m.mu.Lock()
		b.avail++
		m.mu.Unlock()
	}
}

// releaseKeyless gives idle blocks' unused calls back (all of them when all is set).
func (m *Meter) releaseKeyless(ctx context.Context, all bool) {
	type back struct {
		k keylessKey
		n int
	}
	var backs []back
	m.mu.Lock()
	for k, b := range m.keyless {
		if all || (b.filling == 0 && time.Since(b.lastUsed) > m.cfg.LeaseIdle) {
			b.released = true
			delete(m.keyless, k)
			if b.avail > 0 {
				backs = append(backs, back{k, b.avail})
			}
		}
	}
	m.mu.Unlock()
	for _, r := range backs {
		if _, err := m.pool.Exec(ctx, `UPDATE keyless_usage SET calls = greatest(0, calls - $3) WHERE ip = $1 AND day = $2`,
			r.k.addr, r.k.day, r.n); err != nil {
			m.logger.Warn("give back keyless calls (they are lost for the day)", "err", err)
		}
	}
}
