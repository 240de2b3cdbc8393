//! The handler's view of the domains: the cache, the notify server that feeds it, and the
//! notify pipes inside pods. The initial list and the periodic resync, which ask launchers
//! directly (`GetDomain`), are the agent's ([`crate::agent`]); they store what they learn here.

pub mod cache;
pub mod notify;
pub mod pipe;

pub use cache::{CacheChange, CacheChanges, DomainCache, EventType};
