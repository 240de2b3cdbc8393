// Package core: the API group and resource names of kubevirt.io/virt-template-api v0.2.0.
package core

const (
	GroupName            = "template.kubevirt.io"
	SingularResourceName = "virtualmachinetemplate"
	PluralResourceName   = SingularResourceName + "s"
)
