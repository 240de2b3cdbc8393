// Package v1beta1: the VirtualMachineTemplate kind as an opaque Kubernetes object (virtctl
// only names the type for an informer it never starts).
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

type VirtualMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
}

func (t *VirtualMachineTemplate) DeepCopyObject() runtime.Object {
	if t == nil {
		return nil
	}
	out := &VirtualMachineTemplate{TypeMeta: t.TypeMeta}
	t.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return out
}
