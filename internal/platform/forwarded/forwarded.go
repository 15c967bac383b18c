// Package forwarded reads who a request came from, and whether over HTTPS, when the
// api runs behind proxies that terminate TLS (an ingress, a load balancer): their
// X-Forwarded-For and X-Forwarded-Proto are believed only when the connection comes
// from one of the configured proxies (QUOTA_TRUSTED_PROXIES). Anyone else can write
// those headers, so from anyone else they are ignored.
package forwarded

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Proxies is the set of addresses whose forwarding headers are believed; the zero
// value trusts none.
type Proxies struct {
	prefixes []netip.Prefix
}

// Parse reads a comma-separated list of addresses and CIDR prefixes
// ("10.0.0.0/8, 127.0.0.1"); empty trusts none.
func Parse(s string) (Proxies, error) {
	var p Proxies
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			pre, err := netip.ParsePrefix(f)
			if err != nil {
				return Proxies{}, fmt.Errorf("%q: want an address or a CIDR prefix such as 10.0.0.0/8", f)
			}
			p.prefixes = append(p.prefixes, pre.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return Proxies{}, fmt.Errorf("%q: want an address or a CIDR prefix such as 10.0.0.0/8", f)
		}
		p.prefixes = append(p.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return p, nil
}

// trusts reports whether a is one of the proxies.
func (p Proxies) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, pre := range p.prefixes {
		if pre.Contains(a) {
			return true
		}
	}
	return false
}

// peer is the address the connection came from (the zero Addr when RemoteAddr is
// not an address, as in some tests).
func peer(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		a, _ := netip.ParseAddr(r.RemoteAddr)
		return a.Unmap()
	}
	return ap.Addr().Unmap()
}

// ClientIP returns the address the request came from: the connection's peer, or,
// when the peer is a trusted proxy, the rightmost address of X-Forwarded-For that is
// not a trusted proxy (each proxy appends the address it was called from; addresses
// left of the first untrusted one may be made up by the caller). An address that does
// not parse stops the walk at the hop before it.
func (p Proxies) ClientIP(r *http.Request) netip.Addr {
	ip := peer(r)
	if !p.trusts(ip) {
		return ip
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		h := strings.TrimSpace(hops[i])
		if h == "" {
			continue
		}
		a, err := netip.ParseAddr(h)
		if err != nil {
			return ip
		}
		ip = a.Unmap()
		if !p.trusts(ip) {
			return ip
		}
	}
	return ip
}

// HTTPS reports whether the client's request reached the api over TLS: this
// connection is TLS, or it comes from a trusted proxy that says (X-Forwarded-Proto,
// its first value: the outermost proxy's) that it received it over https.
func (p Proxies) HTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !p.trusts(peer(r)) {
		return false
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.EqualFold(strings.TrimSpace(proto), "https")
}

// String lists the trusted prefixes, for the start-up log.
func (p Proxies) String() string {
	s := make([]string, len(p.prefixes))
	for i, pre := range p.prefixes {
		s[i] = pre.String()
	}
	return strings.Join(s, ",")
}
