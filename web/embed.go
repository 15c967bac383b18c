// Package web holds the built web console (web/dist, made by `make web` from the
// TypeScript sources beside it) embedded into quotaplane-api, so `go build` needs no
// Node.js. The built files are committed; `make web-check` fails when they are stale.
package web

import (
	"embed"
	"io/fs"
)

//go:embed all:dist
var dist embed.FS

// Dist returns the built console: index.html and assets/.
func Dist() fs.FS {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // "dist" is a constant, valid path
	}
	return sub
}
