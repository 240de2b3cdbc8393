//! Integration-test support for kubevirt-rs.
//!
//! [`controlplane`] runs a real etcd + kube-apiserver (+ kube-controller-manager) for tests
//! that talk to the Kubernetes API; [`manifests`] reads a manifest directory as
//! `kubectl apply -f` does and creates its objects.

pub mod controlplane;
pub mod manifests;
