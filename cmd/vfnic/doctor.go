package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/vfnic/vfnic/doctor"
)

// errNotReady makes 'vfnic doctor' exit 1 after printing its report.
var errNotReady = errors.New("VFIO cannot work here")

func runDoctor(_ context.Context, args []string, out io.Writer) error {
	fs := newFlags("doctor", "[-json] [ADDR...]")
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	if err := parse(fs, args); err != nil {
		return err
	}
	var r doctor.Report
	if fs.NArg() > 0 {
		addrs, err := parseAddrs(fs.Args())
		if err != nil {
			return err
		}
		r = doctor.Run(doctor.Env{}, addrs...)
	} else {
		r = doctor.Run(doctor.Env{})
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		v := struct {
			Ready bool `json:"ready"`
			doctor.Report
			// Host says whether the host interface drivers (afxdp:,
			// afpacket:) work here; it does not change ready (VFIO's).
			Host []hostCheck `json:"host"`
		}{r.Ready(), r, hostChecks()}
		if err := enc.Encode(v); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, c := range r.Checks {
			what := c.Name
			if c.Device != "" {
				what = c.Device + " " + c.Name
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(string(c.Status)), what, c)
		}
		for _, h := range hostChecks() {
			st := "OK"
			if !h.Works {
				st = "FAIL"
			}
			fmt.Fprintf(tw, "%s\thost %s\t%s\n", st, h.Driver, h.Detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if err := r.Err(); err != nil {
		return fmt.Errorf("%w: %s", errNotReady, strings.TrimPrefix(err.Error(), doctor.ErrNotReady.Error()+": "))
	}
	if !*asJSON {
		fmt.Fprintln(out, "ready: VFIO can drive NICs on this machine")
	}
	return nil
}
