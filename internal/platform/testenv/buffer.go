package testenv

import (
	"bytes"
	"sync"
)

// Buffer collects output written by other goroutines (a child process's stderr, a
// logger) while the test reads it: a bytes.Buffer behind a mutex.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
