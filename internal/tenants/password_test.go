package tenants

import (
	"errors"
	"testing"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// At most cap(slots) password hashes run at once; one more fails at once with
// ErrPasswordBusy (Overloaded: 503 with Retry-After), hashing nothing, and a freed
// slot serves the next.
func TestPasswordHashSlots(t *testing.T) {
	h := passwordHasher{memory: 64, iterations: 1, slots: make(chan struct{}, 2)}
	enc, err := h.hash("correct horse battery")
	if err != nil {
		t.Fatal(err)
	}
	h.slots <- struct{}{} // two hashes running
	h.slots <- struct{}{}
	if _, err := h.hash("x"); !errors.Is(err, ErrPasswordBusy) || derrors.KindOf(err) != derrors.Overloaded {
		t.Fatalf("hash with every slot taken: %v", err)
	}
	if _, err := h.verify(enc, "correct horse battery"); !errors.Is(err, ErrPasswordBusy) {
		t.Fatalf("verify with every slot taken: %v", err)
	}
	<-h.slots
	if ok, err := h.verify(enc, "correct horse battery"); err != nil || !ok {
		t.Fatalf("verify with a free slot: %v %v", ok, err)
	}
	if len(h.slots) != 1 {
		t.Errorf("%d slots held after the hash, want the 1 still running", len(h.slots))
	}
	if n := DefaultPasswordHashes(); n < 1 || n > 4 {
		t.Errorf("DefaultPasswordHashes() = %d, want 1 to 4", n)
	}
}
