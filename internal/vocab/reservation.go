package vocab

import "time"

// A reservation, as the engine (internal/quota) holds it and every transport renders
// it.

// ReservationState is where a reservation is in its life.
type ReservationState string

// The states of a reservation. Only a Held one can be settled.
const (
	Held      ReservationState = "held"
	Committed ReservationState = "committed"
	Released  ReservationState = "released"
	Expired   ReservationState = "expired"
)

// OnExpiry is what settles a reservation left open past its expiry.
type OnExpiry string

// The expiry actions.
const (
	// ExpiryCommit counts the whole amount (the default: usage is never lost).
	ExpiryCommit OnExpiry = "commit"
	// ExpiryRelease gives everything back.
	ExpiryRelease OnExpiry = "release"
)

// Reservation is one reservation and, once settled, its settlement.
type Reservation struct {
	ID       string
	Org      string
	Team     string
	User     string
	Metric   string
	State    ReservationState
	Amount   int64
	OnExpiry OnExpiry
	// Period is the billing period the units are held in.
	Period    string
	CreatedAt time.Time
	ExpiresAt time.Time
	// Used, Released (given back) and OverReserved (used beyond Amount, counted in
	// full) are known once settled; SettledAt is when.
	Used         int64
	Released     int64
	OverReserved int64
	SettledAt    time.Time
	// Metrics is a multi-metric reservation's every metric (Metric, Amount, Used,
	// Released and OverReserved above are then its first's); nil for one metric.
	Metrics []MetricAmount
	// Replayed is true when a settlement answers one made before (a repeated commit
	// or release), which counted nothing more.
	Replayed bool
}

// MetricAmount is one metric of a multi-metric reservation: held, and once settled
// used, given back and over-reserved.
type MetricAmount struct {
	Metric       string
	Amount       int64
	Used         int64
	Released     int64
	OverReserved int64
}
