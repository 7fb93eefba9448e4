package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/version"
)

func (a *app) versionCommand() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print capl-dev's version: release, commit and the commit's time",
		Long: `Prints the release capl-dev was built as (a checkout's RELEASE_VERSION-dev
unless it is at a release tag), the commit it was built from (-dirty with
uncommitted changes), that commit's time, and Go's version and platform. make
build sets them; a binary built by go build alone reads them from what Go
recorded. The manager says the same with --version.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(a, output, version.Get())
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// printVersion writes v as one line, or as JSON or YAML.
func printVersion(a *app, output outputFormat, v version.Info) error {
	if output != outputText {
		return output.encode(a.out, v)
	}
	_, err := fmt.Fprintf(a.out, "capl-dev %s\n", v)
	return err
}
