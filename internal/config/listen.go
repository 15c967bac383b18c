package config

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Listen binds addr, the value of the environment variable key, so a binary can say
// it listens only once it does. A failure names the variable and what to set it to:
// "address already in use" alone does not tell an operator which of the binaries'
// addresses to change.
func Listen(key, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("%s=%s: the address is already in use (another process listens there): "+
			"stop that process or set %s to a free host:port", key, addr, key)
	case errors.Is(err, syscall.EACCES):
		return nil, fmt.Errorf("%s=%s: permission denied (ports below 1024 need privileges): set %s to a port above 1023", key, addr, key)
	default:
		return nil, fmt.Errorf("%s=%s: %w: set %s to a host:port of this machine that is free", key, addr, err, key)
	}
}
