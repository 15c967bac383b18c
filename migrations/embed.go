// Package migrations holds the golang-migrate SQL files of the Quotaplane schema,
// embedded so both binaries can apply them at start-up.
package migrations

import "embed"

// FS holds every NNNNNN_name.up.sql / .down.sql pair.
//
//go:embed *.sql
var FS embed.FS
