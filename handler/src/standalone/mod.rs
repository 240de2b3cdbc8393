//! Standalone mode (see submodules).
