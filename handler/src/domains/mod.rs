//! The handler's view of the domains: the cache, the notify server that feeds it, the
//! notify pipes inside pods, and the list/resync that asks launchers directly.

pub mod cache;
pub mod notify;
pub mod pipe;

pub use cache::{CacheChange, CacheChanges, DomainCache, EventType};
