// virtctl v1.9.0 for the project's test cluster, built from the kubevirt.io/kubevirt module by
// integration/controlplane/build.sh.
//
// Why not v1.9.0's own cmd/virtctl: its root command also registers `template` and `vmexport`,
// which import kubevirt.io/virt-template-{api,engine,client-go} v0.2.0, and the Go module proxy
// this project may use does not serve those modules. This main registers every other v1.9.0
// command, unchanged, under the same root (name, flags, usage templates, client configuration).
package main

import (
	"context"
	"flag"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"kubevirt.io/client-go/kubecli"
	"kubevirt.io/client-go/log"

	"kubevirt.io/kubevirt/pkg/virtctl/adm"
	"kubevirt.io/kubevirt/pkg/virtctl/clientconfig"
	"kubevirt.io/kubevirt/pkg/virtctl/configuration"
	"kubevirt.io/kubevirt/pkg/virtctl/console"
	"kubevirt.io/kubevirt/pkg/virtctl/create"
	"kubevirt.io/kubevirt/pkg/virtctl/credentials"
	"kubevirt.io/kubevirt/pkg/virtctl/expose"
	"kubevirt.io/kubevirt/pkg/virtctl/guestfs"
	"kubevirt.io/kubevirt/pkg/virtctl/imageupload"
	"kubevirt.io/kubevirt/pkg/virtctl/memorydump"
	"kubevirt.io/kubevirt/pkg/virtctl/objectgraph"
	"kubevirt.io/kubevirt/pkg/virtctl/pause"
	"kubevirt.io/kubevirt/pkg/virtctl/portforward"
	"kubevirt.io/kubevirt/pkg/virtctl/reset"
	"kubevirt.io/kubevirt/pkg/virtctl/scp"
	"kubevirt.io/kubevirt/pkg/virtctl/softreboot"
	"kubevirt.io/kubevirt/pkg/virtctl/ssh"
	"kubevirt.io/kubevirt/pkg/virtctl/templates"
	"kubevirt.io/kubevirt/pkg/virtctl/unpause"
	"kubevirt.io/kubevirt/pkg/virtctl/usbredir"
	"kubevirt.io/kubevirt/pkg/virtctl/version"
	"kubevirt.io/kubevirt/pkg/virtctl/vm"
	"kubevirt.io/kubevirt/pkg/virtctl/vnc"
)

const program = "virtctl"

func main() {
	log.InitializeLogging(program)
	// The usage templates of v1.9.0's commands call these two functions.
	cobra.AddTemplateFunc("ProgramName", func() string { return program })
	cobra.AddTemplateFunc("prepare", func(s string) string {
		return strings.ReplaceAll(s, "{{ProgramName}}", program)
	})
	root := &cobra.Command{
		Use:           program,
		Short:         program + " controls virtual machine related operations on your kubernetes cluster.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Run:           func(cmd *cobra.Command, _ []string) { cmd.Printf("%s", cmd.UsageString()) },
	}
	// client-go's log package registers -v on the Go flag set; virtctl offers it on every command.
	if v := flag.CommandLine.Lookup("v"); v != nil {
		root.PersistentFlags().AddFlag(pflag.PFlagFromGoFlag(v))
	}
	root.SetUsageTemplate(templates.MainUsageTemplate())
	root.SetOut(os.Stdout)
	root.SetContext(clientconfig.NewContext(context.Background(),
		kubecli.DefaultClientConfig(root.PersistentFlags())))
	root.AddCommand(
		configuration.NewListPermittedDevices(),
		console.NewCommand(),
		usbredir.NewCommand(),
		vnc.NewCommand(),
		scp.NewCommand(),
		ssh.NewCommand(),
		portforward.NewCommand(),
		vm.NewStartCommand(),
		vm.NewStopCommand(),
		vm.NewRestartCommand(),
		vm.NewMigrateCommand(),
		vm.NewMigrateCancelCommand(),
		vm.NewGuestOsInfoCommand(),
		vm.NewUserListCommand(),
		vm.NewFSListCommand(),
		vm.NewAddVolumeCommand(),
		vm.NewRemoveVolumeCommand(),
		vm.NewExpandCommand(),
		vm.NewEvacuateCancelCommand(),
		memorydump.NewMemoryDumpCommand(),
		pause.NewCommand(),
		unpause.NewCommand(),
		softreboot.NewSoftRebootCommand(),
		reset.NewResetCommand(),
		expose.NewCommand(),
		version.VersionCommand(),
		imageupload.NewImageUploadCommand(),
		guestfs.NewGuestfsShellCommand(),
		create.NewCommand(),
		credentials.NewCommand(),
		adm.NewCommand(),
		objectgraph.NewCommand(),
	)
	if err := root.Execute(); err != nil {
		root.PrintErrln(err)
		os.Exit(1)
	}
}
