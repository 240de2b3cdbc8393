//! Integration-test support for kubevirt-rs.
//!
//! [`controlplane`] runs a real etcd + kube-apiserver (+ kube-controller-manager) for tests
//! that talk to the Kubernetes API.

pub mod controlplane;
