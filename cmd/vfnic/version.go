package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/vfnic/vfnic/nic"
)

// versionInfo is what 'vfnic version' reports.
type versionInfo struct {
	Module   string            `json:"module"`
	Version  string            `json:"version"`
	Go       string            `json:"go"`
	Platform string            `json:"platform"`
	Settings map[string]string `json:"settings,omitempty"`
	// Drivers are the NIC drivers compiled in (nic.Drivers).
	Drivers []string `json:"drivers"`
}

func buildVersion() versionInfo {
	v := versionInfo{Module: "github.com/vfnic/vfnic", Version: "(unknown)", Go: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Drivers: nic.Drivers()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module, v.Version = bi.Main.Path, bi.Main.Version
	if v.Version == "" {
		v.Version = "(devel)"
	}
	// The settings a bug report needs: which commit, whether it was
	// modified, and whether the binary is static.
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision", "vcs.time", "vcs.modified", "CGO_ENABLED", "GOAMD64", "-tags":
			if v.Settings == nil {
				v.Settings = map[string]string{}
			}
			v.Settings[s.Key] = s.Value
		}
	}
	return v
}

func runVersion(_ context.Context, args []string, o stdio) error {
	fs := newFlags("version", "[-json]")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: version takes no arguments", errUsage)
	}
	v := buildVersion()
	if *asJSON {
		return json.NewEncoder(o.out).Encode(v)
	}
	fmt.Fprintf(o.out, "vfnic %s %s (%s, %s)\n", v.Module, v.Version, v.Go, v.Platform)
	fmt.Fprintf(o.out, "  drivers: %s\n", strings.Join(v.Drivers, ", "))
	for _, k := range []string{"vcs.revision", "vcs.time", "vcs.modified", "CGO_ENABLED", "GOAMD64", "-tags"} {
		if s, ok := v.Settings[k]; ok {
			fmt.Fprintf(o.out, "  %s=%s\n", k, s)
		}
	}
	return nil
}
