// Package cli is the command line of capl-dev, the one-host management
// plane of cluster-api-provider-libvirt, in the words of kind and
// clusterctl: `up` and `down` for the whole system, `create cluster`,
// `delete cluster`, `get clusters`, `get nodes`, `get kubeconfig`, `status`,
// `stop`, `start`, `logs`, `exec`, `load image`, `doctor` and `version`. cmd/capl-dev only
// runs Main; the tree is a package of its own so that tests (docs/) can
// walk it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// Exit codes of Main.
const (
	exitOK = 0
	// exitError is a command that failed.
	exitError = 1
	// exitUsage is a command line that did not parse: unknown command or
	// flag, wrong number of arguments.
	exitUsage = 2
)

// usageError marks errors of the command line itself (exitUsage).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// exitCodeError ends Main with a given code and no message of its own:
// `capl-dev exec` exits with the guest command's code, as ssh does.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return fmt.Sprintf("exit code %d", e.code) }

// app holds what every command shares: the persistent flags and where
// output goes.
type app struct {
	stateDir   string
	libvirtURI string
	out, err   io.Writer
	// uriFlag is the --libvirt-uri flag, to tell a value given from the
	// default (uri).
	uriFlag *pflag.Flag
}

// Main runs capl-dev with os.Args and returns its exit code. SIGINT and
// SIGTERM cancel the command's context: waits end, the plane it started
// keeps running.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := NewCommand(os.Stdout, os.Stderr)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var code exitCodeError
	if errors.As(err, &code) {
		return code.code
	}
	name := "capl-dev"
	if c, _, ferr := cmd.Find(os.Args[1:]); ferr == nil && c != cmd {
		name = c.CommandPath()
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	var u usageError
	if errors.As(err, &u) {
		fmt.Fprintf(os.Stderr, "Run '%s --help' for usage.\n", name)
		return exitUsage
	}
	return exitError
}

// NewCommand is capl-dev's command tree writing to out and errOut.
func NewCommand(out, errOut io.Writer) *cobra.Command {
	a := &app{out: out, err: errOut}
	root := &cobra.Command{
		Use:   "capl-dev",
		Short: "The one-host management plane of cluster-api-provider-libvirt",
		Long: `capl-dev runs Cluster API and the libvirt provider on this host, without a
management cluster of your own: kube-apiserver and etcd kept in a state
directory, kube-controller-manager, Cluster API's core and kubeadm controllers
and this provider's manager, and makes Kubernetes clusters of real VMs.

  capl-dev up                    plane and the cluster "demo" (what make up runs)
  capl-dev create cluster NAME   one more cluster on the running plane
  capl-dev get kubeconfig NAME --merge   its context in ~/.kube/config
  capl-dev status                the plane, every cluster's objects and VMs
  capl-dev down                  everything gone again

Run as root (libvirt's system socket, the state directory); from another
account prefix sudo.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Without a subcommand: the help, and a usage error.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Help()
			return usageError{errors.New("no command given")}
		},
	}
	// Commands in the order a person uses them, not alphabetical.
	cobra.EnableCommandSorting = false
	root.SetOut(out)
	root.SetErr(errOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.stateDir, "state-dir", plane.DefaultStateDir, "directory of the plane's etcd data, kubeconfig, pid files and logs")
	pf.StringVar(&a.libvirtURI, "libvirt-uri", manager.DefaultLibvirtURI, "libvirt host of the plane's VMs; default: the one the running plane was started with, else qemu:///system")
	a.uriFlag = pf.Lookup("libvirt-uri")

	root.AddGroup(
		&cobra.Group{ID: "plane", Title: "The whole system:"},
		&cobra.Group{ID: "clusters", Title: "Clusters:"},
		&cobra.Group{ID: "nodes", Title: "Nodes:"},
		&cobra.Group{ID: "host", Title: "The host:"},
	)
	for _, c := range []*cobra.Command{a.upCommand(), a.downCommand(), a.stopCommand(), a.startCommand(), a.serveCommand()} {
		c.GroupID = "plane"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.createCommand(), a.deleteCommand(), a.getCommand(), a.statusCommand(), a.logsCommand(), a.renderCommand()} {
		c.GroupID = "clusters"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.execCommand(), a.loadCommand()} {
		c.GroupID = "nodes"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.doctorCommand(), a.orphansCommand(), a.versionCommand()} {
		c.GroupID = "host"
		root.AddCommand(c)
	}
	root.SetHelpCommandGroupID("host")
	root.SetCompletionCommandGroupID("host")
	// Arguments checks of subcommands are usage errors too.
	wrapArgs(root)
	return root
}

// wrapArgs makes every command's argument check return a usageError.
func wrapArgs(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		wrapArgs(sub)
	}
}

// uri is the libvirt URI of the command: the flag when given, else the
// one the plane of the state directory was started with, else the
// default.
func (a *app) uri() string {
	if a.uriFlag != nil && a.uriFlag.Changed {
		return a.libvirtURI
	}
	if rec, err := readRecord(a.stateDir); err == nil && rec.LibvirtURI != "" {
		return rec.LibvirtURI
	}
	return a.libvirtURI
}

// logf prints a progress line with the time of day, as make up's output
// has always been.
func (a *app) logf(format string, args ...any) {
	fmt.Fprintf(a.out, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// stateDirArg is the --state-dir flag to repeat in a printed command, or
// "" for the default.
func stateDirArg(dir string) string {
	if dir == plane.DefaultStateDir {
		return ""
	}
	return " --state-dir=" + dir
}

// makeStateDirArg is stateDirArg for a printed make command.
func makeStateDirArg(dir string) string {
	if dir == plane.DefaultStateDir {
		return ""
	}
	return " STATE_DIR=" + dir
}
