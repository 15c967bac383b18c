package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/quotaplane/quotaplane/client"
)

// Deciding where the product decides: a boolean feature gates a page, an integer one
// caps a count. Quotaplane answers from its cache.
func ExampleClient_Entitled() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	sso, err := qp.Entitled(ctx, "demo", "eng", "alice", "sso")
	if err != nil {
		log.Fatal(err) // a *client.Error for a 4xx; errors.Is(err, client.ErrUnavailable) when unreachable
	}
	seats, err := qp.Feature(ctx, "demo", "", "", "seats")
	if err != nil {
		log.Fatal(err)
	}
	if n, ok := seats.(int64); ok {
		fmt.Printf("sso: %v, seats: %d\n", sso, n)
	}
}
