//! Live migration on the node: the proxies that carry a migration's stream between the
//! two nodes' handlers ([`proxy`]). The source and target roles of v1.9.0's handler
//! (`vmm/launcher/docs/migration-contract.md` §4) are not built yet.

pub mod proxy;
