package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// tlsFlags configure mutual TLS on every connection of a process.
type tlsFiles struct {
	cert, key, ca string
}

// config loads the files into a mutual-TLS configuration (nil when no file
// is given). Every process both dials and accepts, so one certificate
// serves as client and server certificate, and peers must present one
// signed by the CA.
func (f tlsFiles) config() (*tls.Config, error) {
	if f.cert == "" && f.key == "" && f.ca == "" {
		return nil, nil
	}
	if f.cert == "" || f.key == "" || f.ca == "" {
		return nil, fmt.Errorf("TLS needs --tls-cert, --tls-key and --tls-ca together (got cert %q, key %q, ca %q)", f.cert, f.key, f.ca)
	}
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s / --tls-key %s: %w", f.cert, f.key, err)
	}
	caPEM, err := os.ReadFile(f.ca)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", f.ca)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

// ephemeralTLS writes a throw-away CA and one certificate valid for ips
// into dir, for 'launch --tls'.
func ephemeralTLS(dir string, ips []net.IP) (tlsFiles, error) {
	var f tlsFiles
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "autobyte launch CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
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
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), IPAddresses: ips, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return f, err
	}
	f = tlsFiles{cert: filepath.Join(dir, "cert.pem"), key: filepath.Join(dir, "key.pem"), ca: filepath.Join(dir, "ca.pem")}
	for _, w := range []struct {
		path, typ string
		der       []byte
	}{{f.cert, "CERTIFICATE", leafDER}, {f.key, "EC PRIVATE KEY", keyDER}, {f.ca, "CERTIFICATE", caDER}} {
		if err := os.WriteFile(w.path, pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der}), 0o600); err != nil {
			return f, fmt.Errorf("writing %s: %w", w.path, err)
		}
	}
	return f, nil
}
