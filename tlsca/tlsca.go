// Package tlsca makes and loads the certificates of a job's mutual TLS:
// a throw-away CA and one certificate for every process (what 'autobyte
// launch --tls' uses for one run), and the tls.Config a process builds
// from its certificate, key and CA files.
package tlsca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the PEM files of one process: its certificate and key, and the
// CA every peer's certificate must be signed by.
type Files struct {
	Cert, Key, CA string
}

// ErrIncomplete is wrapped by Config when only some of the files are given.
var ErrIncomplete = errors.New("TLS needs a certificate, its key and the CA together")

// Config loads the files into a mutual-TLS configuration: nil when no file
// is given. Every process both dials and accepts, so one certificate serves
// as client and server certificate, and peers must present one signed by
// the CA (TLS 1.3).
func (f Files) Config() (*tls.Config, error) {
	if f.Cert == "" && f.Key == "" && f.CA == "" {
		return nil, nil
	}
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return nil, fmt.Errorf("%w (got certificate %q, key %q, CA %q)", ErrIncomplete, f.Cert, f.Key, f.CA)
	}
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("certificate %s / key %s: %w", f.Cert, f.Key, err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("CA %s: no PEM certificate in it", f.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

// Validity is how long Ephemeral's certificates are valid (from an hour
// ago, for clocks slightly behind).
const Validity = 7 * 24 * time.Hour

// Ephemeral writes a fresh CA and one certificate valid for ips and
// "localhost" into dir (ca.pem, cert.pem, key.pem; mode 0600), for one run.
// The CA's key is not kept: no other certificate can be signed by it.
func Ephemeral(dir string, ips []net.IP) (Files, error) {
	var f Files
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "autobyte launch CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(Validity), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "autobyte"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(Validity), IPAddresses: ips, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return f, err
	}
	f = Files{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem"), CA: filepath.Join(dir, "ca.pem")}
	for _, w := range []struct {
		path, typ string
		der       []byte
	}{{f.Cert, "CERTIFICATE", leafDER}, {f.Key, "EC PRIVATE KEY", keyDER}, {f.CA, "CERTIFICATE", caDER}} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), 0o600); err != nil {
			return f, fmt.Errorf("writing %s: %w", w.path, err)
		}
	}
	return f, nil
}
