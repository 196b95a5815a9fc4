//! intact-core: encrypted, authenticated and fresh storage on untrusted stores.
//!
//! Layers, top to bottom (see `docs/design.md`): the volume engine; schemes (one trait);
//! structures (Merkle tree, counter intervals, node cache); primitives; stores.
#![deny(missing_docs)]

pub mod error;
pub mod store;

pub use error::{Error, FsErrorKind, Result, Subject};
