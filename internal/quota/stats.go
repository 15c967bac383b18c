package quota

// PoolStats is the state of the connections of one pool's Redis client: what a
// leak after an outage would show (connections that never go back, or never close).
type PoolStats struct {
	// TotalConns is the number of connections open.
	TotalConns uint32
	// IdleConns is the number of those waiting, unused, in the client's pool.
	IdleConns uint32
	// Timeouts counts, since the client was opened, the waits for a free connection
	// that timed out.
	Timeouts uint32
}

// PoolStats returns the connection statistics of every pool used so far, by pool
// name as in PoolStates; DedicatedPool sums every org's dedicated Redis. For
// diagnostics and tests.
func (r *Engines) PoolStats() map[string]PoolStats {
	out := map[string]PoolStats{}
	r.backends.Range(func(_, v any) bool {
		b := v.(*backendEntry).ready()
		if b == nil {
			return true
		}
		s := b.rdb.PoolStats() // a method of redis.UniversalClient: any client kind
		sum := out[b.name]
		sum.TotalConns += s.TotalConns
		sum.IdleConns += s.IdleConns
		sum.Timeouts += s.Timeouts
		out[b.name] = sum
		return true
	})
	return out
}
