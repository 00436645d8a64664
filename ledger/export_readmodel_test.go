package ledger

// EditCharges has edit change every charge made until restore is called; not safe
// while calls are being answered concurrently.
func EditCharges(edit func(*UnitsCharged)) (restore func()) {
	testHookCharge = edit
	return func() { testHookCharge = nil }
}
