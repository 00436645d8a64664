package ledger

// EditSettled has edit change every ChargesSettled the settler makes until restore is
// called; not safe while calls are being answered concurrently.
func EditSettled(edit func(*ChargesSettled)) (restore func()) {
	testHookSettled = edit
	return func() { testHookSettled = nil }
}
