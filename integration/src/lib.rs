//! Integration-test support for kubevirt-rs.
//!
//! [`controlplane`] runs a real etcd + kube-apiserver (+ kube-controller-manager) for tests
//! that talk to the Kubernetes API; [`cluster`] brings up a real single-node cluster
//! (`scripts/cluster.sh`: scheduler, containerd, kubelet, kube-proxy too) for tests that run
//! pods; [`manifests`] reads a manifest directory as `kubectl apply -f` does and creates its
//! objects.

pub mod cluster;
pub mod controlplane;
pub mod manifests;
