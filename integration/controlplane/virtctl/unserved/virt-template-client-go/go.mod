module kubevirt.io/virt-template-client-go

go 1.24

require k8s.io/client-go v0.34.2
