package httpapi

import (
	"errors"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// dbConnLost reports whether err says the connection to Postgres was lost or refused
// during the request, rather than that the request was wrong: the server crashed or
// was stopped under a query in flight (pgx reports unexpected EOF), it is shutting
// down or starting up (SQLSTATE class 08, 57P01-57P05), or the query never reached it
// (pgconn.SafeToRetry). Fail answers these 503, as it does a refused connection.
func dbConnLost(err error) bool {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.As(err, &pgErr):
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return pgconn.SafeToRetry(err)
}
