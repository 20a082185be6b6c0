package natsserver

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

// Files of a TLS dir made by InitTLS.
const (
	TLSCAFile   = "ca.pem"         // the CA clients verify the server with
	TLSCertFile = "server.pem"     // the server's certificate, signed by the CA
	TLSKeyFile  = "server-key.pem" // the server's private key (mode 0600)
)

// tlsValidity is how long generated certificates are valid.
const tlsValidity = 5 * 365 * 24 * time.Hour

// InitTLS makes dir hold a fresh CA and a server certificate for 127.0.0.1
// and localhost signed by it (TLSCAFile, TLSCertFile, TLSKeyFile) unless it
// holds them already. It reports whether it generated them. The CA's key is
// not kept: to issue another certificate, generate a new dir. Like
// InitAuth, racing processes end up with one set.
func InitTLS(dir string) (bool, error) {
	complete := func(d string) error {
		for _, f := range []string{TLSCAFile, TLSCertFile, TLSKeyFile} {
			if _, err := os.Stat(filepath.Join(d, f)); err != nil {
				return err
			}
		}
		return nil
	}
	return writeDirOnce(dir, complete, "a TLS CA and server certificate", func(tmp string) error {
		now := time.Now()
		caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		ca := &x509.Certificate{
			SerialNumber:          serial(),
			Subject:               pkix.Name{CommonName: "termlog CA"},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(tlsValidity),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("CA certificate: %w", err)
		}
		srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		srv := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: "termlog NATS server"},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(tlsValidity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			// Client auth too: cluster nodes present it to each other.
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP(loopback)},
			DNSNames:    []string{"localhost"},
		}
		srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("server certificate: %w", err)
		}
		keyDER, err := x509.MarshalECPrivateKey(srvKey)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(tmp, TLSCAFile), "CERTIFICATE", caDER, 0o644); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(tmp, TLSCertFile), "CERTIFICATE", srvDER, 0o644); err != nil {
			return err
		}
		return writePEM(filepath.Join(tmp, TLSKeyFile), "EC PRIVATE KEY", keyDER, 0o600)
	})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// ServerTLSConfig loads a server certificate and key for ServerConfig.TLS.
func ServerTLSConfig(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// RouteTLSConfig is ServerConfig.RouteTLS: the nodes of a cluster present
// certFile to each other and accept only certificates signed by caFile
// (mutual TLS), so a route is both encrypted and authenticated. The
// certificate must allow client and server auth (InitTLS's does).
func RouteTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	return MutualTLSConfig(certFile, keyFile, caFile)
}

// MutualTLSConfig is a config for mutual TLS between peers that share a
// CA: it presents certFile, verifies the other side against caFile, and as
// a server requires and verifies a client certificate signed by caFile.
// The same config serves both ends (a server uses Certificates, ClientCAs
// and ClientAuth; a client Certificates and RootCAs), so one certificate
// that allows client and server auth (InitTLS's) is enough for a peer.
func MutualTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	c, err := ServerTLSConfig(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA %s: no PEM certificate", caFile)
	}
	c.RootCAs, c.ClientCAs, c.ClientAuth = pool, pool, tls.RequireAndVerifyClientCert
	return c, nil
}
