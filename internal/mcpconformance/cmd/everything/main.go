// Command everything runs the conformance "everything" server on a free loopback port and
// prints its URL, for running the official suite against it by hand.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/tether-dev/tether/internal/mcpconformance/everything"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	s, err := everything.Start(ctx, "everything")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(s.URL())
	<-ctx.Done()
}
