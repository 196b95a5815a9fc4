//! The block disk (issue 8; docs/design.md, "The block disk"): a block device whose every
//! block is encrypted, authenticated and fresh, with the PAC engine. Built in steps; so far
//! the block crypto ([`block`]), the n-ary hash tree ([`tree`]), the PAC queue of
//! pending tree updates ([`pac`]) and the engine over them ([`engine`]).

pub mod block;
pub mod dmt;
pub mod engine;
pub mod pac;
pub mod tree;

/// Locks `m`, going on after a panic of another holder (the guarded state stays usable:
/// every holder leaves it consistent between statements that can panic).
pub(crate) fn guard<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
