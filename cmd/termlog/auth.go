package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/natsserver"
)

// defaultAuthDir is where clients look for role keys without --auth-dir:
// the keys `termlog up` generates with its default --data.
const defaultAuthDir = "termlog-data/auth"

// authFlags are the client credentials flags every command shares.
type authFlags struct {
	authDir string // --auth-dir: the dir of role keys; "" means defaultAuthDir if it exists
	creds   string // --creds: a seed file overriding the role's file in the auth dir
	tlsCA   string // --tls-ca: verify the server with this CA (and require TLS)
}

func (a *authFlags) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&a.authDir, "auth-dir", "", "dir of the role keys (<role>.nk); each command connects as its role: meta, worker, store (logstore), observer (status, replay), admin (stepdown, drain, import). Default "+defaultAuthDir+" when it exists, else no credentials")
	f.StringVar(&a.creds, "creds", "", "NKey seed file to connect with, instead of the role's file in --auth-dir")
	f.StringVar(&a.tlsCA, "tls-ca", "", "CA certificate (PEM) to verify the NATS server with; connects with TLS. With --tls-cert (meta, worker, logstore) also the CA their peers' certificates are checked against")
}

// seedFile is the NKey seed a command of role connects with: --creds, or
// the role's file in the auth dir; "" for none (an --insecure server).
func (g *globals) seedFile(role natsserver.Role) string {
	switch {
	case g.auth.creds != "":
		return g.auth.creds
	case g.auth.authDir != "":
		return natsserver.SeedFile(g.auth.authDir, role)
	}
	if _, err := os.Stat(natsserver.SeedFile(defaultAuthDir, role)); err == nil {
		return natsserver.SeedFile(defaultAuthDir, role)
	}
	return ""
}

// roleOptions are the options a command of role connects with: its NKey
// (seedFile) and TLS (--tls-ca).
func (g *globals) roleOptions(role natsserver.Role) ([]nats.Option, error) {
	var opts []nats.Option
	if seed := g.seedFile(role); seed != "" {
		o, err := natsserver.ClientOptions(seed)
		if err != nil {
			return nil, fmt.Errorf("%w (role %s)", err, role)
		}
		opts = append(opts, o...)
	}
	if g.auth.tlsCA != "" {
		opts = append(opts, nats.RootCAs(g.auth.tlsCA))
	}
	return opts, nil
}

// serverSecurity are the flags of a server (`termlog nats`, `termlog up`):
// role keys unless --insecure, TLS with --tls or --tls-cert/--tls-key.
type serverSecurity struct {
	insecure        bool
	tls             bool
	tlsCert, tlsKey string
}

func (s *serverSecurity) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&s.insecure, "insecure", false, "run an open server: no credentials, anyone may do anything")
	f.BoolVar(&s.tls, "tls", false, "require TLS with the certificate in <auth dir>/tls (a CA and a 127.0.0.1 certificate are generated there if missing); up also makes its control streams and Raft traffic mutual TLS with them")
	f.StringVar(&s.tlsCert, "tls-cert", "", "require TLS with this server certificate (PEM; with --tls-key)")
	f.StringVar(&s.tlsKey, "tls-key", "", "the key of --tls-cert (PEM)")
}

// secured is what a server runs with.
type secured struct {
	auth    *natsserver.ServerAuth // nil: open server
	authDir string                 // "" when insecure
	tls     *tls.Config            // nil: plaintext
	caFile  string                 // the generated CA, if any
	// routeTLS is mutual TLS between cluster nodes: with --tls, or with
	// --tls-cert/--tls-key and the CA that signed them (--tls-ca).
	routeTLS *tls.Config
	// peer are the files of mutual TLS between up's own processes (the
	// control streams, Raft), with the same certificate and CA as routeTLS.
	peer tlsFiles
}

// setup generates (first start) or loads the role keys in authDir and the
// TLS material, and says so on out. peerCA (--tls-ca) is the CA of an
// explicit --tls-cert, for mutual TLS between cluster nodes.
func (s *serverSecurity) setup(cluster, authDir, peerCA string, out io.Writer) (secured, error) {
	var sec secured
	if s.insecure {
		fmt.Fprintln(out, "WARNING: --insecure: the NATS server takes any client without credentials")
	} else {
		abs, err := filepath.Abs(authDir)
		if err != nil {
			return sec, err
		}
		created, err := natsserver.InitAuth(abs)
		if err != nil {
			return sec, err
		}
		if sec.auth, err = natsserver.LoadServerAuth(abs, cluster); err != nil {
			return sec, err
		}
		sec.authDir = abs
		verb := "using"
		if created {
			verb = "generated"
		}
		fmt.Fprintf(out, "credentials: %s role keys in %s (%s); clients take --auth-dir %s\n", verb, abs, roleFiles(), abs)
	}
	switch {
	case s.tlsCert != "" || s.tlsKey != "":
		if s.tlsCert == "" || s.tlsKey == "" {
			return sec, errors.New("--tls-cert and --tls-key go together")
		}
		c, err := natsserver.ServerTLSConfig(s.tlsCert, s.tlsKey)
		if err != nil {
			return sec, err
		}
		sec.tls = c
		fmt.Fprintf(out, "TLS: certificate %s\n", s.tlsCert)
		if peerCA != "" {
			if sec.routeTLS, err = natsserver.RouteTLSConfig(s.tlsCert, s.tlsKey, peerCA); err != nil {
				return sec, err
			}
			sec.peer = tlsFiles{ca: peerCA, cert: s.tlsCert, key: s.tlsKey}
		}
	case s.tls:
		if sec.authDir == "" {
			abs, err := filepath.Abs(authDir)
			if err != nil {
				return sec, err
			}
			if err := os.MkdirAll(abs, 0o700); err != nil {
				return sec, err
			}
			authDir = abs
		} else {
			authDir = sec.authDir
		}
		dir := filepath.Join(authDir, "tls")
		if _, err := natsserver.InitTLS(dir); err != nil {
			return sec, err
		}
		f := dirTLSFiles(dir)
		c, err := natsserver.ServerTLSConfig(f.cert, f.key)
		if err != nil {
			return sec, err
		}
		if sec.routeTLS, err = natsserver.RouteTLSConfig(f.cert, f.key, f.ca); err != nil {
			return sec, err
		}
		sec.tls, sec.caFile, sec.peer = c, f.ca, f
		fmt.Fprintf(out, "TLS: clients take --tls-ca %s\n", sec.caFile)
	}
	return sec, nil
}

// clientOptions are the options of a connection of role to a server set
// up with sec (in-process connections skip TLS).
func (sec secured) clientOptions(role natsserver.Role) ([]nats.Option, error) {
	var opts []nats.Option
	if sec.authDir != "" {
		o, err := natsserver.RoleOptions(sec.authDir, role)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o...)
	}
	if sec.caFile != "" {
		opts = append(opts, nats.RootCAs(sec.caFile))
	}
	return opts, nil
}

// tlsFiles are the PEM files of mutual TLS between the peers of a
// deployment: the meta leader's control streams to the workers and the Raft
// traffic between stores. Both ends present cert and accept only a peer
// whose certificate ca signed; the one generated certificate (server.pem,
// which allows client and server auth) serves every process.
type tlsFiles struct{ ca, cert, key string }

// dirTLSFiles are the files natsserver.InitTLS makes in dir.
func dirTLSFiles(dir string) tlsFiles {
	return tlsFiles{ca: filepath.Join(dir, natsserver.TLSCAFile), cert: filepath.Join(dir, natsserver.TLSCertFile), key: filepath.Join(dir, natsserver.TLSKeyFile)}
}

// config is the mutual TLS config of the control streams (nil: plaintext).
func (f tlsFiles) config() (*tls.Config, error) {
	if f.cert == "" {
		return nil, nil
	}
	return natsserver.MutualTLSConfig(f.cert, f.key, f.ca)
}

// raft is logstore.Config.TLS (nil: plaintext).
func (f tlsFiles) raft() *logstore.TLSFiles {
	if f.cert == "" {
		return nil
	}
	return &logstore.TLSFiles{CAFile: f.ca, CertFile: f.cert, KeyFile: f.key}
}

// peerTLSFlags are the TLS flags of the roles with connections of their
// own besides NATS: meta and worker (the control streams), logstore (Raft).
type peerTLSFlags struct {
	on        bool
	cert, key string
}

func (p *peerTLSFlags) register(cmd *cobra.Command, what string) {
	f := cmd.Flags()
	f.BoolVar(&p.on, "tls", false, "TLS on every connection: to NATS with the CA in <auth dir>/tls (unless --tls-ca), and "+what+" mutual TLS with that CA and the certificate there (made by 'termlog auth init --tls' or 'termlog up --tls')")
	f.StringVar(&p.cert, "tls-cert", "", what+" mutual TLS with this certificate (PEM, with --tls-key; peers are checked against --tls-ca, which NATS then uses too)")
	f.StringVar(&p.key, "tls-key", "", "the key of --tls-cert (PEM)")
}

// peerTLS resolves p: with --tls the files of <auth dir>/tls (the dir of
// --auth-dir, else defaultAuthDir), with --tls-cert/--tls-key those and
// --tls-ca. Either way the NATS connection uses TLS too: with --tls-ca if
// given, else with the auth dir's CA (set here as --tls-ca).
func (g *globals) peerTLS(p peerTLSFlags) (tlsFiles, error) {
	switch {
	case p.cert != "" || p.key != "":
		if p.on {
			return tlsFiles{}, errors.New("--tls uses the certificate in <auth dir>/tls; --tls-cert/--tls-key name another: pass one or the other")
		}
		if p.cert == "" || p.key == "" {
			return tlsFiles{}, errors.New("--tls-cert and --tls-key go together")
		}
		if g.auth.tlsCA == "" {
			return tlsFiles{}, errors.New("--tls-cert needs --tls-ca: the CA that signed the peers' certificates")
		}
		return tlsFiles{ca: g.auth.tlsCA, cert: p.cert, key: p.key}, nil
	case p.on:
		dir := g.auth.authDir
		if dir == "" {
			dir = defaultAuthDir
		}
		f := dirTLSFiles(filepath.Join(dir, "tls"))
		for _, file := range []string{f.ca, f.cert, f.key} {
			if _, err := os.Stat(file); err != nil {
				return tlsFiles{}, fmt.Errorf("--tls: %w: make the CA and certificate with `termlog auth init --tls --dir DIR` (or `termlog up --tls`) and pass --auth-dir DIR", err)
			}
		}
		if g.auth.tlsCA == "" {
			g.auth.tlsCA = f.ca
		}
		return f, nil
	}
	return tlsFiles{}, nil
}

func newAuthCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{Use: "auth", Short: "Credentials of the roles"})
	var dir string
	var withTLS bool
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Generate one NKey per role into --dir (kept if already there), and with --tls a CA and a 127.0.0.1 server certificate into --dir/tls",
		Long: `init generates the credentials a termlog deployment shares: one NKey user
per role (admin, meta, worker, store, observer): DIR/<role>.nk is the secret
seed a client of that role connects with (mode 0600), DIR/<role>.pub the public
key a server needs. Every NATS node of a cluster must be started with the same
--auth-dir. Existing files are kept; run it once before starting the nodes.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			created, err := natsserver.InitAuth(abs)
			if err != nil {
				return err
			}
			verb := map[bool]string{true: "generated", false: "kept existing"}
			fmt.Fprintf(cmd.OutOrStdout(), "%s role keys in %s: %s\n", verb[created], abs, roleFiles())
			if withTLS {
				tdir := filepath.Join(abs, "tls")
				created, err := natsserver.InitTLS(tdir)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s TLS CA %s and server certificate %s (127.0.0.1, localhost)\n",
					verb[created], filepath.Join(tdir, natsserver.TLSCAFile), filepath.Join(tdir, natsserver.TLSCertFile))
			}
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", defaultAuthDir, "credentials directory")
	initCmd.Flags().BoolVar(&withTLS, "tls", false, "also generate a CA and a server certificate for 127.0.0.1 into DIR/tls")
	cmd.AddCommand(initCmd, newNATSContextCmd(g))
	return cmd
}

// natscliArgs are the natscli (nats) connection flags of a role: the
// server, the role's NKey seed, its inbox prefix (the server lets a role
// receive replies only there) and the CA with --tls-ca.
func (g *globals) natscliArgs(role natsserver.Role) ([]string, error) {
	seed := g.seedFile(role)
	if seed == "" {
		return nil, fmt.Errorf("no key for role %s: pass --auth-dir DIR (the server's) or --creds FILE", role)
	}
	abs, err := filepath.Abs(seed)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("role %s: %w", role, err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("role %s: %s: %w", role, abs, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	args := []string{"--server", g.natsURL, "--nkey", abs, "--inbox-prefix", natsserver.InboxPrefix(pub)}
	if g.auth.tlsCA != "" {
		ca, err := filepath.Abs(g.auth.tlsCA)
		if err != nil {
			return nil, err
		}
		args = append(args, "--tlsca", ca)
	}
	return args, nil
}

func newNATSContextCmd(g *globals) *cobra.Command {
	var roleName, name string
	var flagsOnly bool
	cmd := &cobra.Command{
		Use:   "nats-context",
		Short: "Print the natscli command that saves a context for a role's key (or, with --flags, the connection flags)",
		Long: `nats-context prints how to use natscli (the nats command) with a role's key.
A role's connection must sign with its NKey and take its replies under its own
inbox prefix (_INBOX.<public key>): the server lets no role read another's
replies. With --flags it prints just the connection flags:

  nats $(termlog auth nats-context --role observer --flags) stream info TERMLOG_TERMLOG

Without, a 'nats context save' command line; run it once, then select it:

  eval "$(termlog auth nats-context --role admin)"
  nats --context termlog-admin stream ls`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			role, err := natsserver.ParseRole(roleName)
			if err != nil {
				return usage(fmt.Errorf("--role: %w", err))
			}
			args, err := g.natscliArgs(role)
			if err != nil {
				return err
			}
			if flagsOnly {
				fmt.Fprintln(cmd.OutOrStdout(), strings.Join(args, " "))
				return nil
			}
			if name == "" {
				name = g.cluster + "-" + string(role)
			}
			line := append([]string{"nats", "context", "save", name}, args...)
			line = append(line, "--description", fmt.Sprintf("'termlog cluster %s, role %s'", g.cluster, role))
			fmt.Fprintln(cmd.OutOrStdout(), strings.Join(line, " "))
			return nil
		},
	}
	cmd.Flags().StringVar(&roleName, "role", string(natsserver.RoleObserver), "role whose key natscli connects with: admin, meta, worker, store or observer")
	cmd.Flags().StringVar(&name, "name", "", "context name (default <cluster>-<role>)")
	cmd.Flags().BoolVar(&flagsOnly, "flags", false, "print only the connection flags (--server --nkey --inbox-prefix [--tlsca])")
	return cmd
}

func roleFiles() string {
	var out []string
	for _, r := range natsserver.Roles() {
		out = append(out, string(r)+".nk")
	}
	return strings.Join(out, " ")
}
