package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is what `termlog version` prints: the build info of the binary.
type Version struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

func buildVersion() Version {
	v := Version{Module: "github.com/termlog/termlog", Version: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Go = bi.GoVersion
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func printVersion(w io.Writer, v Version) {
	line := fmt.Sprintf("termlog %s (module %s", v.Version, v.Module)
	switch {
	case v.Revision == "":
		line += ", revision unknown: built without VCS stamping, -buildvcs=false or outside a git checkout"
	default:
		line += ", revision " + v.Revision
		if v.Modified {
			line += " with uncommitted changes"
		}
		if v.Time != "" {
			line += ", committed " + v.Time
		}
	}
	fmt.Fprintf(w, "%s), %s\n", line, v.Go)
}

func newVersion() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the module version and VCS revision this binary was built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildVersion()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			printVersion(cmd.OutOrStdout(), v)
			return nil
		},
	}
	outputFlags(cmd.Flags(), &asJSON)
	return cmd
}
