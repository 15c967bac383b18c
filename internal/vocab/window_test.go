package vocab_test

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Every window is valid, shortest first, and only the sliding ones have a length.
func TestWindows(t *testing.T) {
	want := map[vocab.Window]time.Duration{vocab.Second: time.Second, vocab.Minute: time.Minute,
		vocab.Hour: time.Hour, vocab.Day: 24 * time.Hour, vocab.Month: 0, vocab.Concurrent: 0}
	if len(vocab.Windows) != len(want) {
		t.Fatalf("Windows = %v, want the %d windows", vocab.Windows, len(want))
	}
	for i, w := range vocab.Windows {
		if !w.Valid() {
			t.Errorf("%s: not Valid", w)
		}
		if got := w.Duration(); got != want[w] {
			t.Errorf("%s.Duration() = %s, want %s", w, got, want[w])
		}
		if i > 0 && w != vocab.Month && w != vocab.Concurrent && w.Duration() <= vocab.Windows[i-1].Duration() {
			t.Errorf("Windows not shortest first at %s", w)
		}
	}
	for _, w := range []vocab.Window{"", "week", "Minute"} {
		if w.Valid() || w.Duration() != 0 {
			t.Errorf("%q: Valid %v, Duration %s; want false, 0", w, w.Valid(), w.Duration())
		}
	}
	if vocab.Windows[len(vocab.Windows)-2] != vocab.Month || vocab.Windows[len(vocab.Windows)-1] != vocab.Concurrent {
		t.Errorf("Windows does not end with month, concurrent: %v", vocab.Windows)
	}
}

func TestFailModeValid(t *testing.T) {
	for m, want := range map[vocab.FailMode]bool{vocab.FailOpen: true, vocab.FailClosed: true, vocab.FailLocal: true, "": false, "OPEN": false} {
		if got := m.Valid(); got != want {
			t.Errorf("FailMode(%q).Valid() = %v, want %v", m, got, want)
		}
	}
}
