package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is the release version, set at build time with
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/tether
//
// It is the package's one variable: the linker can only set package-level string variables.
var version = "dev"

// versionString describes the build: version (from -ldflags, else the module version of a
// `go install`ed binary, else "dev"), VCS revision when recorded, and the Go toolchain.
func versionString() string {
	v, rev := version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " " + s.Value[:12]
			}
			if s.Key == "vcs.modified" && s.Value == "true" && rev != "" {
				rev += "+dirty"
			}
		}
	}
	return fmt.Sprintf("tether %s%s (%s %s/%s)", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, versionString())
	return err
}
