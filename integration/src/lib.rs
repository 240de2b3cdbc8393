//! Integration-test support for kubevirt-rs.
//!
//! [`controlplane`] runs a real etcd + kube-apiserver (+ kube-controller-manager) for tests
//! that talk to the Kubernetes API; [`cluster`] brings up a real single-node cluster
//! (`scripts/cluster.sh`: scheduler, containerd, kubelet, kube-proxy too) for tests that run
//! pods.

pub mod cluster;
pub mod controlplane;
