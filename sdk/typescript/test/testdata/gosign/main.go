// Command gosign answers, for the TypeScript SDK's webhook tests, what Go's package
// webhook says: for each JSON case on stdin, Sign's header for the body at the time,
// and what Verify says of the case's header. The tests compare verifyWebhook and
// signWebhook with these answers.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/quotaplane/quotaplane/webhook"
)

type testCase struct {
	Secret   string `json:"secret"`
	Body     []byte `json:"body"` // base64 in JSON
	SignAt   int64  `json:"sign_at"`
	Header   string `json:"header"`
	NowMilli int64  `json:"now_ms"`
}

type answer struct {
	Signed string `json:"signed"`
	Verify string `json:"verify"` // "ok", "malformed", "timestamp" or "mismatch"
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var c testCase
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			fmt.Fprintln(os.Stderr, "gosign:", err)
			os.Exit(2)
		}
		a := answer{Signed: webhook.Sign(c.Secret, time.Unix(c.SignAt, 0), c.Body)}
		err := webhook.Verify(c.Secret, c.Header, c.Body, time.UnixMilli(c.NowMilli), webhook.DefaultTolerance)
		switch {
		case err == nil:
			a.Verify = "ok"
		case errors.Is(err, webhook.ErrMalformed):
			a.Verify = "malformed"
		case errors.Is(err, webhook.ErrTimestamp):
			a.Verify = "timestamp"
		case errors.Is(err, webhook.ErrMismatch):
			a.Verify = "mismatch"
		default:
			a.Verify = err.Error()
		}
		if err := out.Encode(a); err != nil {
			os.Exit(2)
		}
	}
}
