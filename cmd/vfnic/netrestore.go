package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vfnic/vfnic/pci"
)

// restoreWait bounds how long vfnic waits for a NIC's kernel driver to
// make its interfaces again after -force took them.
const restoreWait = 5 * time.Second

// kernelState is what -force took from the kernel, to give back.
type kernelState struct {
	configs []*pci.NetConfig
}

// take warns on warn what -force takes from the kernel (forceWarning) and
// remembers the interfaces' configuration.
func (k *kernelState) take(a pci.Address, warn io.Writer) {
	w := forceWarning(pci.Sysfs{}, nil, a)
	if w == "" {
		return
	}
	fmt.Fprintln(warn, w)
	c, err := pci.Sysfs{}.NetConfig(a, nil)
	if err != nil {
		fmt.Fprintf(warn, "warning: %s: its interfaces' configuration not read (%v): configure them again by hand on exit\n", a, err)
		return
	}
	if c != nil {
		k.configs = append(k.configs, c)
	}
}

// giveBack restores what take remembered, once the devices are closed
// and back with their kernel drivers, saying on out what it did.
func (k *kernelState) giveBack(out io.Writer) {
	for _, c := range k.configs {
		if m := restoreNote(c.Address, restore(c)); m != "" {
			fmt.Fprintln(out, m)
		}
	}
	k.configs = nil
}

func restore(c *pci.NetConfig) func() ([]string, error) {
	return func() ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), restoreWait)
		defer cancel()
		return pci.Sysfs{}.RestoreNetConfig(ctx, c)
	}
}

// restoreNote says what giving a's interfaces their configuration back
// did: "" when there was nothing to do (the NIC never left its driver).
func restoreNote(a pci.Address, run func() ([]string, error)) string {
	done, err := run()
	msg := ""
	if len(done) > 0 {
		msg = fmt.Sprintf("gave %s's interfaces back what they had: %s", a, strings.Join(done, "; "))
	}
	if err != nil {
		if msg != "" {
			msg += "; "
		}
		why := strings.ReplaceAll(strings.TrimPrefix(err.Error(), pci.ErrNetRestore.Error()+": "), "\n", "; ")
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			msg += fmt.Sprintf("%s: its interfaces did not come back within %v: configure them again by hand", a, restoreWait)
		case errors.Is(err, pci.ErrNetRestore):
			msg += fmt.Sprintf("%s: the kernel refused %s (configure those again by hand)", a, why)
		default:
			msg += fmt.Sprintf("%s: configuration not given back: %v", a, err)
		}
	}
	return msg
}
