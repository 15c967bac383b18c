package quota

import (
	"fmt"
	"math"
	"time"
)

// CheckKeys lists every key one check of req touches when Redis's clock reads now:
// the KEYS of the EVALSHA the engine builds (month hash, dirty set, idempotency key;
// hydrate.lua and drain.lua use the first two), then the current and previous bucket
// of each sliding window, named as check.lua names them from ARGV[1] (the org's key
// start) and Redis TIME. It fails as New does for a bad prefix and as Check does for
// a bad request.
func CheckKeys(prefix string, req Request, now time.Time) ([]string, error) {
	cfg := Config{KeyPrefix: prefix}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg}
	c := &call{}
	e.build(c, &req, now)
	nkeys := c.args[2].(int)
	var keys []string
	for _, k := range c.args[3 : 3+nkeys] {
		keys = append(keys, k.(string))
	}
	argv := c.args[3+nkeys:]
	start := argv[0].(string) // ARGV[1]
	nw := argv[6].(int)       // ARGV[7]
	// now = sec * 1000 + floor(usec / 1000); b = math.floor(now / ms); and Lua 5.1
	// turns a number into text with "%.14g".
	ms := float64(now.Unix()*1000 + int64(now.Nanosecond()/1000)/1000)
	for _, sec := range argv[7 : 7+nw] {
		s := sec.(string)
		var n float64
		fmt.Sscan(s, &n)
		b := math.Floor(ms / (n * 1000))
		keys = append(keys, start+"w|"+s+"|"+fmt.Sprintf("%.14g", b), start+"w|"+s+"|"+fmt.Sprintf("%.14g", b-1))
	}
	return keys, nil
}
