// Package ledger is the only place that moves money. Every charge is a double-entry
// transaction whose postings balance by construction, per currency: units (integers)
// and USD (shopspring/decimal; no float anywhere on this path).
package ledger

import (
	"fmt"
	"slices"

	"github.com/shopspring/decimal"
)

// Currency is what a posting counts.
type Currency string

const (
	Units Currency = "UNITS"
	USD   Currency = "USD"
)

// Book is one account's books in one environment: "<account id>/<env>". Test keys
// post to the test book only.
func Book(accountID, env string) string { return accountID + "/" + env }

// Ledger accounts inside a book.
const (
	AccountAllowance = "allowance" // where units come from (the plan's allowance)
	AccountRevenue   = "revenue"   // what the USD value of the calls is owed to
)

// KeyAccount is the account that records one key's spend.
func KeyAccount(keyID string) string { return "key:" + keyID }

// Posting is one line of a transaction: a debit or a credit, never both.
type Posting struct {
	Book     string          `json:"book"`
	Account  string          `json:"account"`
	Currency Currency        `json:"currency"`
	Debit    decimal.Decimal `json:"debit"`
	Credit   decimal.Decimal `json:"credit"`
}

// Move takes Amount of Currency from one account to another in the same book.
type Move struct {
	From, To string
	Currency Currency
	Amount   decimal.Decimal
}

// Transaction is a balanced set of postings. Its only constructor pairs every debit
// with an equal credit, so an unbalanced transaction cannot be made.
type Transaction struct {
	postings []Posting
}

// NewTransaction builds the postings of moves in book. Amounts must be positive and
// units whole.
func NewTransaction(book string, moves ...Move) (Transaction, error) {
	var t Transaction
	for _, m := range moves {
		if !m.Amount.IsPositive() {
			return Transaction{}, fmt.Errorf("ledger: move of %s %s must be positive", m.Amount, m.Currency)
		}
		if m.Currency == Units && !m.Amount.Equal(m.Amount.Truncate(0)) {
			return Transaction{}, fmt.Errorf("ledger: units must be whole, got %s", m.Amount)
		}
		if m.From == m.To {
			return Transaction{}, fmt.Errorf("ledger: move from %s to itself", m.From)
		}
		t.postings = append(t.postings,
			Posting{Book: book, Account: m.To, Currency: m.Currency, Debit: m.Amount, Credit: decimal.Zero},
			Posting{Book: book, Account: m.From, Currency: m.Currency, Debit: decimal.Zero, Credit: m.Amount})
	}
	return t, nil
}

// Postings returns a copy of the transaction's lines.
func (t Transaction) Postings() []Posting { return append([]Posting(nil), t.postings...) }

// Balanced reports whether debits equal credits in every currency: true for anything
// NewTransaction made; used to check postings read back from storage.
//
// A rebuild checks every charge it reads: for the few postings of a charge or a
// credit, the first posting of each currency sums its currency's, without a map.
func Balanced(ps []Posting) bool {
	for _, p := range ps {
		if p.Debit.IsNegative() || p.Credit.IsNegative() || (!p.Debit.IsZero() && !p.Credit.IsZero()) {
			return false
		}
	}
	if len(ps) > 8 {
		return balancedByMap(ps)
	}
	for i, p := range ps {
		if slices.ContainsFunc(ps[:i], func(q Posting) bool { return q.Currency == p.Currency }) {
			continue // summed with the first of its currency
		}
		var debit, credit decimal.Decimal
		for _, q := range ps[i:] {
			if q.Currency != p.Currency {
				continue
			}
			if !q.Debit.IsZero() {
				debit = debit.Add(q.Debit)
			}
			if !q.Credit.IsZero() {
				credit = credit.Add(q.Credit)
			}
		}
		if !debit.Equal(credit) {
			return false
		}
	}
	return true
}

// balancedByMap sums each currency once, however many postings there are.
func balancedByMap(ps []Posting) bool {
	sum := map[Currency]decimal.Decimal{}
	for _, p := range ps {
		sum[p.Currency] = sum[p.Currency].Add(p.Debit).Sub(p.Credit)
	}
	for _, v := range sum {
		if !v.IsZero() {
			return false
		}
	}
	return true
}

// ChargeTransaction is the transaction of one charge: units from the allowance and
// their USD value from revenue, both to the key's account.
func ChargeTransaction(accountID, env, keyID string, units int64, usd decimal.Decimal) (Transaction, error) {
	moves := []Move{{From: AccountAllowance, To: KeyAccount(keyID), Currency: Units, Amount: decimal.NewFromInt(units)}}
	if usd.IsPositive() {
		moves = append(moves, Move{From: AccountRevenue, To: KeyAccount(keyID), Currency: USD, Amount: usd})
	}
	return NewTransaction(Book(accountID, env), moves...)
}
