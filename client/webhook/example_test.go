package webhook_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/client/webhook"
)

// A receiver reads the raw body, verifies it, and only then decodes the JSON.
func ExampleVerify() {
	secret := "3af2fb1d0c5e4a8f" // the org's signing_secret from GET /v1/orgs/{org}/webhook
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		err = webhook.Verify(secret, r.Header.Get(webhook.SignatureHeader), body, time.Now(), webhook.DefaultTolerance)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		// Verified: decode body, handle the event (once per Quotaplane-Delivery id).
		fmt.Println("accepted", r.Header.Get(webhook.EventHeader), "delivery", r.Header.Get(webhook.DeliveryHeader))
		w.WriteHeader(http.StatusNoContent)
	})

	// A delivery as Quotaplane sends it.
	body := `{"id":17,"type":"usage.threshold","org":"demo","period":"2026-11","created_at":"2026-11-25T09:00:00Z","data":{}}`
	req := httptest.NewRequest(http.MethodPost, "/hooks/quotaplane", strings.NewReader(body))
	req.Header.Set(webhook.SignatureHeader, webhook.Sign(secret, time.Now(), []byte(body)))
	req.Header.Set(webhook.EventHeader, "usage.threshold")
	req.Header.Set(webhook.DeliveryHeader, "17")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)

	// The same delivery with its body changed on the way.
	forged := httptest.NewRequest(http.MethodPost, "/hooks/quotaplane", strings.NewReader(strings.Replace(body, "demo", "evil", 1)))
	forged.Header = req.Header
	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, forged)
	fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()))
	// Output:
	// accepted usage.threshold delivery 17
	// 401 signature mismatch
}
