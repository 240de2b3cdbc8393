// Package virttemplate: a REST client for the template.kubevirt.io/v1beta1 group, the one
// method of kubevirt.io/virt-template-client-go's clientset that KubeVirt's pkg/controller calls.
package virttemplate

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

type Clientset struct{ v1beta1 *V1beta1 }

type V1beta1 struct{ client rest.Interface }

func NewForConfig(c *rest.Config) (*Clientset, error) {
	config := *c
	config.GroupVersion = &schema.GroupVersion{Group: "template.kubevirt.io", Version: "v1beta1"}
	config.APIPath = "/apis"
	config.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	client, err := rest.RESTClientFor(&config)
	if err != nil {
		return nil, err
	}
	return &Clientset{v1beta1: &V1beta1{client: client}}, nil
}

func (c *Clientset) TemplateV1beta1() *V1beta1 { return c.v1beta1 }

func (v *V1beta1) RESTClient() rest.Interface { return v.client }
