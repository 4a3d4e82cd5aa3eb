// Command connector-demo runs the whole weida-connector bridge in one
// process, on embedded MQTT 5 and NATS brokers, and narrates what crosses,
// how each topic converts and what is refused. It needs no broker:
//
//	go run ./cmd/connector-demo
//
// It is a command of its own so that the embedded brokers never link into
// the connector binary that production runs. The demo itself is
// cmd/internal/demo; this package only reads flags and calls it.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"weida.dev/connector/cmd/internal/demo"
	"weida.dev/connector/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("connector-demo", "connector-demo [--verbose]", stderr)
	verbose := fs.Bool("verbose", false, "also print the connector's own log lines, to stderr")
	if code, done := cli.ParseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "connector-demo: unexpected argument %q\n", fs.Arg(0))
		return cli.ExitUsage
	}
	opts := demo.Options{Out: stdout}
	if *verbose {
		opts.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if err := demo.Run(ctx, opts); err != nil {
		fmt.Fprintf(stderr, "connector-demo: %v\n", err)
		return cli.ExitFailure
	}
	return cli.ExitOK
}
