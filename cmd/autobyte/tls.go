package main

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/autobyte/autobyte/tlsca"
)

// tlsFiles are the --tls-cert, --tls-key and --tls-ca flags of a process.
type tlsFiles struct {
	cert, key, ca string
}

// config loads the files (package tlsca); nil when none is given.
func (f tlsFiles) config() (*tls.Config, error) {
	cfg, err := tlsca.Files{Cert: f.cert, Key: f.key, CA: f.ca}.Config()
	if errors.Is(err, tlsca.ErrIncomplete) {
		return nil, fmt.Errorf("TLS needs --tls-cert, --tls-key and --tls-ca together (got cert %q, key %q, ca %q)", f.cert, f.key, f.ca)
	}
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key/--tls-ca: %w", err)
	}
	return cfg, nil
}
