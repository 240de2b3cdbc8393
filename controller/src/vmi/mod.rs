//! The VirtualMachineInstance controller: the launcher pod and the phases up to the hand-off
//! of the VMI to a node (`Pending → Scheduling → Scheduled`).

pub mod controller;
pub mod decide;
