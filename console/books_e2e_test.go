package console_test

import (
	"fmt"
	"testing"

	"chessd/console"
)

// What the console shows stays whole, in a real Chromium against a real chessd: the
// secret of the key in use, rotated with no grace, stays shown (the console switching
// to it).
func TestConsoleSecretsBooksAndVerificationInChromium(t *testing.T) {
	if !console.New().Built() {
		t.Fatal("the console is not built into console/dist: run `make web`")
	}
	chromium := chromiumPath(t)
	server := startServer(t)
	base := validated(t, server)
	key := signup(t, server, "books@example.com")
	b := newBrowser(t, chromium, base)

	// Keys: the key in use rotated with no grace. The console now uses the new secret,
	// and still shows it, once, to be copied.
	b.open("/keys")
	b.setValue("#key-input", key)
	b.click(".keyform button[type=submit]")
	b.wait(`!!document.querySelector('[data-testid=keys] tr .badge')`)
	b.eval(`[...document.querySelectorAll('[data-testid=keys] tr')].find(r => r.querySelector('.badge')).querySelector('button[aria-label^=Rotate]').click(), ''`)
	b.wait(`document.querySelector('dialog').open`)
	b.click("[data-testid=dialog-submit]")
	b.wait(fmt.Sprintf(`sessionStorage.getItem('chessd.key') !== %q && !!document.querySelector('[data-testid=keys] tr .badge')`, key))
	rotated := b.eval(`sessionStorage.getItem('chessd.key')`)
	shown := b.eval(`(b => b.hidden ? 'hidden' : b.querySelector('[data-testid=secret]')?.textContent || 'empty')(document.querySelector('[data-testid=secret-box]'))`)
	if shown != rotated {
		t.Errorf("after rotating the key in use the secret box shows %q, want the new secret, %s…", shown, rotated[:12])
	}
	if status, _ := evalCall(t, server, key); status != 401 {
		t.Errorf("the rotated-away secret's call answered %d, want 401", status)
	}
	if status, body := evalCall(t, server, rotated); status != 200 {
		t.Errorf("the new secret's call answered %d %s", status, body)
	}

	b.checkClean()
}
