package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"weida.dev/connector/internal/safefile"
	"weida.dev/connector/weida"
)

const identitySynopsis = `connector identity create --cert FILE --key FILE [--force]
       connector identity show FILE...

Manages the certificate a weida endpoint presents, which subscribers trust
by pinning its fingerprint (weida://sha256:<hex>@host:port/path).

create generates an ECDSA P-256 key and a self-signed certificate for it,
writes them (the key with mode 0600), and prints the fingerprint. It
refuses to replace an existing file unless --force is given.

show prints the fingerprint of each PEM certificate file: of the first
certificate in it, which is the leaf in a chain. With several files, each
fingerprint is followed by its file name.

Exit status: 0 on success, 1 when a file cannot be read or written, 2 on a
usage error.`

func cmdIdentity(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "create":
			return identityCreate(args[1:], stdout, stderr)
		case "show":
			return identityShow(args[1:], stdout, stderr)
		}
	}
	fs := newFlagSet("identity", identitySynopsis, stderr)
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "connector identity: missing subcommand: create or show")
	} else {
		fmt.Fprintf(stderr, "connector identity: unknown subcommand %q: use create or show\n", fs.Arg(0))
	}
	fs.Usage()
	return exitUsage
}

func identityCreate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("identity create", identitySynopsis, stderr)
	certFile := fs.String("cert", "", "the certificate file to write, PEM (required)")
	keyFile := fs.String("key", "", "the private key file to write, PEM PKCS #8, mode 0600 (required)")
	force := fs.Bool("force", false, "replace existing files (every subscriber pinning the old fingerprint must then be given the new one)")
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "connector identity create: unexpected argument %q\n", fs.Arg(0))
	case *certFile == "" || *keyFile == "":
		fmt.Fprintln(stderr, "connector identity create: --cert and --key are required")
	case filepath.Clean(*certFile) == filepath.Clean(*keyFile):
		fmt.Fprintln(stderr, "connector identity create: --cert and --key must name different files")
	default:
		return createIdentity(*certFile, *keyFile, *force, stdout, stderr)
	}
	fs.Usage()
	return exitUsage
}

func createIdentity(certFile, keyFile string, force bool, stdout, stderr io.Writer) int {
	if !force {
		// Checked for both before writing either, so that a refusal leaves
		// nothing half done.
		for _, f := range []string{certFile, keyFile} {
			if _, err := os.Lstat(f); err == nil {
				fmt.Fprintf(stderr, "connector identity create: %s exists; use --force to replace it "+
					"(subscribers pinning its fingerprint must then be given the new one)\n", f)
				return exitFailure
			}
		}
	}
	certPEM, keyPEM, fp, err := weida.GenerateIdentity()
	if err != nil {
		fmt.Fprintf(stderr, "connector identity create: %v\n", err)
		return exitFailure
	}
	// The key first: a certificate on disk without its key is useless,
	// while a key alone can be given a new certificate with the same
	// fingerprint.
	if err := writeNew(keyFile, keyPEM, 0o600, force); err != nil {
		fmt.Fprintf(stderr, "connector identity create: %v\n", err)
		return exitFailure
	}
	if err := writeNew(certFile, certPEM, 0o644, force); err != nil {
		fmt.Fprintf(stderr, "connector identity create: %v\n", err)
		return exitFailure
	}
	fmt.Fprintln(stdout, fp)
	return exitOK
}

// writeNew writes data to file atomically. Unless replace is set it fails
// when file exists, also when it appeared since it was checked.
func writeNew(file string, data []byte, perm fs.FileMode, replace bool) error {
	err := safefile.Create(file, data, perm, replace)
	if errors.Is(err, safefile.ErrExists) {
		return fmt.Errorf("%s exists; use --force to replace it", file)
	}
	return err
}

func identityShow(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("identity show", identitySynopsis, stderr)
	if code, done := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "connector identity show: name at least one certificate file")
		fs.Usage()
		return exitUsage
	}
	code := exitOK
	for _, f := range fs.Args() {
		b, err := safefile.ReadFile(f, weida.MaxPEMFileBytes)
		if err == nil {
			var fp string
			if fp, err = weida.FingerprintPEM(b); err == nil {
				if fs.NArg() == 1 {
					fmt.Fprintln(stdout, fp)
				} else {
					fmt.Fprintf(stdout, "%s  %s\n", fp, f)
				}
				continue
			}
			err = fmt.Errorf("%s: %w", f, err)
		}
		fmt.Fprintf(stderr, "connector identity show: %v\n", err)
		code = exitFailure
	}
	return code
}
