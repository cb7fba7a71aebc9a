package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vfnic/vfnic/doctor"
)

// TestListJSON parses 'vfnic list -json' back: it reads the host's sysfs
// only, and the listing's shape does not depend on the machine.
func TestListJSON(t *testing.T) {
	code, out, errw := runCLI("list", "-all", "-json")
	require.Zero(t, code, errw)
	var lo listOutput
	require.NoError(t, json.Unmarshal([]byte(out), &lo), out)
	require.NotNil(t, lo.Devices)
	require.NotNil(t, lo.Warnings)
	for _, d := range lo.Devices {
		require.Len(t, d.VendorID, 4)
		require.NotEmpty(t, d.Address)
		require.Equal(t, d.Driver == "vfio-pci", d.VFIO)
	}
	if !lo.VFIOReady {
		require.NotEmpty(t, lo.Warnings, "a machine where VFIO cannot work says why")
	}
}

// TestDoctorJSON parses 'vfnic doctor -json' back: the exit status agrees
// with the report's verdict, and a failing report's message names its
// first failure.
func TestDoctorJSON(t *testing.T) {
	code, out, errw := runCLI("doctor", "-json")
	var r struct {
		Ready bool `json:"ready"`
		doctor.Report
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.NotEmpty(t, r.Checks)
	if r.Ready {
		require.Zero(t, code, errw)
		return
	}
	require.Equal(t, 1, code)
	var first doctor.Check
	for _, c := range r.Checks {
		if c.Status == doctor.Fail {
			first = c
			break
		}
	}
	require.Contains(t, errw, "VFIO cannot work here: "+first.Message)

	code, out, _ = runCLI("doctor")
	require.Equal(t, 1, code)
	require.Contains(t, out, "FAIL")
}

func TestDoctorUsage(t *testing.T) {
	code, _, errw := runCLI("doctor", "00:zz.0")
	require.Equal(t, 2, code)
	require.Contains(t, errw, "bad address")
}
