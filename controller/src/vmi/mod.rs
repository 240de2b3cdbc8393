//! The VirtualMachineInstance controller: the launcher pod and the phases up to the hand-off
//! of the VMI to a node (`Pending → Scheduling → Scheduled`).

mod claims;
pub mod controller;
pub mod decide;
