//! The migration controller: each `VirtualMachineInstanceMigration` gets a target pod for
//! its VMI on another node, hands the migration to the two nodes' handlers through the
//! VMI (`status.migrationState`, label `kubevirt.io/migrationTargetNodeName`), follows
//! their progress into its phases, and cancels when it is deleted ([`decide`], carried out
//! by [`controller`]). A VMI marked for evacuation gets a migration ([`evacuation`]).

pub mod controller;
pub mod decide;
pub mod evacuation;
pub mod target_pod;
