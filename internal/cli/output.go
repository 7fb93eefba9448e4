package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// outputFormat is a command's -o: the table or tree a person reads, or
// the same data as JSON or YAML for a script, as kubectl's -o json|yaml.
type outputFormat string

const (
	outputText outputFormat = ""
	outputJSON outputFormat = "json"
	outputYAML outputFormat = "yaml"
)

// String, Set and Type make outputFormat a pflag.Value that refuses
// anything else than json and yaml when the command line is parsed.
func (o *outputFormat) String() string { return string(*o) }

func (o *outputFormat) Set(s string) error {
	switch f := outputFormat(s); f {
	case outputText, outputJSON, outputYAML:
		*o = f
		return nil
	}
	return fmt.Errorf("%q is not an output format: json or yaml (default: a table)", s)
}

func (o *outputFormat) Type() string { return "json|yaml" }

// addOutputFlag adds -o/--output to cmd.
func addOutputFlag(cmd *cobra.Command, o *outputFormat) {
	cmd.Flags().VarP(o, "output", "o", "print json or yaml instead of the table")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
}

// encode writes v as JSON (indented) or YAML.
func (o outputFormat) encode(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if o == outputYAML {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return err
		}
	} else {
		data = append(data, '\n')
	}
	_, err = w.Write(data)
	return err
}
