package main

import (
	"context"
	"fmt"
	"io"

	"github.com/tether-dev/tether/pkg/config"
)

// runValidate checks every config file given with -c (or as arguments). It prints "FILE: ok"
// for each valid file and every problem of each invalid one, and exits 1 if any is invalid.
func runValidate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("validate", "-c FILE [-c FILE | FILE]...", stderr)
	var paths files
	fs.Var(&paths, "c", "config `file` to check (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	paths = append(paths, fs.Args()...)
	if len(paths) == 0 {
		return usageError(fs, "-c FILE is required (the config to check)")
	}
	bad := 0
	for _, p := range paths {
		c, err := config.Load(p)
		if err != nil {
			bad++
			_, _ = fmt.Fprintln(stderr, err)
			continue
		}
		for _, w := range c.Warnings {
			_, _ = fmt.Fprintf(stderr, "%s: warning: %s\n", p, w)
		}
		if _, err := fmt.Fprintf(stdout, "%s: ok\n", p); err != nil {
			return err
		}
	}
	if bad > 0 {
		_, _ = fmt.Fprintf(stderr, "%d of %d config files invalid\n", bad, len(paths))
		return exitError{1}
	}
	return nil
}
